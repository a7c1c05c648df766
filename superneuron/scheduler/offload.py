"""Offload and prefetch (SuperNeurons' unified tensor pool; Zhang et al. 2019's swapping):
activations that wait long between two uses go to host memory in between.

A *gap* is a stretch between two uses of a data root, the later one in the backward pass and
reading it: the forward/backward turn for a checkpoint, or, in the backward, between a
Recompute that reads a checkpoint and the backward of the layer that wrote it. For each gap
chosen the pass inserts:

- ``Offload(t)`` right after the earlier use: the device→host copy starts; then ``Wait(t)`` at
  the first step by which the cost model expects it done, but at most :data:`LOOKAHEAD` steps
  later (liveness frees the device memory right after it). A host copy still valid from an
  earlier gap (the tensor was not written since) is reused instead: no Offload, no Wait, the
  device memory is freed at once;
- ``Prefetch(t)`` as late as still lets the host→device copy finish before the later use, but
  at most :data:`LOOKAHEAD` steps before it (its new device memory is allocated right before:
  a Prefetch writes ``t`` anew), and ``Wait(t)`` right before that use. The host copy is
  released after this Wait unless a later gap reuses it (``Prefetch(t) [keep]``).

The copy streams are modelled as queues (cost.CostModel.timeline), so a copy issued while the
stream is busy starts later; a Wait for a copy the model expects unfinished is a stall, which
sn-plan reports. A gap too short for both copies stays on the device.

Under a budget the pass acts as SuperNeurons' tensor cache: when the schedule fits without
copies, nothing is offloaded; otherwise the least recently used gaps (those that start
earliest: the first forward outputs, needed last in the backward) are offloaded first, as few
as make the arena fit with the smallest workspaces (found by bisection: each probe one sweep);
the workspace pass then gives the convolutions what the tensors leave. ``host_memory`` bounds
the host bytes that the offloaded tensors occupy at once.
"""

import bisect
from dataclasses import dataclass

from .cost import as_model
from .liveness import Roots, liveness, uses
from .schedule import MEMORY, Offload, Prefetch, Wait

# How many steps a copy may run ahead of the compute: an offloaded tensor's device memory is
# freed at most this many steps after its offload started, a prefetch is issued at most this
# many steps before its tensor's use. Further ahead would hide more of a slow copy but keep
# more bytes on the device; a copy the cost model expects to take longer makes its Wait stall.
# One step keeps every net in nets/ within 1.05x of its lower bound (two: up to 1.15x, when a
# prefetch lands beside the largest workspace), at the price of longer stalls on a fast GPU.
LOOKAHEAD = 1


def _gaps(schedule, steps, model):
    """``([(root, a, w, p, b)], writes)``: the gaps worth offloading, in the order they start
    (indices into ``steps``: the earlier use, the step before which its offload is waited
    for, the one before which it is prefetched, the later use), and each root's write indices."""
    graph, roots = schedule.graph, Roots(schedule)
    turn = next((i for i, s in enumerate(steps) if s.kind == "backward"), None)
    if turn is None:
        return [], {}
    last, writes, gaps = {}, {}, []
    for i, step in enumerate(steps):
        reads, written = uses(graph, step)
        read = {roots.scheduled(n) for n in reads} - {None}
        wrote = {roots.scheduled(n) for n in written} - {None}
        for r in read | wrote:
            if schedule.tensors[r].kind != "data":
                continue
            if r in wrote:
                writes.setdefault(r, []).append(i)
            if r in read and i >= turn and r in last and i - last[r] > 1:
                gaps.append((last[r], i, r))
            last[r] = i
    # starts[i]: when step i starts on the compute stream (copies do not delay it)
    starts = [0.0]
    for step in steps:
        starts.append(starts[-1] + model.step_seconds(schedule, step))
    out, d2h = [], 0.0
    for a, b, r in sorted(gaps):
        seconds = model.copy_seconds(schedule.tensors[r].nbytes)
        d2h = max(d2h, starts[a + 1]) + seconds
        w = min(bisect.bisect_left(starts, d2h, lo=a + 1), a + LOOKAHEAD)  # after the copy
        p = bisect.bisect_right(starts, starts[b] - seconds, hi=b + 1) - 1  # the latest in time
        p = max(p, b - LOOKAHEAD)
        if w < p:  # else the gap is too short to be worth two copies
            out.append((r, a, w, p, b))
    return out, writes


@dataclass
class _Gap:
    """A chosen gap: ``offload``: it takes a host copy of its own (else it reuses the one taken
    after use ``taken``); ``keep``: its Prefetch leaves the host copy for a later gap."""

    root: str
    a: int
    w: int
    p: int
    b: int
    offload: bool = True
    keep: bool = False
    taken: int = 0


def _with_copies(schedule, steps, chosen, writes):
    """``schedule`` with the copy steps of the ``chosen`` gaps put among ``steps``, its memory
    steps made again by liveness."""
    gaps, previous = [], {}
    for r, a, w, p, b in chosen:
        gap, prev = _Gap(r, a, w, p, b, taken=a), previous.get(r)
        written = writes.get(r, ())
        if prev is not None and bisect.bisect_right(written, a) == bisect.bisect_right(written, prev.taken):
            gap.offload, gap.taken, prev.keep = False, prev.taken, True  # nothing wrote it since
        previous[r] = gap
        gaps.append(gap)
    after, before = {}, {}
    for g in gaps:
        if g.offload:
            after.setdefault(g.a, []).append(Offload(g.root))
            before.setdefault(g.w, [[], [], []])[0].append(Wait(g.root))  # first: they free memory
        before.setdefault(g.p, [[], [], []])[1].append(Prefetch(g.root, g.keep))
        before.setdefault(g.b, [[], [], []])[2].append(Wait(g.root))
    out = []
    for i, step in enumerate(steps):
        for group in before.get(i, ()):
            out += group
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
    candidates, writes = _gaps(schedule, steps, model)
    if not candidates:
        return schedule
    # Whether it fits is judged with the smallest workspaces: the workspace pass then gives
    # the steps what the tensors leave, rather than tensors going to the host for workspaces.
    probe = smallest_workspaces(schedule)
    probe_steps = [s for s in probe.steps if s.kind not in MEMORY]  # the same steps, other algorithms
    if budget is not None and simulate(probe).arena_bytes <= budget:
        return schedule  # it fits: the cache keeps everything on the device

    def plan(k):
        return simulate(_with_copies(probe, probe_steps, candidates[:k], writes))

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
            lo, hi = (lo, mid) if plan(mid).arena_bytes <= budget else (mid + 1, hi)
        n = lo
    return _with_copies(schedule, steps, candidates[:n], writes)
