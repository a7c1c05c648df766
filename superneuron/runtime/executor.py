"""The Runtime: executes a Schedule's steps with every tensor a view into one Arena.

Each round is walked by an :class:`~.execution.Execution` (execution.py), a walker that
makes the same allocator calls as the Simulator, in the same order, so the arena's peak is
the plan's. Resident tensors (parameters, their gradients, optimiser state) are placed once
at start-up; scheduled ones are placed as the steps allocate them, each iteration anew.

Offloaded tensors go to a second arena in host memory (pinned on a GPU), through the
copy queues (runtime/copies.py): an Offload or a Prefetch starts a copy, a Wait
blocks until it is done. A step that touches a tensor whose copy is still running without a
Wait before it is a *stall*: the Runtime waits for the copy (results stay right) and counts
it in ``stalls``; a correct plan has none. ``blocked`` counts the Waits that really had to wait.
"""

import math

import numpy as np

from ..graph import storage_root
from ..layers import parallel
from ..scheduler.lower import ACCUM
from ..scheduler.params import updates_on_host
from ..scheduler.simulate import replay
from ..scheduler.steps import UPDATE
from .arena import Arena
from .execution import Execution
from .host_update import HostUpdater


def rank_seed(seed, rank):
    """The seed of ``rank``'s dropout masks: ``seed`` itself on rank 0 (one rank trains as it
    always did), another for every other rank (each rank drops its own units, as in Caffe)."""
    return seed if rank == 0 else (int(seed) * 7_919 + int(rank) * 104_729 + 1) & (2**63 - 1)


