"""The arena: one block of device memory; every tensor is a view at an offset into it.

Where each tensor goes is the allocator model's (superneuron/scheduler/allocator.py), which the
Simulator plans with too: the Runtime's arena is that Allocator with a buffer behind it, so
a plan's peak is the run's peak to the byte.
"""

import math

import numpy as np

from ..scheduler.allocator import ALIGN, Allocator, OutOfMemory, aligned  # noqa: F401  (the arena's words)


class Arena(Allocator):
    """An :class:`~superneuron.scheduler.allocator.Allocator` over a real block of ``capacity`` bytes
    on ``backend``; ``host``: the block is host memory (pinned on a GPU) for offloaded
    tensors. Without a backend it only plans, as an Allocator does."""

    def __init__(self, capacity=None, backend=None, host=False):
        super().__init__(capacity)
        self.backend = backend
        make = None if backend is None else backend.host_bytes if host else backend.empty_bytes
        self.buffer = None if make is None else make(capacity)

    def view(self, name, shape, dtype, freed_ok=False):
        """The array of ``shape`` and ``dtype`` at ``name``'s offset (resident or scheduled).

        ``freed_ok``: also where a tensor freed in this run was last placed (its contents are
        intact only if nothing was placed over it since)."""
        if name in self.offsets:
            off, size = self.offsets[name]
        elif freed_ok and name in self.last:
            off, size = self.last[name]
        else:
            off, size = self.resident[name]
        dtype = np.dtype(dtype)
        n = math.prod(shape) * dtype.itemsize  # exact on Python ints (np.prod took 8 us a view)
        assert n <= size, (name, n, size)
        return self.buffer[off:off + n].view(dtype).reshape(shape)
