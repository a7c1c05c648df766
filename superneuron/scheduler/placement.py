"""Placement: where in the arena each scheduled tensor goes.

Two allocators behind one interface (a schedule's ``offsets``):

- ``dynamic``: no plan (``offsets=None``); the arena places each Alloc as it comes, best fit
  with coalescing (superneuron/scheduler/allocator.py), as a caching allocator would.
- ``planned``: offsets computed ahead from the lifetimes the steps give (Zhang et al. 2019's
  lifetime-aware pool, also TFLite's greedy-by-size): tensors are taken largest first and each
  goes in the smallest gap that is free for its whole lifetime, else above the tensors it
  overlaps (two other orders are tried too; the smallest arena wins). The arena then hands
  out exactly these offsets for the same Alloc steps, so the plan still equals the run.

Each order also gives a second layout, packed from the floor up (the canonical solutions of
Moffitt's MiniMalloc, 2023, taken greedily): the next tensor placed is always one that can
go lowest (its offset: the top of what is placed over its lifetime), the order breaking
ties, so that no tensor is ever put where a hole stays below it while another could have
filled it. Best fit, taking a large tensor first, leaves the gaps between short-lived ones
that the long-lived ones above it cannot use: GoogLeNet's optimal plan at 1/3 of liveness's
arena, with 252.9 MiB of tensors live at most, took 266.4 MiB best fit, 253.7 MiB so. The
two packers are packing.py's; this module chooses among their layouts.
"""

import bisect
import dataclasses
import functools

from ..errors import SNError
from ..options import PLACEMENTS
from .allocator import ALIGN, aligned
from .packing import FLOOR_SPANS, OffsetTree, best_fit, pack_from_floor
from .simulate import replay
from .steps import ALLOC, FREE, MEMORY


def lifetimes(schedule):
    """``[(start, end, name, size)]``: each Alloc's step index, the index of the Free that
    ends it (the last step when none does), the tensor and its aligned size."""
    open_, out = {}, []
    for i, step in enumerate(schedule.steps):
        if step.kind == ALLOC:
            open_[step.tensor] = len(out)
            out.append([i, len(schedule.steps) - 1, step.tensor,
                        aligned(schedule.tensors[step.tensor].nbytes)])
        elif step.kind == FREE:
            out[open_.pop(step.tensor)][1] = i
    return [tuple(x) for x in out]


# Orders in which tensors are placed: largest first (Zhang et al.), longest-lived first, and
# most bytes x steps first; and two that take one by classes of the other (a power of two
# each): longest first within each class of size (a small tensor placed early among the
# long-lived ones, as longest first does, sits high and leaves the gap below it too small
# for a large one after it), and largest first within each class of lifetime. Each wins on
# some network (largest first on VGG and AlexNet, longest-lived on GoogLeNet, the product on
# LeNet, the classes on ResNet-50 under tight budgets: 10-20 % less arena); the plan keeps
# the smallest arena.
ORDERS = {
    "largest": lambda start, end, size: (-size, start),
    "longest": lambda start, end, size: (start - end, -size),
    "area": lambda start, end, size: (-(end - start + 1) * size, start),
    "longest by size": lambda start, end, size: (-size.bit_length(), start - end),
    "largest by lifetime": lambda start, end, size: (-(end - start + 1).bit_length(), -size),
}


def plan_offsets(schedule):
    """``(offsets, region)``: ``name → [offset of each of its Allocs, in order]`` in the
    scheduled region and the region's size; best fit among the gaps free for each whole
    lifetime, in the :data:`ORDERS` that gives the smallest region, the workspaces among the
    tensors or after them all (in the holes the tensors leave: where each step's workspace
    was chosen to fill what the tensors leave under a budget, placing them among the tensors
    leaves holes the tensors then cannot use)."""
    spans = lifetimes(schedule)
    late = _workspaces(schedule, spans)
    best, floor = None, live_peak(spans)
    tries = ((key, after, from_floor) for key in ORDERS.values() for after in (((), late) if late else ((),))
             for from_floor in (False, True))
    for key, after, from_floor in tries:
        found = _place(spans, key, after, from_floor=from_floor)
        if found is not None and (best is None or found[1] < best[1]):
            best = found[:2]
            if best[1] <= floor:  # no layout is smaller: the others could only tie, and lose
                break
    offsets = {}
    for (_, _, name, _), off in zip(spans, best[0]):
        offsets.setdefault(name, []).append(off)
    return offsets, best[1]


def live_peak(spans):
    """The most bytes of ``spans`` live at one step (each over its start..end, both ends
    included, as placed): no layout of them is smaller. A long chain of in-place layers is
    laid out at it by the first order tried, and the nine others (a tenth of the time each)
    were left out."""
    events = sorted([(start, 0, size) for start, _, _, size in spans]
                    + [(end, 1, size) for _, end, _, size in spans])
    live = peak = 0
    for _, ends, size in events:  # at one step, the starts before the ends: they meet there
        live += -size if ends else size
        peak = max(peak, live)
    return peak


