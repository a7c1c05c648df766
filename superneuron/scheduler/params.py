"""Parameter offload (beyond SuperNeurons, which keeps every parameter on the device; in the
spirit of ZeRO-Offload): learnable parameters, their gradients and the optimiser's state live
in host memory, and the device holds a parameter only around the steps that use it.

The pass moves those tensors from the device's resident region to ``host_resident`` and
inserts, for every layer step that reads a parameter (forward, recompute, backward):

- ``Prefetch(p) [keep]`` before the compute step ahead of it (the host master stays), and
  ``Wait(p)`` right before it, unless the step just before used it too; liveness frees the
  device copy after its last use;
- after a backward, ``Offload(g)`` of each parameter gradient it wrote, into the gradient's
  host place, and ``Wait(g)`` after the next compute step (before the update, which reads it),
  when its device memory is freed; with data-parallel buckets (allreduce.py), after the
  ``WaitReduce`` of its bucket instead: reduce, then copy to the host.

The update then runs on the host (NumPy, in place, on the masters), so the device's resident
region is only what stays there (BatchNorm's statistics), and the depth a budget allows is
bounded by the largest layer and the host's memory rather than by the parameters. Test
schedules get the same prefetches (they share the runtime's resident layout).
"""

from .liveness import liveness
from .steps import (
    BACKWARD,
    COMMUNICATION,
    LAYER_STEPS,
    MEMORY,
    OFFLOAD,
    PREFETCH,
    UPDATE,
    WAIT,
    WAIT_REDUCE,
    Offload,
    Prefetch,
    Wait,
)


def offload_params(schedule, context=None):
    """The pass: ``schedule`` with its learnable parameters, their gradients and the optimiser
    state on the host, copied to and from the device around the steps that use them (it needs
    nothing of the Context)."""
    graph, tensors = schedule.graph, schedule.tensors
    learnable = [t for n in graph.nodes for t in n.params.values() if tensors[t].kind == "param"]
    if not learnable:
        return schedule
    grads = [g for n in graph.nodes for g in n.param_grads.values()]
    # what lower() adds beyond the graph's tensors: the optimiser's state
    state = [t for t in schedule.resident if t not in graph.tensors]
    host = set(learnable) | set(grads) | set(state)
    update_ws = [s.workspace for s in schedule.steps if s.kind == UPDATE and s.workspace]
    steps = [s for s in schedule.steps if s.kind not in MEMORY]
    compute = [i for i, s in enumerate(steps) if s.kind not in (OFFLOAD, PREFETCH, WAIT) + COMMUNICATION]
    ahead = {i: compute[k - 1] if k else i for k, i in enumerate(compute)}   # the compute step before
    after, following = {}, None  # each step → the compute step after it
    for i in range(len(steps) - 1, -1, -1):
        after[i] = following
        if i in ahead:
            following = i
    reduced = {g: i for i, s in enumerate(steps) if s.kind == WAIT_REDUCE for g in s.grads}
    before, behind, last_use = {}, {}, {}
    for i, step in enumerate(steps):
        if step.kind not in LAYER_STEPS:
            continue
        node = graph.nodes[step.node]
        for t in node.params.values():
            if t in host and last_use.get(t) not in (i, ahead[i]):  # else it is still there
                before.setdefault(ahead[i], []).append(Prefetch(t, keep=True))
                before.setdefault(i, []).append(Wait(t))
            last_use[t] = i
        if step.kind == BACKWARD:
            for g in node.param_grads.values():
                at = reduced.get(g, i)  # its bucket's average, where there are ranks
                behind.setdefault(at, []).append(Offload(g))
                j = after[at]  # the update reads the gradients: their copies end before it
                done = at if j is None or steps[j].kind == UPDATE else j
                behind.setdefault(done, []).append(Wait(g))
    out = []
    for i, step in enumerate(steps):
        prefetches = [s for s in before.get(i, ()) if s.kind == PREFETCH]
        waits = [s for s in before.get(i, ()) if s.kind == WAIT]
        out += prefetches + waits
        out.append(step)
        out += behind.get(i, ())
    resident = [t for t in schedule.resident if t not in host]
    host_resident = [t for t in schedule.resident if t in host] + update_ws
    return liveness(schedule.replace(out, resident=resident, host_resident=host_resident), context)
