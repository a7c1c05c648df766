"""Parameter offload (beyond SuperNeurons, which keeps every parameter on the device; in the
spirit of ZeRO-Offload): learnable parameters, their gradients and the optimiser's state live
in host memory, and the device holds a parameter only around the steps that use it.

The pass moves those tensors from the device's resident region to ``host_resident`` and
inserts, for every layer step that reads a parameter (forward, recompute, backward):

- ``Prefetch(p) [keep]`` before the compute step ahead of it (the host master stays), and
  ``Wait(p)`` right before it, unless the step just before used it too; liveness frees the
  device copy after its last use;
- after a backward, ``Offload(g)`` of each parameter gradient it wrote, and ``Wait(g)`` after
  the next compute step (before the Accumulate or the update, which read it), when its device
  memory is freed; with data-parallel buckets (allreduce.py), after the ``WaitReduce`` of its
  bucket instead: reduce, then copy to the host;
- the host diet: when the iteration ends with an update that takes the parameters one at a
  time (no clipping by the global norm, one round: no iter_size sum), a gradient has no host
  place of its own. Its Offload takes a host copy, the host optimiser updates its parameter
  from it as soon as it has landed (its Wait), and ``Apply(g)``, :data:`APPLY_LAG` compute
  steps later (at the latest right before the Update step), waits for that update and gives
  the copy back. The host then holds the gradients in flight, not one per parameter.
  Otherwise (clipping, iter_size, data-parallel ranks, or no update: the gradients are what
  the iteration is for) each gradient keeps a host place all iteration; a schedule without
  backward (a test forward) gives them none.

The update then runs on the host (NumPy, in place, on the masters), so the device's resident
region is only what stays there (BatchNorm's statistics), and the depth a budget allows is
bounded by the largest layer and the host's memory rather than by the parameters. Test
schedules get the same prefetches (they share the runtime's resident layout).
"""

from .liveness import liveness
from .steps import (
    BACKWARD,
    COMMUNICATION,
    COPY,
    LAYER_STEPS,
    MEMORY,
    OFFLOAD,
    RESIDENT_ONLY,
    UPDATE,
    WAIT_REDUCE,
    Apply,
    Offload,
    Prefetch,
    Wait,
)

# How many compute steps a gradient's host update has, after its copy landed, before the Apply
# that gives its host copy back waits for it. More hides a slower host update behind the
# backward, at the price of more gradients' host copies at once (a few MiB each on a ResNet).
APPLY_LAG = 2


def offload_params(schedule, context=None):
    """The pass: ``schedule`` with its learnable parameters, their gradients and the optimiser
    state on the host, copied to and from the device around the steps that use them (it needs
    nothing of the Context)."""
    graph, tensors = schedule.graph, schedule.tensors
    learnable = [t for n in graph.nodes for t in n.params.values() if tensors[t].kind == "param"]
    if not learnable:
        return schedule
    grads = {g for n in graph.nodes for g in n.param_grads.values()}
    # what lower() adds beyond the graph's tensors: the optimiser's state (and the gradients'
    # accumulators: the host sums the rounds' gradients where they land)
    state = [t for t in schedule.resident if t not in graph.tensors]
    host = set(learnable) | grads | set(state)
    steps = [s for s in schedule.steps if s.kind not in MEMORY]
    order = _Order(steps)
    # with ranks, a gradient's copy starts only at its bucket's WaitReduce, just before the
    # update: there is no backward left to hide its host update behind, so no diet
    diet = order.update is not None and not schedule.whole_update and not order.reduced
    prefetch_at, wait_at = _parameter_copies(steps, graph, host, order)
    behind, kept = _gradient_copies(steps, graph, order, diet)
    out = []
    for i, step in enumerate(steps):
        out += prefetch_at.get(i, []) + wait_at.get(i, [])
        out.append(step)
        out += behind.get(i, ())
    resident = [t for t in schedule.resident if t not in host]
    host_resident = [t for t in schedule.resident if t in host and (t in kept or t not in grads)] + order.update_ws
    return liveness(schedule.replace(out, resident=resident, host_resident=host_resident), context)


