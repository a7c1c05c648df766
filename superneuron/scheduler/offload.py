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
sn-plan reports. The compute is timed as the fusion pass after this one will leave it (its
recomputed ReLUs in the pass before them: fuse.seconds_once_fused). A gap too short for both copies stays on the device.

Under a budget the pass acts as SuperNeurons' tensor cache: when the schedule fits without
copies, nothing is offloaded; otherwise the least recently used gaps (those that start
earliest: the first forward outputs, needed last in the backward) are offloaded first, as few
as make the arena fit with the smallest workspaces (found by bisection: each probe one sweep);
the workspace pass then gives the convolutions what the tensors leave. ``host_memory`` bounds
the host bytes that the offloaded tensors occupy at once.
"""

import bisect
import copy
import itertools
import math

from .fuse import seconds_once_fused
from .liveness import Roots, allocate_live, intervals
from .simulate import replay, resident_arenas
from .steps import ALLOC, APPLY, BACKWARD, COPY, MEMORY, PREFETCH, Alloc, Free, Offload, Prefetch, Wait, first_backward
from .walk import NO_MEMORY, Walker
from .workspace import smallest_workspaces

# How many steps a copy may run ahead of the compute: an offloaded tensor's device memory is
# freed at most this many steps after its offload started, a prefetch is issued at most this
# many steps before its tensor's use. Further ahead would hide more of a slow copy but keep
# more bytes on the device; a copy the cost model expects to take longer makes its Wait stall.
# One step keeps every net in nets/ within 1.05x of its lower bound (two: up to 1.15x, when a
# prefetch lands beside the largest workspace), at the price of longer stalls on a fast GPU.
LOOKAHEAD = 1


def least_recently_used(gaps):
    """The eviction order of the tensor cache: ``gaps`` (``(a, b, root)``) least recently used
    first, that is in the order they start (the first forward outputs, needed last in the
    backward). The bisections over "the first k gaps" rely on this order: every k >= m has the
    same steps before the start of gap m (see :meth:`_Variants.fewest_within`), which
    :func:`_check_order` asserts."""
    return sorted(gaps)


EVICTION_ORDER = least_recently_used  # a strategy: any order that starts gaps in order of ``a``


def _check_order(gaps):
    """Assert what the bisections assume of the eviction order: gaps come in the order of
    their earlier use."""
    assert all(g[1] <= h[1] for g, h in zip(gaps, gaps[1:])), "offload gaps must come in the order they start"


def _gaps(schedule, steps, model, only=None):
    """``([(root, a, w, p, b)], writes)``: the gaps worth offloading, in the order they start
    (indices into ``steps``: the earlier use, the step before which its offload is waited
    for, the one before which it is prefetched, the later use), and each root's write indices.
    ``only``: ``{root: lookahead}``, the roots whose gap across the forward/backward turn to
    take (None: every gap of every root, with :data:`LOOKAHEAD`) and how many steps each
    root's copies may run ahead of the compute."""
    roots = Roots.of(schedule)
    turn = first_backward(steps)
    if turn is None:
        return [], {}
    last, writes, gaps, gradient = {}, {}, [], set()
    for i, step in enumerate(steps):
        reads, written = roots.uses(step)
        read, wrote = set(reads), set(written)
        for r in read | wrote:
            # an encoded stash travels encoded; a root a backward wrote (a gradient over its
            # bottom: inplace.py) holds a gradient from there on, and gradients stay
            if schedule.tensors[r].kind not in ("data", "encoded") or r in gradient:
                continue
            if r in wrote:
                writes.setdefault(r, []).append(i)
            if r in read and i >= turn and r in last and i - last[r] > 1:
                gaps.append((last[r], i, r))
            last[r] = i
            if r in wrote and step.kind == BACKWARD:
                gradient.add(r)
    # starts[i]: when step i starts on the compute stream, copies aside (the clock adds the
    # stalls of the Waits placed), the recomputed ReLUs as the fusion pass will leave them
    starts = list(itertools.accumulate(seconds_once_fused(schedule, steps, model), initial=0.0))
    clock = _Clock(starts)
    # The lookahead counts steps but Applies (parameter offload's host diet), which take no
    # time and no device memory: with them or without, a copy gets the same compute steps.
    counted = [i for i, s in enumerate(steps) if s.kind != APPLY]
    rank = {i: k for k, i in enumerate(counted)}
    out, d2h, copied_after = [], 0.0, {}  # copied_after: root → the use its host copy was taken after
    if only is not None:  # the gaps across the turn: back on the device, a tensor stays
        gaps = [g for g in gaps if g[2] in only and g[0] < turn]
    for a, b, r in EVICTION_ORDER(gaps):
        ahead = LOOKAHEAD if only is None else only[r]
        seconds = model.copy_seconds(schedule.tensors[r].nbytes)
        written = writes.get(r, ())
        taken = copied_after.get(r)
        reused = taken is not None and bisect.bisect_right(written, a) == bisect.bisect_right(written, taken)
        done = max(d2h, clock(a + 1)) + seconds  # the copy queues behind the stream's earlier ones
        limit = counted[min(rank[a] + ahead, len(counted) - 1)]
        w = min(bisect.bisect_left(range(len(starts)), done, lo=a + 1, key=clock), limit)  # after the copy
        p = bisect.bisect_right(starts, starts[b] - seconds, hi=b + 1) - 1  # the latest in time
        if rank[b] >= ahead:
            p = max(p, counted[rank[b] - ahead])
        if w < p:  # else the gap is too short to be worth two copies
            out.append((r, a, w, p, b))
            if not reused:  # (a reused host copy needs no copy: _flags says the same)
                copied_after[r], d2h = a, done
                if clock(w) < done:  # its Wait holds the compute stream (w <= limit: a step)
                    clock.stall(w, done - clock(w))
    return out, writes


