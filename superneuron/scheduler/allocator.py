"""The allocator model: where named tensors go in one block of bytes, without the bytes.

Resident tensors (parameters, their gradients, optimiser state) are placed first, back to back.
Scheduled tensors (activations, gradients, workspaces) are placed above them by a best-fit
allocator with coalescing, or, when an iteration comes with planned offsets (see
scheduler/placement.py), at those offsets. This is the arithmetic both interpreters of a
schedule share: the Simulator plans with an :class:`Allocator` alone, the Runtime's arena
(runtime/arena.py) is one with a buffer behind it, so a plan's peak is the run's peak to the
byte. It sits below the scheduler and the runtime, and imports neither.
"""

import bisect

from ..errors import SNError

ALIGN = 256  # bytes; cudaMalloc's alignment, used on the CPU too so plans agree across devices


def aligned(nbytes):
    """``nbytes`` rounded up to the arena's alignment (0 stays 0)."""
    return -(-int(nbytes) // ALIGN) * ALIGN


class OutOfMemory(SNError):
    """A scheduled allocation does not fit the arena."""

    def __init__(self, name, nbytes, needed, capacity):
        self.name, self.nbytes, self.needed, self.capacity = name, nbytes, needed, capacity
        super().__init__(f"arena full: '{name}' needs {nbytes} bytes, arena would need "
                         f"{needed} of {capacity} bytes")


class Allocator:
    """Placement of named tensors in one block; ``capacity=None`` plans without a limit."""

    def __init__(self, capacity=None):
        self.capacity = capacity
        self.resident = {}       # name -> (offset, nbytes)
        self.resident_end = 0
        self.reset()

    def reset(self, offsets=None):
        """Forget every scheduled tensor (between iterations); resident ones stay.

        ``offsets`` (``name → [offset of each Alloc of it this iteration]``, relative to the end
        of the resident region) makes this iteration's allocations planned: each goes where the
        plan put it instead of where best fit would."""
        self.planned = offsets
        self.count = {}          # name -> Allocs of it so far this iteration (planned placement)
        self.offsets = {}        # name -> (offset, nbytes) of scheduled tensors
        self.last = {}           # name -> (offset, nbytes) where it was last placed this run
        self.free_blocks = []    # sorted [(offset, size)] below the high-water mark
        self.top = self.resident_end  # first byte above everything placed
        self.live = 0
        self.peak_live = 0
        self.high_water = self.resident_end

    # -- resident region ---------------------------------------------------------------
    def place_resident(self, name, nbytes):
        """Place a resident tensor after the previous ones; only before any scheduled one."""
        assert not self.offsets, "resident tensors are placed before scheduled ones"
        size = aligned(nbytes)
        self.resident[name] = (self.resident_end, size)
        self.resident_end += size
        self._check(name, nbytes, self.resident_end)
        self.reset()
        return self.resident[name][0]

    # -- scheduled region --------------------------------------------------------------
    def alloc(self, name, nbytes):
        """Place ``name`` in the smallest free hole that holds it, else at the top; its offset."""
        assert name not in self.offsets, f"'{name}' allocated twice"
        size = aligned(nbytes)
        if self.planned is not None:
            return self._alloc_planned(name, nbytes, size)
        best = None
        for i, (_, sz) in enumerate(self.free_blocks):
            if sz >= size and (best is None or sz < self.free_blocks[best][1]):
                best = i
        if best is not None:
            off, sz = self.free_blocks.pop(best)
            if sz > size:
                bisect.insort(self.free_blocks, (off + size, sz - size))
        else:
            off = self.top
            if self.free_blocks and sum(self.free_blocks[-1]) == self.top:
                off = self.free_blocks.pop()[0]  # grow the hole that touches the top
            self._check(name, nbytes, off + size)
            self.top = off + size
            self.high_water = max(self.high_water, self.top)
        self.offsets[name] = self.last[name] = (off, size)
        self.live += size
        self.peak_live = max(self.peak_live, self.live)
        return off

    def _alloc_planned(self, name, nbytes, size):
        k = self.count.get(name, 0)
        self.count[name] = k + 1
        off = self.resident_end + self.planned[name][k]
        self._check(name, nbytes, off + size)
        self.high_water = max(self.high_water, off + size)
        self.offsets[name] = self.last[name] = (off, size)
        self.live += size
        self.peak_live = max(self.peak_live, self.live)
        return off

    def free(self, name):
        """Return ``name``'s block, merging it with free neighbours."""
        off, size = self.offsets.pop(name)
        self.live -= size
        if self.planned is not None:
            return
        i = bisect.bisect(self.free_blocks, (off, size))
        if i < len(self.free_blocks) and self.free_blocks[i][0] == off + size:
            size += self.free_blocks.pop(i)[1]
        if i > 0 and sum(self.free_blocks[i - 1]) == off:
            off, prev = self.free_blocks.pop(i - 1)
            size += prev
            i -= 1
        if off + size == self.top:  # the block touches the top: lower the top instead
            self.top = off
        else:
            self.free_blocks.insert(i, (off, size))

    def _check(self, name, nbytes, end):
        if self.capacity is not None and end > self.capacity:
            raise OutOfMemory(name, nbytes, end, self.capacity)

    @property
    def peak_bytes(self):
        """Resident bytes plus the largest sum of scheduled bytes live at once."""
        return self.resident_end + self.peak_live