def tensors_first(schedule, limit, needs=None, lost=None):
    """``(offsets, rooms)``: the tensors of ``schedule`` but its workspaces placed as
    :func:`plan_offsets` places them before the workspaces (``offsets``: ``name → [offset of
    each Alloc]``), and ``{k: (offset, bytes)}``: for the k-th compute step that has a
    workspace, the largest gap below ``limit`` (bytes of the scheduled region) that they leave
    at it. A workspace of at most that many bytes at that offset keeps the region within the
    limit: workspace.fit caps the steps so and places their workspaces there (a step's
    workspace lives at it alone, so no two meet).

    Each of the :data:`ORDERS` gives a layout best fit, and one where it left some workspace
    less than its bytes: those workspaces pinned first right under the limit (the
    tensors then pack below them at their steps, as they can; GoogLeNet at 1/3 of liveness's
    arena fits so where no order's layout did). Where none of those is free of cost (under the
    limit, no step short, no time lost), each order also packs the tensors from the floor up
    with room among them for the workspaces as chosen, else for the least each step can run
    with (GoogLeNet's optimal plan at 1/3: the tensors with every least workspace in 260.4 MiB,
    their peak, where no best-fit layout left every step its least), and the best of those with
    the least then gives each workspace its chosen room in turn where that still fits
    (:func:`_more_room`; that plan then realises at x1.116 of liveness's time, not x1.133).
    The layout kept is, in turn: one whose tensors stay under the limit; the one that leaves
    the fewest steps less room than ``needs`` (``{k: bytes}``, the least workspace each step
    can run with); the one whose rooms cost the least time (``lost(rooms)``: the seconds the
    steps lose to slower algorithms that fit them); the smallest."""
    spans = lifetimes(schedule)
    late = _workspaces(schedule, spans)
    compute, before = 0, []  # before[i]: the compute steps before step i
    for step in schedule.steps:
        before.append(compute)
        compute += step.kind not in MEMORY

    late_set = set(late)
    own = {k: spans[k][3] for k in late}  # room for each workspace as chosen, or the least it can have
    least = {k: aligned(needs.get(before[spans[k][0]], 0)) for k in late} if needs else {}

    def layout(key, pinned, reserve=None):
        """``(score, offsets, rooms)`` of the tensors in the order of ``key``, ``pinned``
        (workspace index → offset) placed first, or packed from the floor up with room for
        the workspaces of ``reserve`` (index → bytes); None where that packing gives up."""
        if not pinned and reserve is None:
            found = _tensors_alone(tuple((s, e, None, 0 if k in late_set else size)
                                         for k, (s, e, _, size) in enumerate(spans)), tuple(late), key)
        else:
            found = _place(spans, key, late, tensors_only=True, pinned=pinned, from_floor=reserve is not None,
                           reserve=reserve)
        if found is None:
            return None
        where, region, (tree, times) = found
        rooms = {before[spans[k][0]]: (pinned[k], limit - pinned[k]) if k in pinned
                 else _room(tree, times, spans[k], limit) for k in late}  # served: the next step
        short = sum(rooms[k][1] < need for k, need in (needs or {}).items() if k in rooms)
        return (region > limit, short, lost(rooms) if lost else 0.0, region), where, rooms

    candidates = []
    for key in ORDERS.values():
        plain = layout(key, {})
        left_short = {k: (limit - spans[k][3]) // ALIGN * ALIGN for k in late
                      if plain[2][before[spans[k][0]]][1] < spans[k][3] <= limit}  # under the limit
        candidates += [plain] + ([layout(key, left_short)] if left_short else [])
    if min(c[0] for c in candidates)[:3] != (False, 0, 0.0):  # best fit costs time: from the floor up
        floored = None  # the best that fits with the least workspaces' room: (layout, its order)
        for key in ORDERS.values():
            for reserve in (own, least) if least else (own,):  # the least where the chosen do not fit
                found = layout(key, {}, reserve)
                if found is None:
                    break
                candidates.append(found)
                if found[0][:2] == (False, 0):
                    if reserve is least and (floored is None or found[0] < floored[0][0]):
                        floored = found, key
                    break
        if floored is not None:
            candidates.append(_more_room(layout, *floored, own, least, before, spans))
    _, where, rooms = min(candidates, key=lambda c: c[0])
    offsets = {}
    for k, ((_, _, name, _), off) in enumerate(zip(spans, where)):
        if off is not None and k not in late:
            offsets.setdefault(name, []).append(off)
    return offsets, rooms


def _more_room(layout, found, key, own, least, before, spans):
    """``found`` (a layout of ``key`` from the floor up with room for the ``least`` workspaces)
    with room for each workspace that its rooms leave short of its chosen bytes (``own``) tried
    in turn, the smallest first, and kept where the layout still fits and loses less time."""
    reserve = dict(least)
    short = sorted((own[k] - least[k], k) for k in least if found[2][before[spans[k][0]]][1] < own[k])
    for _, k in short:
        more = {**reserve, k: own[k]}
        trial = layout(key, {}, more)
        if trial is not None and trial[0][:2] == (False, 0) and trial[0] < found[0]:
            found, reserve = trial, more
    return found


