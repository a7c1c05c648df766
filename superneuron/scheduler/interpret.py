"""The one interpreter of memory and copy steps: what an Alloc, a Free, an Offload, a Prefetch,
a Wait and an Apply do to the device's and the host's allocators (steps.KINDS says it in words).

The Simulator drives it with allocators alone (bytes only); the Runtime drives it with the
arena and the host arena behind the same allocators and a :class:`Copies` that really copies;
the offload pass's fast paths drive it on the Alloc and Free steps they derive. Every one of
them makes the same allocator calls in the same order, so plan equals run by construction.
"""

from .steps import ALLOC, APPLY, FREE, OFFLOAD, PREFETCH, WAIT

# What a pending copy is: an offload, a prefetch whose host copy goes after its Wait, or one
# whose host copy stays for a later Prefetch.
OFFLOADING, PREFETCHING, KEEPING = OFFLOAD, PREFETCH, "keep"


class Copies:
    """Copies as the Simulator sees them: none runs (the Runtime's start and wait real ones)."""

    def start(self, name, nbytes, kind):
        """Start the copy of ``name`` (``kind``: OFFLOAD or PREFETCH); a handle for :meth:`wait`."""
        return None

    def wait(self, name, handle, what, planned):
        """Wait for the copy ``handle`` of ``name`` (``what``: OFFLOADING, PREFETCHING or
        KEEPING; ``planned``: a Wait step, not a stall)."""

    def applied(self, name):
        """``name``'s host copy is about to be given back (an Apply step): whatever reads it
        (the host-side update of a gradient's parameter) must be done."""


NO_COPIES = Copies()


class Interpreter:
    """Carries out memory and copy steps on ``device`` and ``host`` (allocator.Allocator, or
    runtime arenas), the tensors' sizes from ``tensors``. ``pending``: tensor → (what, handle)
    for every copy started and not yet waited for."""

    def __init__(self, tensors, device, host=None, copies=NO_COPIES):
        self.tensors, self.device, self.host, self.copies = tensors, device, host, copies
        self.pending = {}

    def run(self, step):
        """Do what memory or copy ``step`` does: an Alloc places its tensor on the device, a
        Free gives it back; an Offload takes a host copy (unless the tensor lives on the host)
        and starts the device→host copy; a Prefetch starts the host→device copy (into storage
        an Alloc placed); a Wait waits for its tensor's copy and, after a Prefetch that keeps
        no host copy, gives the host copy back; an Apply gives a gradient's host copy back once
        the host update that consumes it is done."""
        kind, name = step.kind, step.tensor
        if kind == ALLOC:
            self.device.alloc(name, self.tensors[name].nbytes)
        elif kind == FREE:
            self.device.free(name)
        elif kind == OFFLOAD:
            nbytes = self.tensors[name].nbytes
            if name not in self.host.resident:
                self.host.alloc(name, nbytes)
            self.pending[name] = (OFFLOADING, self.copies.start(name, nbytes, OFFLOAD))
        elif kind == PREFETCH:
            handle = self.copies.start(name, self.tensors[name].nbytes, PREFETCH)
            self.pending[name] = (KEEPING if step.keep else PREFETCHING, handle)
        elif kind == WAIT:
            self.wait(name, planned=True)
        elif kind == APPLY:
            self.copies.applied(name)
            self.host.free(name)
        else:
            raise AssertionError(f"not a memory or copy step: {kind}")

    def wait(self, name, planned):
        """Wait for ``name``'s copy, if one is pending (a stall may have waited for it
        already); after a Prefetch that keeps no host copy, free that copy."""
        found = self.pending.pop(name, None)
        if found is None:
            return
        what, handle = found
        self.copies.wait(name, handle, what, planned)
        if what == PREFETCHING:
            self.host.free(name)