class _Clock:
    """When each step starts on the compute stream: the compute before it (``starts``) and
    the stalls of the Waits placed so far before or at it (a Wait for a copy not yet done
    holds the stream), so that later copies are timed from when their steps really run."""

    def __init__(self, starts):
        self.starts, self.at, self.total = starts, [], []  # stalls' steps, sorted; stall through each

    def __call__(self, i):
        k = bisect.bisect_right(self.at, i)
        return self.starts[i] + (self.total[k - 1] if k else 0.0)

    def stall(self, i, seconds):
        """Add a stall of ``seconds`` before step ``i``."""
        k = bisect.bisect_right(self.at, i)
        self.at.insert(k, i)
        self.total.insert(k, (self.total[k - 1] if k else 0.0))
        for j in range(k, len(self.total)):
            self.total[j] += seconds


def _flags(gaps, writes):
    """``(reuse, reused_by)`` of ``gaps`` (in order): ``reuse[j]``: gap j reuses the host copy
    taken for an earlier gap of its root, as nothing wrote the root since (it has no Offload
    of its own); ``reused_by[j]``: the gap that reuses gap j's copy (so j's Prefetch keeps it),
    or None. A gap's flags depend only on the gaps before it: they hold for every prefix."""
    reuse, reused_by, taken, previous = [], [None] * len(gaps), [], {}
    for j, (r, a, *_) in enumerate(gaps):
        prev = previous.get(r)
        written = writes.get(r, ())
        again = prev is not None and bisect.bisect_right(written, a) == bisect.bisect_right(written, taken[prev])
        if again:
            reused_by[prev] = j
        reuse.append(again)
        taken.append(taken[prev] if again else a)  # the use after which its host copy was taken
        previous[r] = j
    return reuse, reused_by