class Runtime:
    """Runs schedules of one graph on one backend, in one arena of ``capacity`` bytes.

    ``schedules`` are the schedules it will run (they share the resident layout); the arena
    holds ``capacity`` bytes and the host arena of offloaded tensors ``host_capacity`` (by
    default what the schedules need). ``group``: the ranks of data-parallel training
    (runtime/collective.py), or None; ``sync_bn``: BatchNorm pools the statistics of every
    rank's batch.
    """

    def __init__(self, schedules, backend, capacity, seed=0, host_capacity=None, group=None, sync_bn=False):
        self.group = group
        self.sync_bn = group if sync_bn and group is not None else None
        self.backend, self.xp, self.seed = backend, backend.xp, seed
        first = schedules[0]
        self.graph = first.graph
        self.tensors = dict(first.tensors)
        for s in schedules[1:]:
            assert s.resident == first.resident, "schedules of one runtime share resident tensors"
            self.tensors.update(s.tensors)
        self.arena = Arena(capacity, backend)
        if host_capacity is None:
            host_capacity = max(replay(s).host.high_water for s in schedules)
        self.host = Arena(host_capacity, backend, host=True)
        # parameter offload: the masters live on the host (the update's workspace too, which
        # only a training schedule has)
        host_resident = list(dict.fromkeys(t for s in schedules for t in s.host_resident))
        for name in host_resident:
            self.host.place_resident(name, self.tensors[name].nbytes)
        self.copies = None             # the copy queues, made on the first copy
        self.memory = None             # the Execution (walker) of the last round run
        self.stalls = self.blocked = 0
        # skip the Update of an iteration whose loss is not finite (one host sync, at the first
        # Update step, unless the update skips itself on the device; off: none, and a NaN loss
        # then updates the parameters)
        self.finite_losses = True
        self.syncs_inside = None       # backend.host_sync's reasons before the last round's end
        self._labels_checked = set()   # the layers whose fed labels were checked on the host
        self.outside = None            # backend.Allocations of the last run
        self.host_peak = 0
        self.resident = {}
        for name in first.resident:
            self.arena.place_resident(name, self.tensors[name].nbytes)
        for name in first.resident + host_resident:
            info = self.tensors[name]
            arena = self.arena if name in self.arena.resident else self.host
            self.resident[name] = arena.view(name, info.shape, info.dtype)
            self.resident[name][...] = 0
        # the optimiser updates on the host under parameter offload (not where state offload,
        # scheduler/state.py, brings the state and parameters to the device for each update)
        self.host_update = updates_on_host(first)
        self.peak_bytes = self.arena.resident_end
        self.arena_bytes = self.arena.resident_end
        self._entries = None  # the optimiser's view of the parameters, made on first update
        self.updater = None   # the host-side optimiser under parameter offload (host_update.py)
        self.schedule = first  # the schedule of the last run: its tensors say what aliases what

    def view(self, name, freed_ok=False):
        """The array of tensor ``name`` (resident, or scheduled and currently placed; with
        ``freed_ok``, also where it was last placed in the last run)."""
        if name in self.resident and name not in self.arena.offsets:
            return self.resident[name]  # (a host-resident parameter's device copy is placed)
        tensors = self.schedule.tensors if name in self.schedule.tensors else self.tensors
        info = tensors[name]
        return self.arena.view(storage_root(tensors, name), info.shape, info.dtype, freed_ok)

    def run(self, schedule, feed, iteration=0, optimizer=None, watch=None):
        """Execute one iteration of ``schedule``; ``feed`` maps input tops to host arrays.

        Returns the scalar outputs (losses, accuracies) by layer name, as floats. When a loss
        is non-finite the Update step is skipped: the parameters stay as they were, so that the
        iteration can be re-run to find where it went wrong (under parameter offload, updates
        that began during the backward are done by then). ``watch(node, tops)``, if given, is
        called after every Forward step (diagnosis only).

        A schedule of ``rounds`` K > 1 (Caffe's iter_size) takes ``feed`` as a sequence of K
        feeds: its steps run once per feed, each round from an empty arena (the same allocator
        calls as the plan's one round), with dropout masks of its own, and its Update only in
        the last; the outputs are then their means over the rounds (the loss Caffe shows)."""
        rounds = schedule.rounds
        feeds = [feed] if rounds == 1 else list(feed)
        assert len(feeds) == rounds, f"a schedule of {rounds} rounds takes {rounds} feeds, got {len(feeds)}"
        totals, finite = {}, True
        with self.backend.watch_allocations() as outside, parallel.numpy_settings():
            for k, one in enumerate(feeds):
                execution = self.walk_round(schedule, one, (iteration, k), optimizer, watch, finite)
                outputs = self.read_outputs(execution, iteration)
                finite = finite and all(math.isfinite(outputs[n.name]) for n in self.graph.losses
                                        if n.name in outputs)
                for name, value in outputs.items():
                    totals[name] = totals.get(name, 0.0) + value
        self.outside = outside  # what the array library allocated beside the arena
        return totals if rounds == 1 else {name: total / rounds for name, total in totals.items()}

    def walk_round(self, schedule, feed, when, optimizer, watch=None, finite=True, checked=None):
        """Round ``k`` of ``when = (iteration, k)`` of ``schedule`` on the device, nothing read
        back (``finite``: the losses of the rounds before were finite): the arenas placed anew,
        its steps walked. ``checked``: the layers whose fed labels were checked on the host
        (default: those ``feed`` lets :meth:`check_labels` check now). The Execution walked:
        its ``outputs`` are device scalars, which :meth:`read_outputs` reads (a captured CUDA
        graph, runtime/graphs.py, replays this and reads them after each launch)."""
        self.schedule = schedule
        self._labels_checked = self.check_labels(feed) if checked is None else checked
        self.arena.reset(schedule.offsets)
        self.host.reset()
        execution = self._run_steps(schedule, feed, when, optimizer, watch, finite)
        self.peak_bytes = max(self.peak_bytes, self.arena.peak_bytes)
        self.arena_bytes = max(self.arena_bytes, self.arena.high_water)
        self.host_peak = max(self.host_peak, self.host.high_water)
        return execution

    def read_outputs(self, execution, iteration):
        """The scalar outputs of a round walked (:meth:`walk_round`), read back as floats at the
        iteration's end (data-parallel: once the ranks' sums are settled)."""
        if self.group is not None:
            self.group.settle(f"the all-reduces of iteration {iteration}")
        self.backend.host_sync("the outputs, at the end of the iteration")
        return {name: float(value) for name, value in execution.outputs.items()}

    def _run_steps(self, schedule, feed, when, optimizer, watch, finite=True):
        """The steps of round ``when[1]`` of iteration ``when[0]`` (``finite``: the losses of the
        rounds before were finite): the Execution walked."""
        iteration, round_ = when
        last = round_ == schedule.rounds - 1
        update = next((s for s in schedule.steps if s.kind == UPDATE), None) if last else None
        if self.host_update and update is not None:
            if self.updater is None:
                self.updater = HostUpdater()
            self.update_entries(optimizer)
            ws = self.view(update.workspace) if update.workspace else None
            # the last round of several: each gradient's sum is finished where it lands
            accums = self._accums() if schedule.rounds > 1 else None
            self.updater.begin(optimizer, iteration, self._entries_by_grad, ws, accums)
        self.memory = execution = Execution(self, schedule, feed, (iteration, round_), optimizer, watch, finite)
        syncs_before = self.backend.syncs.copy()
        execution.run(schedule)
        assert not execution.pending, f"copies never waited for: {sorted(execution.pending)}"
        assert not execution.reducing, f"all-reduces never waited for: {sorted(execution.reducing)}"
        # what made the host wait for the device before the iteration's end (see finite_losses)
        self.syncs_inside = self.backend.syncs - syncs_before
        return execution

    def _finite_losses(self, outputs, optimizer):
        """Whether every loss computed so far is finite: True or False, read back from the
        device (the one host sync inside an iteration, at its first Update), or, where the
        optimiser skips itself on the device (Optimizer.guards_on_device: the one-kernel SGD on
        a GPU), a device flag it reads, and no sync. True when ``finite_losses`` is off."""
        if not self.finite_losses:
            return True
        losses = [outputs[n.name] for n in self.graph.losses]
        if losses and optimizer.guards_on_device(self.xp):
            return self.xp.isfinite(sum(losses[1:], losses[0]))  # NaN or ±inf in any: in the sum
        self.backend.host_sync("the losses' finiteness, before the update")
        return all(math.isfinite(float(v)) for v in losses)

    def _accums(self):
        """Each parameter gradient's accumulator (resident: on the device, or on the host under
        parameter offload), by the gradient's name."""
        return {g: self.resident[g + ACCUM] for n in self.graph.nodes for g in n.param_grads.values()}

    def _accumulate(self, round_, rounds):
        """The Accumulate step of round ``round_``: the first round's gradients are copied into
        the accumulators, the next ones' added to them, and in the last round the sum goes back
        into the gradients, which the update reads (it scales them by 1 / rounds, Caffe's
        Normalize). Under parameter offload both live on the host, where the gradients have
        landed (the Waits before this step); there the last round's sums are made as each
        gradient lands, by the host updater."""
        xp = self.xp
        if self.host_update:
            if round_ == rounds - 1:
                return  # host_update.HostUpdater adds each sum in before that parameter's update
            self.backend.synchronize()  # the Waits ordered the device: the host reads them now
            xp = np
        for g, acc in self._accums().items():
            grad = self.resident[g]
            if round_ == 0:
                xp.copyto(acc, grad)
            elif round_ < rounds - 1:
                acc += grad
            else:
                grad += acc

    def check_labels(self, feed):
        """Check the labels fed on the host (where they are NumPy) for every layer that reads
        labels straight from the feed; the names of those layers, whose forward then need not
        read them back from the device."""
        checked, graph = set(), self.graph
        fed = {top: name for n in graph.inputs for top, name in zip(n.tops, n.layer.tops)}
        split = {top: n.bottoms[0] for n in graph.nodes if n.layer.type == "Split" for top in n.tops}
        for node in graph.nodes:
            check = getattr(node.layer, "check_labels", None)
            if check is None or len(node.bottoms) < 2:
                continue
            source = node.bottoms[1]
            while source in split:  # a fan-out's copy of the fed labels
                source = split[source]
            labels = feed.get(fed.get(source))
            if isinstance(labels, np.ndarray) and check(labels):
                checked.add(node.name)
        return checked

    def update_entries(self, optimizer):
        """``(param, grad, [state], lr_mult, decay_mult)`` for every learnable parameter."""
        if self._entries is None:
            self._entries_by_grad, self._state_names, self._param_names = {}, {}, {}
            for node in self.graph.nodes:
                specs = node.param_specs
                for k, g in node.param_grads.items():
                    t = node.params[k]
                    self._state_names[g] = [f"{t}.{optimizer.state_name(j)}" for j in range(optimizer.slots)]
                    self._param_names[g] = t
                    state = [self.resident[s] for s in self._state_names[g]]
                    # None: a gradient with no host place of its own (parameter offload's diet):
                    # the host updater is handed its host copy when it lands
                    self._entries_by_grad[g] = (self.resident[t], self.resident.get(g), state,
                                                specs[k].lr_mult, specs[k].decay_mult)
            self._entries = list(self._entries_by_grad.values())
        return self._entries

    def _entries_of(self, step, optimizer):
        """The optimiser's entries of an Update step: of the gradients it names (scheduled ones,
        right after their Backward: scheduler/update.py, placed where the arena has them now),
        or of every gradient."""
        entries = self.update_entries(optimizer)
        if not step.grads:
            return entries
        by_grad, state, param = self._entries_by_grad, self._state_names, self._param_names
        # the parameter's and the state's device copies where state offload (scheduler/state.py)
        # placed them
        return [(self.view(param[g]), self.view(g), [self.view(s) for s in state[g]], *by_grad[g][3:])
                for g in step.grads]

    def optimizer_update(self, optimizer, iteration, step, scratch):
        """The optimiser's update of the parameters of Update ``step`` on the device."""
        optimizer.update(self.xp, iteration, self._entries_of(step, optimizer), scratch)

    def to_host(self, name):
        """A NumPy copy of tensor ``name`` (after a run, where it was last placed)."""
        return np.asarray(self.backend.to_host(self.view(name, freed_ok=True)))