def prefetched(steps, graph, host):
    """``steps`` (no memory steps) with the copies in of the parameters of ``host`` before the
    layer steps that read them, as this pass places them (:func:`_parameter_copies`): a test
    forward's, where the training plan keeps those parameters on the host (state.py's like)."""
    prefetch_at, wait_at = _parameter_copies(steps, graph, set(host), _Order(steps))
    out = []
    for i, step in enumerate(steps):
        out += prefetch_at.get(i, []) + wait_at.get(i, []) + [step]
    return out


def updates_on_host(schedule):
    """Whether ``schedule``'s optimiser runs on the host (this pass's: its parameter gradients
    are copied out), not on the device (where state.py moves only copies around the update)."""
    tensors = schedule.tensors
    return any(s.kind == OFFLOAD and tensors[s.tensor].kind == "param_grad" for s in schedule.steps)


class _Order:
    """Where things are in ``steps`` (no memory steps): ``compute``, the indices of the steps
    that are neither copies nor communication; ``ahead`` and ``after``, each step's compute
    step before and after it; ``number``, a compute step's rank among them; ``update``, the
    Update's rank (None: none); ``reduced``, gradient → the index of its bucket's WaitReduce;
    ``update_ws``, the Update's workspaces (host-resident with the state they serve)."""

    def __init__(self, steps):
        self.compute = [i for i, s in enumerate(steps) if s.kind not in COPY + COMMUNICATION]
        self.ahead = {i: self.compute[k - 1] if k else i for k, i in enumerate(self.compute)}
        self.after, following = {}, None
        for i in range(len(steps) - 1, -1, -1):
            self.after[i] = following
            if i in self.ahead:
                following = i
        self.number = {i: k for k, i in enumerate(self.compute)}
        updates = [i for i, s in enumerate(steps) if s.kind == UPDATE]
        self.update = self.number[updates[0]] if updates else None
        self.update_ws = [steps[i].workspace for i in updates if steps[i].workspace]
        self.reduced = {g: i for i, s in enumerate(steps) if s.kind == WAIT_REDUCE for g in s.grads}


def _parameter_copies(steps, graph, host, order):
    """``(prefetch_at, wait_at)``: step index → the Prefetches (keeping the host master) and
    the Waits to put before it, for the host parameters each layer step reads: the Prefetch
    before the compute step ahead of it, the Wait right before it, unless the step just
    before used the parameter too."""
    prefetch_at, wait_at, last_use = {}, {}, {}
    for i, step in enumerate(steps):
        if step.kind not in LAYER_STEPS:
            continue
        for t in graph.nodes[step.node].params.values():
            if t in host and last_use.get(t) not in (i, order.ahead[i]):  # else it is still there
                prefetch_at.setdefault(order.ahead[i], []).append(Prefetch(t, keep=True))
                wait_at.setdefault(i, []).append(Wait(t))
            last_use[t] = i
    return prefetch_at, wait_at


def _gradient_copies(steps, graph, order, diet):
    """``(behind, kept)``: step index → the copy steps to put after it for the parameter
    gradients each Backward writes (its Offload, its Wait after the next compute step, and
    under the ``diet`` its Apply); ``kept``, the gradients that keep a host place all
    iteration (those not on the diet)."""
    behind, kept = {}, set()
    compute, number = order.compute, order.number
    for i, step in enumerate(steps):
        if step.kind != BACKWARD:
            continue
        for g in graph.nodes[step.node].param_grads.values():
            at = order.reduced.get(g, i)  # its bucket's average, where there are ranks
            behind.setdefault(at, []).append(Offload(g))
            j = order.after[at]  # Accumulate and Update read the gradients: their copies end before
            done = at if j is None or steps[j].kind in RESIDENT_ONLY else j
            behind.setdefault(done, []).append(Wait(g))
            if diet:  # after its Wait: the host update starts there (in the same list, later)
                applied = compute[max(number[done], min(number[done] + APPLY_LAG, order.update - 1))]
                behind.setdefault(applied, []).append(Apply(g))
            else:
                kept.add(g)
    return behind, kept
