"""Packing lifetimes into an arena: the two placers planned placement (placement.py) lays its
layouts out with.

- Best fit (:func:`best_fit` over an :class:`OffsetTree`): each tensor in turn goes in the
  smallest gap free for its whole lifetime, else above what it overlaps. The gap search does
  not compare pairs of tensors: a segment tree over (compressed) time keeps, per node, the
  union of the offset ranges taken by tensors covering that node (``own``) and by every tensor
  touching its span (``sub``); the offsets taken during a lifetime are the ``sub`` of its
  O(log n) covering nodes joined with the ``own`` of their ancestors. The unions stay short (a
  tight packing has few holes), so placing n tensors costs about n log n.
- From the floor up (:func:`pack_from_floor`; the canonical solutions of Moffitt's MiniMalloc,
  2023, taken greedily): the next tensor placed is always one that can go lowest (its offset:
  the top of what is placed over its lifetime), so that no tensor is put where a hole stays
  below it while another could have filled it.
"""

import bisect
import heapq

import numpy as np

# Packing from the floor up checks a tensor again each time others rose under its lifetime:
# a few times on GoogLeNet's plans (650 tensors: 4-38 checks each, 0.02-0.1 s), 157 on ResNet-152's
# liveness schedule (1 507 tensors, 0.5 s, against 0.04 s best fit), quadratic beyond. Past these
# it gives up and best fit's layouts stand alone. (On ResNet-152's optimal plans at 1/3, 2 600
# tensors, it came out larger than best fit and its 0.16 s a layout, a dozen layouts a fit, took
# the solver's time: x1.366 against x1.075.)
FLOOR_SPANS = 1024
FLOOR_CHECKS = 48


def pack_from_floor(spans, slots):
    """``{i: offset}`` of ``spans`` (``(first slot, last slot, size)``, in order of
    preference) packed from the floor up: each in turn, the one that can sit lowest, on the
    top of what is placed over its slots (the first in ``spans`` among those as low), so that
    offsets never go down from one to the next; None past :data:`FLOOR_CHECKS` checks a span
    (placement.py tries it on at most :data:`FLOOR_SPANS` tensors). A tensor's offset only
    rises as others are placed: a heap of offsets last seen, each checked again when it comes
    out on top."""
    top = np.zeros(slots, dtype=np.int64)  # per slot, the top of what is placed over it
    heap = [(0, i) for i in range(len(spans))]
    out, checks = {}, FLOOR_CHECKS * len(spans)
    while heap:
        seen, i = heapq.heappop(heap)
        checks -= 1
        if checks < 0:
            return None
        lo, hi, size = spans[i]
        offset = int(top[lo:hi + 1].max())
        if offset > seen:
            heapq.heappush(heap, (offset, i))
            continue
        top[lo:hi + 1] = offset + size
        out[i] = offset
    return out


def best_fit(taken, size):
    """The lowest offset of the smallest gap of at least ``size`` between the sorted, disjoint
    ranges ``taken``, else the end of the last range."""
    best, best_len, cursor = None, None, 0
    for lo, hi in taken:
        gap = lo - cursor
        if gap >= size and (best is None or gap < best_len):
            best, best_len = cursor, gap
        cursor = hi
    return cursor if best is None else best


def _union_add(ranges, lo, hi):
    """Add ``[lo, hi)`` to a sorted list of disjoint ranges, merging what it overlaps or touches."""
    i = bisect.bisect_left(ranges, (lo,))
    if i > 0 and ranges[i - 1][1] >= lo:
        i -= 1
        lo = ranges[i][0]
        hi = max(hi, ranges[i][1])
    j = i
    while j < len(ranges) and ranges[j][0] <= hi:
        hi = max(hi, ranges[j][1])
        j += 1
    ranges[i:j] = [(lo, hi)]


class OffsetTree:
    """A segment tree over time slots 0..n-1 holding, per node, the offset ranges of the
    tensors whose lifetime covers the node's span (``own``) or touches it (``sub``)."""

    def __init__(self, n):
        self.size = 1
        while self.size < max(n, 1):
            self.size *= 2
        self.own, self.sub = {}, {}

    def _cover(self, lo, hi):
        """The nodes that exactly cover slots lo..hi, and all their ancestors."""
        nodes, above = [], set()
        lo += self.size
        hi += self.size + 1
        while lo < hi:
            if lo & 1:
                nodes.append(lo)
                lo += 1
            if hi & 1:
                hi -= 1
                nodes.append(hi)
            lo //= 2
            hi //= 2
        for v in nodes:
            v //= 2
            while v and v not in above:
                above.add(v)
                v //= 2
        return nodes, above

    def taken(self, lo, hi):
        """The offset ranges taken at some slot of lo..hi, sorted and merged."""
        nodes, above = self._cover(lo, hi)
        parts = [r for v in nodes for r in self.sub.get(v, ())]
        parts += [r for v in above for r in self.own.get(v, ())]
        parts.sort()
        merged = []
        for a, b in parts:
            if merged and a <= merged[-1][1]:
                if b > merged[-1][1]:
                    merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        return merged

    def add(self, lo, hi, start, end):
        """Take offsets start..end over slots lo..hi."""
        nodes, above = self._cover(lo, hi)
        for v in nodes:
            _union_add(self.own.setdefault(v, []), start, end)
            _union_add(self.sub.setdefault(v, []), start, end)
        for v in above:
            _union_add(self.sub.setdefault(v, []), start, end)