class _Variants:
    """The offload pass's candidate ``gaps`` (from :func:`_gaps`) on ``schedule`` (after
    liveness; ``steps``: its steps but the memory ones), and the schedule with the first k of
    them offloaded: :meth:`with_copies` makes it; :meth:`fewest_within` and
    :meth:`host_within` answer the pass's questions about it without making it.

    Those are asked a dozen times or more per plan, and making every step and running
    liveness again each time cost most of the planning of a deep ResNet. What the answers
    need follows from liveness instead: a gap of root r, between its uses at ``a`` and ``b``,
    splits the live interval of r that spans them into one that ends at the Wait of its
    Offload (or right after ``a`` when it reuses a host copy) and one that starts at its
    Prefetch; every other interval, and so every other Alloc and Free, stays where it was.
    tests/test_depth.py checks the answers against :meth:`with_copies`."""

    def __init__(self, schedule, steps, gaps, writes, roots=None):
        self.schedule, self.steps, self.gaps = schedule, steps, gaps
        _check_order(gaps)
        self.roots = roots or Roots.of(schedule)
        self.reuse, self.reused_by = _flags(gaps, writes)
        self._base = self._host_copies = None

    def _keep(self, j, k):
        """Whether gap j's Prefetch keeps its host copy when the first ``k`` gaps are chosen."""
        by = self.reused_by[j]
        return by is not None and by < k

    def with_copies(self, k):
        """The schedule with the copy steps of the first ``k`` gaps put among its steps, its
        memory steps made again by liveness."""
        after, before = {}, {}
        for j in range(k):
            r, a, w, p, b = self.gaps[j]
            if not self.reuse[j]:
                after.setdefault(a, []).append(Offload(r))
                before.setdefault(w, [[], [], []])[0].append(Wait(r))  # first: they free memory
            before.setdefault(p, [[], [], []])[1].append(Prefetch(r, self._keep(j, k)))
            before.setdefault(b, [[], [], []])[2].append(Wait(r))
        out = []
        for i, step in enumerate(self.steps):
            for group in before.get(i, ()):
                out += group
            out.append(step)
            out += after.get(i, ())
        return allocate_live(self.schedule.replace(out), self.roots)

    def _prepare(self):
        """The Allocs and Frees that liveness gives the steps without copies, laid end to end
        (``flat``), with where those of each step in ``positions`` begin (``at``)."""
        allocs, frees = {}, {}
        for r, a, b in intervals(self.schedule, self.steps, self.roots):
            allocs.setdefault(a, []).append(Alloc(r))
            frees.setdefault(b, []).append(Free(r))
        positions = sorted(set(allocs) | set(frees))
        flat, at = [], []
        for i in positions:
            at.append(len(flat))
            flat += allocs.get(i, ())
            flat += frees.get(i, ())
        at.append(len(flat))
        self._base = allocs, frees, positions, flat, at

    def device_steps(self, k, start=0, stop=None):
        """The Allocs and Frees of :meth:`with_copies` ``(k)`` that come with the steps at
        indices ``start`` to ``stop`` (excluded; None: the end) of the steps without copies,
        in its order, except that Frees that come together may come in another order: that
        leaves the arena as it is (its free blocks are the holes between the blocks in use,
        merged, whichever goes first)."""
        if self._base is None:
            self._prepare()
        allocs, frees, positions, flat, at = self._base
        stop = math.inf if stop is None else stop
        unwaited, prefetched, reused = {}, {}, {}
        for j in range(k):
            r, a, w, p, _ = self.gaps[j]
            if start <= p < stop:
                prefetched.setdefault(p, []).append(Alloc(r))  # right before its Prefetch
            if self.reuse[j]:
                if start <= a < stop:
                    reused.setdefault(a, []).append(Free(r))  # after its last use
            elif start <= w < stop:
                unwaited.setdefault(w, []).append(Free(r))  # right after its offload's Wait
        out = []
        x = bisect.bisect_left(positions, start)  # the next of ``positions`` to put in
        for i in sorted(set(unwaited).union(prefetched, reused)):
            y = bisect.bisect_left(positions, i, x)
            out += flat[at[x]:at[y]]  # the steps in between: as without copies
            x = y + 1 if y < len(positions) and positions[y] == i else y
            out += unwaited.get(i, ())
            out += prefetched.get(i, ())
            out += allocs.get(i, ())
            out += frees.get(i, ())
            out += reused.get(i, ())
        out += flat[at[x]:at[bisect.bisect_left(positions, stop, x)]]
        return out

    def host_steps(self, k):
        """The steps of :meth:`with_copies` ``(k)`` that take or give back host memory, in its
        order, for a walker of the host alone: an Offload of its own takes a host copy of the
        gap's tensor (after the use at ``a``), the Wait after the Prefetch before ``b`` gives
        it back unless a later gap reuses it (the Prefetch keeps it). The steps without copies
        may have copies of their own: parameter offload's, of host-resident tensors, touch no
        host memory, and under its diet a gradient's Offload takes a host copy that its Apply
        gives back. None when they have others (a Prefetch of a tensor not host-resident),
        which only a replay follows."""
        if self._host_copies is None:
            host = set(self.schedule.host_resident)
            own = [(i, s) for i, s in enumerate(self.steps) if s.kind in COPY and s.tensor not in host]
            if any(s.kind == PREFETCH for _, s in own):
                self._host_copies = False
            else:
                self._host_copies = [((i, 0, -1), s) for i, s in own]
        if self._host_copies is False:
            return None
        events = list(self._host_copies)
        for j in range(k):
            r, a, _, _, b = self.gaps[j]
            if not self.reuse[j]:
                events.append(((a, 1, j), Offload(r)))  # after step a (Offloads come last there)
            keep = self._keep(j, k)
            events.append(((b, 0, j), Prefetch(r, keep=keep)))  # before step b: its Wait gives
            events.append(((b, 0, j), Wait(r)))                 # the host copy back, or keeps it
        events.sort(key=lambda e: e[0])  # stable: each Prefetch stays before its Wait
        return [step for _, step in events]

    def host_within(self, k, host_memory, residents):
        """Whether the host copies of the first ``k`` gaps fit ``host_memory`` (bytes, with
        the host-resident tensors of ``residents``, a simulate.resident_arenas pair)."""
        steps = self.host_steps(k)
        if steps is None:  # copies of other tensors too: replay the whole schedule
            over = replay(self.with_copies(k), stop=lambda a: a.host.high_water > host_memory,
                          residents=residents)
            return over.stopped_at is None
        host = _fork(residents[1])
        host.reset()
        Walker(self.schedule.tensors, NO_MEMORY, host).walk(steps)  # the host's side alone
        return host.high_water <= host_memory

    def fewest_within(self, lo, hi, budget, residents):
        """The offload pass's bisection for the fewest gaps, from ``lo`` to ``hi``, that keep
        the device arena within ``budget`` (``residents``: a simulate.resident_arenas pair).
        It tests each middle k with a whole replay of the device arena, as that bisection
        does, but does not replay again what every k left to test has in common: all k >= m
        give the same Allocs and Frees before step ``a`` of gap m (gaps come in the order of
        ``a``), so the arena there is kept after each k found over, and the next tests start
        from it; and where an arena is over before that step, every k >= m is too."""
        tensors = self.schedule.tensors
        firsts = [g[1] for g in self.gaps]

        def advance(arena, steps):
            """Replay ``steps`` (Allocs and Frees) on ``arena``; False once it is over budget
            (its high-water mark only grows, so it would end over too)."""
            walker = Walker(tensors, arena)
            methods = walker.methods
            for step in steps:
                methods[step.kind](walker, step)
                if step.kind == ALLOC and arena.high_water > budget:
                    return False
            return True

        arena = _fork(residents[0])
        arena.reset(self.schedule.offsets)
        if arena.high_water > budget:
            return hi  # the resident tensors alone are over: every k is
        common, at = arena, 0  # the arena of every k left to test, before step ``at``
        while lo < hi:
            mid = (lo + hi) // 2
            arena = _fork(common)
            if not advance(arena, self.device_steps(mid, at, firsts[mid])):
                return hi  # over in what every k >= mid has in common, as bisecting would find
            before = _fork(arena)
            if advance(arena, self.device_steps(mid, firsts[mid])):
                hi = mid
            else:
                lo, common, at = mid + 1, before, firsts[mid]
        return lo


