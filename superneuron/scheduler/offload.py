"""Offload and prefetch (SuperNeurons' unified tensor pool; Zhang et al. 2019's swapping):
activations that wait long between their last forward use and their first backward use go to
host memory in between.

A *candidate* is a data root live across the turn from forward to backward. For each one the
pass inserts four steps:

- ``Offload(t)`` right after its last forward use: the device→host copy starts;
- ``Wait(t)`` at the first step by which the cost model expects that copy done, but at most
  :data:`LOOKAHEAD` steps later (liveness then frees the device memory right after it), so the
  copy hides behind the compute in between where it can;
- ``Prefetch(t)`` as late as still lets the host→device copy finish before the first backward
  use, but at most :data:`LOOKAHEAD` steps before it (its new device memory is allocated right
  before: a Prefetch writes ``t`` anew);
- ``Wait(t)`` right before that use. The host copy is released after this Wait.

The copy streams are modelled as queues (cost.CostModel.timeline), so a copy issued while the
stream is busy starts later; a Wait for a copy the model expects unfinished is a stall, which
sn-plan reports. A candidate whose gap is too short for both copies stays on the device.

Under a budget the pass acts as SuperNeurons' tensor cache: when the schedule fits without
copies, nothing is offloaded; otherwise the least recently used candidates (the earliest
forward outputs, needed last in the backward) are offloaded first, as few as make the peak
fit with the smallest workspaces (found by bisection: each probe one sweep); the workspace pass
then gives the convolutions what the tensors leave. ``host_memory`` bounds the host bytes that the
offloaded tensors occupy at once.
"""

import bisect

from .cost import as_model
from .liveness import Roots, liveness, uses
from .schedule import MEMORY, Offload, Prefetch, Wait

# How many steps a copy may run ahead of the compute: an offloaded tensor's device memory is
# freed at most this many steps after its offload started, a prefetch is issued at most this
# many steps before its tensor's use. Further ahead would hide more of a slow copy but keep
# more bytes on the device; a copy the cost model expects to take longer makes its Wait stall.
LOOKAHEAD = 2


def _candidates(schedule, steps, model):
    """``[(root, a, w, p, b)]`` in forward order: the root, the index of its last forward use,
    of the step before which its offload is waited for, of the step before which it is
    prefetched, and of its first backward use (indices into ``steps``)."""
    graph, roots = schedule.graph, Roots(schedule)
    turn = next((i for i, s in enumerate(steps) if s.kind == "backward"), None)
    if turn is None:
        return []
    last_before, first_after = {}, {}
    for i, step in enumerate(steps):
        reads, writes = uses(graph, step)
        for name in list(writes) + list(reads):
            r = roots.scheduled(name)
            if r is None or schedule.tensors[r].kind != "data":
                continue
            if i < turn:
                last_before[r] = i
            else:
                first_after.setdefault(r, i)
    # starts[i]: when step i starts on the compute stream (copies do not delay it)
    starts = [0.0]
    for step in steps:
        starts.append(starts[-1] + model.step_seconds(schedule, step))
    gaps = sorted((a, first_after[r], r) for r, a in last_before.items() if r in first_after)
    out, d2h, offloads = [], 0.0, []
    for a, b, r in gaps:
        seconds = model.copy_seconds(schedule.tensors[r].nbytes)
        d2h = max(d2h, starts[a + 1]) + seconds
        w = bisect.bisect_left(starts, d2h, lo=a + 1)  # the first step to start after the copy
        offloads.append((r, a, min(w, a + LOOKAHEAD), b, seconds))
    for r, a, w, b, seconds in offloads:
        p = bisect.bisect_right(starts, starts[b] - seconds, hi=b + 1) - 1  # the latest in time
        p = max(p, b - LOOKAHEAD)
        if w < p:  # else the gap is too short to be worth two copies
            out.append((r, a, w, p, b))
    return sorted(out, key=lambda c: c[1])


def _with_copies(schedule, steps, chosen):
    """``schedule`` with the copy steps of the ``chosen`` candidates put among ``steps``, its
    memory steps made again by liveness."""
    after, before = {}, {}
    for r, a, w, _, _ in chosen:
        after.setdefault(a, []).append(Offload(r))
        before.setdefault(w, []).append(Wait(r))
    for r, _, _, p, _ in chosen:  # after the waits for offloads at the same step: they free memory
        before.setdefault(p, []).append(Prefetch(r))
    for r, _, _, _, b in chosen:
        before.setdefault(b, []).append(Wait(r))
    out = []
    for i, step in enumerate(steps):
        out += before.get(i, ())
        out.append(step)
        out += after.get(i, ())
    return liveness(schedule.replace(out))


def offload(schedule, costs=None, budget=None, host_memory=None):
    """``schedule`` (after liveness) with its long-lived activations offloaded to the host and
    prefetched back; ``costs``: a cost.CostModel, a measured table or None (estimates);
    ``budget`` (bytes, resident included): offload only as much as makes the peak fit;
    ``host_memory`` (bytes): at most this much on the host at once."""
    from .simulate import simulate
    from .workspace import smallest_workspaces
    if not schedule.train:
        return schedule
    model = as_model(costs)
    steps = [s for s in schedule.steps if s.kind not in MEMORY]
    candidates = _candidates(schedule, steps, model)
    if not candidates:
        return schedule
    # Whether it fits is judged with the smallest workspaces: the workspace pass then gives
    # the steps what the tensors leave, rather than tensors going to the host for workspaces.
    probe = smallest_workspaces(schedule)
    probe_steps = [s for s in probe.steps if s.kind not in MEMORY]  # the same steps, other algorithms
    if budget is not None and simulate(probe).peak_bytes <= budget:
        return schedule  # it fits: the cache keeps everything on the device

    def plan(k):
        return simulate(_with_copies(probe, probe_steps, candidates[:k]))

    n = len(candidates)
    if host_memory is not None:  # the most candidates whose host copies fit host memory
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if plan(mid).host_bytes <= host_memory else (lo, mid - 1)
        n = lo
    if budget is not None:  # the fewest that make the peak fit, else as many as allowed
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if plan(mid).peak_bytes <= budget else (mid + 1, hi)
        n = lo
    return _with_copies(schedule, steps, candidates[:n])
