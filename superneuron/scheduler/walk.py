"""The walker: one reading of a step list, one method per step kind (torch.fx's Interpreter).

:class:`Walker` ``.run(schedule)`` calls, for each step, the method named for its kind:
``self.forward(step)``, ``self.alloc(step)``, ``self.offload(step)``... What every reading
shares, the memory and copy effects, is written here once: an Alloc places its tensor on the
``device`` allocator, a Free gives it back, an Offload takes a host copy and starts a
device→host copy, a Prefetch starts a host→device copy, a Wait waits for it (and gives the
host copy back), an Apply gives a gradient's host copy back, a Barrier waits for every copy
under way. Compute steps touch no allocator: here they all go to :meth:`Walker.compute`,
which does nothing.

The readings are subclasses that override only what they add:
- the Simulator (simulate.Replayer): bytes, on planning allocators, with nothing more;
- the cost model's clock (cost.Clock): seconds per stream, its copies queued on streams;
- the Runtime (runtime/execution.Execution): kernels, on the arena, with real copies;
- the sweeps of the passes (:class:`Tally` below, workspace.py, encode.py, offload.py).
They all make the same allocator calls in the same order, so plan equals run by construction.

Adding a kind: its entry in steps.KINDS, a method of that name here if it has a memory or
copy effect (else it is a compute step and reaches :meth:`Walker.compute`), and a method in
each subclass that gives it a meaning of its own.
"""

from .steps import KINDS, OFFLOAD, PREFETCH

# What a pending copy is: an offload, a prefetch whose host copy goes after its Wait, or one
# whose host copy stays for a later Prefetch.
OFFLOADING, PREFETCHING, KEEPING = OFFLOAD, PREFETCH, "keep"


class Copies:
    """Copies as the Simulator sees them: none runs (the Runtime's start and wait real ones;
    the cost model's clock queues them on streams)."""

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


class NoMemory:
    """An allocator that keeps nothing: for a reading that follows copies but not bytes (the
    cost model's clock) or one side of memory alone (a host-only replay)."""

    resident = frozenset()

    def alloc(self, name, nbytes):
        pass

    def free(self, name):
        pass


NO_MEMORY = NoMemory()


class Walker:
    """Walks steps on ``device`` and ``host`` (allocator.Allocator, the runtime's arenas, a
    :class:`Tally` or :data:`NO_MEMORY`), the tensors' sizes from ``tensors`` (name →
    TensorInfo), copies through ``copies`` (a :class:`Copies`). ``pending``: tensor →
    (what, handle) for every copy started and not yet waited for. ``methods``: kind → the
    function of that kind (called with the walker and the step), built once per class (a kind
    of steps.KINDS without a method fails here). The functions are unbound so that a walker
    holds no reference to itself: planning turns the garbage collector off during its
    searches, and a cycle would keep every walker, and its arena, alive until it is back on."""

    _tables = {}  # (class, kinds) → its methods

    def __init__(self, tensors, device=NO_MEMORY, host=NO_MEMORY, copies=NO_COPIES):
        self.tensors, self.device, self.host, self.copies = tensors, device, host, copies
        self.pending = {}
        self.methods = self.dispatch_table()

    @classmethod
    def dispatch_table(cls):
        """kind → function: the class's method of that kind's name, or, where the kind is a
        compute step the class does not name, its :meth:`compute`."""
        key = (cls, tuple(KINDS))
        table = Walker._tables.get(key)
        if table is None:
            table = {}
            for kind in KINDS:
                method = getattr(cls, kind, None)
                if method is None:
                    raise TypeError(f"{cls.__name__} has no method for the step kind '{kind}'")
                table[kind] = cls.compute if method is Walker.compute else method
            Walker._tables[key] = table
        return table

    def run(self, schedule):
        """Walk every step of ``schedule``; returns the walker (its state is the result)."""
        self.walk(schedule.steps)
        return self

    def walk(self, steps):
        """Call each step's method, in order."""
        methods = self.methods
        for step in steps:
            methods[step.kind](self, step)

    # -- compute steps: no memory effect ----------------------------------------------------
    def compute(self, step):
        """A compute step: it reads and writes tensors already placed; nothing here."""

    forward = backward = recompute = accumulate = update = compute
    encode = decode = allreduce = waitreduce = compute

    # -- memory and copy steps: written once, for every reading -----------------------------
    def alloc(self, step):
        """Place ``step.tensor`` on the device."""
        name = step.tensor
        self.device.alloc(name, self.tensors[name].nbytes)

    def free(self, step):
        """Give ``step.tensor``'s device storage back."""
        self.device.free(step.tensor)

    def offload(self, step):
        """Take a host copy of ``step.tensor`` (unless it lives on the host) and start its
        device→host copy."""
        name = step.tensor
        nbytes = self.tensors[name].nbytes
        if name not in self.host.resident:
            self.host.alloc(name, nbytes)
        self.pending[name] = (OFFLOADING, self.copies.start(name, nbytes, OFFLOAD))

    def prefetch(self, step):
        """Start ``step.tensor``'s host→device copy, into storage an Alloc placed; ``keep``:
        its host copy stays for a later Prefetch."""
        name = step.tensor
        handle = self.copies.start(name, self.tensors[name].nbytes, PREFETCH)
        self.pending[name] = (KEEPING if step.keep else PREFETCHING, handle)

    def wait(self, step):
        """Wait for ``step.tensor``'s copy (a planned wait)."""
        self.wait_for(step.tensor, planned=True)

    def apply(self, step):
        """The host update of a gradient's parameter (parameter offload) is done: the
        gradient's host copy, which it consumed, goes back."""
        self.copies.applied(step.tensor)
        self.host.free(step.tensor)

    def barrier(self, step):
        """Wait for every copy under way, in the order they started (planned waits)."""
        for name in list(self.pending):
            self.wait_for(name, planned=True)

    def wait_for(self, name, planned):
        """Wait for ``name``'s copy, if one is pending (a stall may have waited for it
        already); after a Prefetch that keeps no host copy, free that copy."""
        found = self.pending.pop(name, None)
        if found is None:
            return
        what, handle = found
        self.copies.wait(name, handle, what, planned)
        if what == PREFETCHING:
            self.host.free(name)


class Tally:
    """An allocator that only counts: ``names``, the tensors live (name → bytes, as given),
    and ``live``, their sum; for the sweeps that ask what is live where, not where it is."""

    resident = frozenset()

    def __init__(self):
        self.names, self.live = {}, 0

    def alloc(self, name, nbytes):
        self.names[name] = nbytes
        self.live += nbytes

    def free(self, name):
        self.live -= self.names.pop(name, 0)


def live_after(schedule, index):
    """``{tensor: bytes}`` of the scheduled tensors on the device after step ``index``."""
    tally = Tally()
    Walker(schedule.tensors, tally).walk(schedule.steps[:index + 1])
    return tally.names