@functools.lru_cache(maxsize=16)
def _tensors_alone(spans, late, key):
    """:func:`_place` of ``spans`` (a tuple; those of ``late``, workspaces, left out) in the
    order of ``key``, kept: workspace.fit lays the same tensors out again each time it gives a
    workspace less room (ResNet-152's optimal plans at 1/3: 7 of a solve's 8 layouts the same;
    the tree placement took 15 of its 23 s). Its result is only read."""
    return _place(list(spans), key, late, tensors_only=True)


def _room(tree, times, span, limit):
    """``(offset, bytes)``: the largest gap below ``limit`` that the tensors of ``tree``
    (placed over the compressed ``times``) leave over the steps of ``span``."""
    start, end = span[0], span[1]
    # the slots of the tensors live at any of its steps (and of some born right after: a
    # smaller room, never one that overlaps)
    lo = bisect.bisect_left(times, start)
    hi = max(lo, bisect.bisect_right(times, end) - 1)
    cursor, room = 0, (0, 0)
    for a, b in tree.taken(lo, hi) if lo < len(times) else ():
        if a >= limit:
            break
        if a - cursor > room[1]:
            room = (cursor, a - cursor)
        cursor = b
    return (cursor, limit - cursor) if limit - cursor > room[1] else room


def _workspaces(schedule, spans):
    """The indices of ``spans`` that are workspaces, in the order they start."""
    return [k for k, (_, _, name, _) in enumerate(spans) if schedule.tensors[name].kind == "workspace"]


def _place(spans, key, after=(), tensors_only=False, pinned=None, from_floor=False, reserve=None):
    """``(offsets, region, (tree, times))``: ``spans`` placed one by one in the order of
    ``key``, those of ``after`` (indices) last, in the order given; the region's size; the
    segment tree over the compressed times. ``tensors_only``: leave ``after`` out (offsets
    None) and make the tree's times those of the others alone. ``pinned``: ``{index:
    offset}``, spans put there before any other (none is placed over them). ``from_floor``:
    the spans but ``after`` packed from the floor up (packing.py; none pinned), the
    order of ``key`` breaking ties, with room kept among them for those of ``after`` that
    ``reserve`` (``{index: bytes}``) names, at that size (their offsets still placed
    after the others', or None); None where that packing gives up or is not tried (past
    :data:`~.packing.FLOOR_SPANS` spans)."""
    if from_floor and len(spans) > FLOOR_SPANS:
        return None
    late, pinned = set(after), pinned or {}
    assert not (pinned and from_floor), "a layout from the floor up pins nothing"
    times = sorted({t for k, (s, e, _, _) in enumerate(spans) if not (tensors_only and k in late) or k in pinned
                    for t in (s, e)})
    rank = {t: k for k, t in enumerate(times)}
    tree = OffsetTree(len(times))
    where = [None] * len(spans)
    region = 0
    for k, off in pinned.items():
        start, end, _, size = spans[k]
        tree.add(rank[start], rank[end], off, off + size)
        where[k] = off
    first = sorted((k for k in range(len(spans)) if k not in late),
                   key=lambda k: (key(spans[k][0], spans[k][1], spans[k][3]), k))
    floor = _floor_offsets(spans, key, first, reserve or {}) if from_floor else {}
    if floor is None:
        return None
    for k in first + ([] if tensors_only else list(after)):
        start, end, _, size = spans[k]
        lo, hi = rank[start], rank[end]
        off = floor[k] if k in floor and k not in late else best_fit(tree.taken(lo, hi), size)
        tree.add(lo, hi, off, off + size)
        where[k] = off
        region = max(region, off + size)
    return where, region, (tree, times)


def _floor_offsets(spans, key, first, reserve):
    """``{index: offset}``: the spans of ``first`` and those ``reserve`` names (at its sizes)
    packed from the floor up, the order of ``key`` breaking ties; None where it gave up."""
    packed = sorted(first + [k for k, size in reserve.items() if size],
                    key=lambda k: (key(spans[k][0], spans[k][1], spans[k][3]), k))
    times = sorted({t for k in packed for t in spans[k][:2]})
    rank = {t: i for i, t in enumerate(times)}
    at = pack_from_floor([(rank[spans[k][0]], rank[spans[k][1]], reserve.get(k, spans[k][3])) for k in packed],
                         len(times))
    return None if at is None else {k: at[i] for i, k in enumerate(packed)}


def place(schedule, context):
    """The pass: ``schedule`` with the Context's placement, planned offsets or none for the
    dynamic allocator (workspace.fit runs it, as a placement may send the workspaces back)."""
    return with_placement(schedule, context.placement)


def with_placement(schedule, placement="dynamic"):
    """``schedule`` placed by ``placement`` (``'dynamic'`` or ``'planned'``)."""
    if placement not in PLACEMENTS:
        raise SNError(f"unknown placement '{placement}'; known: {', '.join(PLACEMENTS)}")
    offsets = plan_offsets(schedule)[0] if placement == "planned" else None
    return dataclasses.replace(schedule, offsets=offsets)


def arena_bytes(schedule, placement):
    """The arena (resident + scheduled high-water mark) ``schedule`` needs with ``placement``."""
    return replay(with_placement(schedule, placement)).high_water


