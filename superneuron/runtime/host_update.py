"""The host-side optimiser of parameter offload, overlapped with the backward pass.

Under ``+params`` every gradient is copied to the host as soon as its backward is done, and
the masters of the parameters live there. Rather than update them all at the Update step, at
the end, each parameter is updated on a worker thread as soon as its gradient has landed
(NumPy releases the GIL, so this runs beside the device's backward on a GPU and beside the
main thread's layers on the CPU); the Update step then only waits for them. The arithmetic is
the optimiser's own, parameter by parameter, as it always is, so the result is bit-identical.
Clipping by the global gradient norm needs every gradient first: then nothing starts early.
With iter_size K > 1 only the last of the K rounds updates: each gradient that lands then has
the sum of the rounds before (its accumulator) added first.

Under the host diet (scheduler/params.py) a gradient has no host place of its own: its update
reads the host copy its offload took, and the plan's ``Apply`` step, a little later, waits here
for that update before the copy's memory is given back (:meth:`HostUpdater.applied`).
"""

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..layers.base import Context


class HostUpdater:
    """Starts each parameter's host update when its gradient's copy is waited for."""

    def __init__(self):
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sn-update")
        self.active = False
        self.early = 0   # parameters updated before the Update step, in the last iteration

    def begin(self, optimizer, iteration, entries_by_grad, workspace, accums=None):
        """An iteration's update starts: ``entries_by_grad`` maps each gradient to its optimiser
        entry; ``workspace`` is the update's scratch (host memory); ``accums`` (iter_size > 1)
        maps each gradient to the sum of the earlier rounds' gradients, added to it before its
        update."""
        self.optimizer, self.iteration, self.workspace = optimizer, iteration, workspace
        self.entries, self.accums = entries_by_grad, accums
        self.overlap = not optimizer.needs_every_gradient
        self.started, self.futures, self.views = set(), {}, {}
        self.active = True

    def landed(self, grad, copy, view):
        """``grad``'s device→host copy was waited for: update its parameter now, from ``view``
        (its host copy)."""
        if self.overlap and grad in self.entries and grad not in self.started:
            self.started.add(grad)
            self.views[grad] = view  # under the diet, its only place on the host
            self.futures[grad] = self.worker.submit(self._update, copy, [grad])

    def applied(self, grad):
        """The plan gives ``grad``'s host copy back: its update must be done (it was started
        when the copy landed; the plan has an Apply only where the update does not clip)."""
        assert grad in self.futures, f"Apply({grad}) before its update started"
        self.futures[grad].result()

    def _update(self, copy, grads):
        if copy is not None:
            copy.sync()  # on a GPU the Wait only ordered the device: the host reads the gradient
        entries = [self.entries[g] for g in grads]
        entries = [(w, self.views.get(g, grad), *rest) for g, (w, grad, *rest) in zip(grads, entries)]
        if self.accums is not None:
            for g, (_, grad, *_) in zip(grads, entries):
                grad += self.accums[g]  # this round's gradient + the earlier rounds' sum
        # a fresh Context per call: its scratch carving starts over on the one workspace
        self.optimizer.update(np, self.iteration, entries, Context(np, workspace=self.workspace).scratch)

    def finish(self):
        """The Update step: wait for the updates under way, then update the rest (all of them
        when clipping) here. The caller has synchronised the device."""
        for future in self.futures.values():
            future.result()
        self.early = len(self.futures)
        rest = [g for g in self.entries if g not in self.started]
        assert all(self.entries[g][1] is not None for g in rest), "a gradient with no host place was never updated"
        if rest:
            self._update(None, rest)
        self.active = False