def _fork(arena):
    """A copy of a planning Arena that goes on independently (its dicts and lists copied)."""
    twin = copy.copy(arena)
    for name, value in vars(arena).items():
        if isinstance(value, (dict, list)):
            setattr(twin, name, value.copy())
    return twin


def offload(schedule, context):
    """The pass: ``schedule`` (after liveness) with its long-lived activations offloaded to
    the host and prefetched back, timed by the Context's cost model; under its ``budget``
    (bytes, resident included) only as much as makes the peak fit; at most its
    ``host_memory`` (bytes) on the host at once."""
    model, budget, host_memory = context.model, context.budget, context.host_memory
    if not schedule.train:
        return schedule
    steps = [s for s in schedule.steps if s.kind not in MEMORY]
    candidates, writes = _gaps(schedule, steps, model)
    if not candidates:
        return schedule
    # Whether it fits is judged with the smallest workspaces: the workspace pass then gives
    # the steps what the tensors leave, rather than tensors going to the host for workspaces.
    probe = smallest_workspaces(schedule, model)
    probe_steps = [s for s in probe.steps if s.kind not in MEMORY]  # the same steps, other algorithms
    residents = resident_arenas(probe)  # every variant below has the probe's tensors
    if budget is not None and replay(probe, residents=residents).high_water <= budget:
        return schedule  # it fits: the cache keeps everything on the device
    variants = _Variants(probe, probe_steps, candidates, writes)
    n = len(candidates)
    if host_memory is not None:  # the most candidates whose host copies fit host memory
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if variants.host_within(mid, host_memory, residents) else (lo, mid - 1)
        n = lo
    if budget is not None:  # the fewest that make the arena fit, else as many as allowed
        n = variants.fewest_within(0, n, budget, residents)
    return _Variants(schedule, steps, candidates, writes).with_copies(n)


def offload_roots(schedule, context, chosen):
    """``schedule`` (after liveness) with the roots of ``chosen`` (``{root: lookahead}``: how
    many steps its copies may run ahead of the compute, as :data:`LOOKAHEAD`) offloaded after
    their last forward use and prefetched back for their first backward read, as the pass
    would (the same copy steps, timed by the Context's cost model), whatever the budget: the
    optimal policy's choice, made elsewhere. Back on the device, a root stays there (a
    recomputation that reads it brings it back early, as the program counts it). Roots
    without a gap worth two copies stay on the device."""
    if not schedule.train or not chosen:
        return schedule
    steps = [s for s in schedule.steps if s.kind not in MEMORY]
    gaps, writes = _gaps(schedule, steps, context.model, only=chosen)
    if not gaps:
        return schedule
    return _Variants(schedule, steps, gaps, writes).with_copies(len(gaps))
