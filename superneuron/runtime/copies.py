"""Asynchronous host↔device copies for offload and prefetch: one queue per direction.

On the CPU the "device" is the arena and the host is a second block; each direction has one
worker thread (NumPy's copy releases the GIL), so a copy overlaps the layers computing
meanwhile, as it would on a GPU. On the GPU each direction is a CUDA stream that first waits
for the compute stream (the tensor being offloaded was just written; the memory being
prefetched into was just freed by it); the copy itself is a ``cudaMemcpyAsync`` between the
arena and the pinned host arena, which returns at once (``ndarray.get`` would block: its
``blocking`` defaults to True, and then every Offload stalls the host until the GPU drains).
A Copy keeps its pinned host buffer referenced until its event has completed. There a Wait
blocks no thread: it makes the compute stream wait for the copy's event, so the host goes on
queueing kernels; only what the host itself reads (the host-side optimiser's gradients) needs
:meth:`Copy.sync`. Whether a copy had finished when its Wait was reached is its event's
state (``Event.done``, which queries without blocking), so the runtime's count of Waits that
had to wait measures the overlap instead of always reading zero.
"""

import contextlib
from concurrent.futures import ThreadPoolExecutor

from ..backend import address


class Copy:
    """One started copy: :meth:`done` says whether it has finished, :meth:`wait` orders what
    the device computes next after it (on the CPU: blocks until it has finished), :meth:`sync`
    blocks the calling thread until it has finished."""

    def __init__(self, done, wait, sync=None, keep=None):
        self.done, self.wait, self.sync, self.keep = done, wait, sync or wait, keep


class ThreadCopies:
    """CPU copies: a device→host and a host→device worker thread."""

    def __init__(self):
        self.queues = {d: ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sn-{d}")
                       for d in ("d2h", "h2d")}

    @contextlib.contextmanager
    def captured(self):
        """(StreamCopies.captured's counterpart: threads have no events to hold back.)"""
        yield

    def start(self, dst, src, direction):
        """Start copying ``src`` into ``dst`` (``direction``: ``'d2h'`` or ``'h2d'``)."""
        import numpy as np
        future = self.queues[direction].submit(np.copyto, dst, src)
        return Copy(future.done, future.result)

    def close(self):
        for q in self.queues.values():
            q.shutdown(wait=True)


class StreamCopies:
    """GPU copies: a device→host and a host→device CUDA stream, ordered after the compute
    stream by events. ``cuda`` is ``cupy.cuda`` (or a stand-in with the same few names:
    Stream, get_current_stream, runtime.memcpyAsync and its kinds)."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.streams = {d: cuda.Stream(non_blocking=True) for d in ("d2h", "h2d")}
        self.in_flight = []  # (event, dst, src): the buffers stay referenced until it completes
        self.capturing = False  # a CUDA graph is being captured (runtime/graphs.py): no event queries

    @contextlib.contextmanager
    def captured(self):
        """While a CUDA graph is captured: its events cannot be queried (one recorded in a
        capture is no point in time, and asking is an error), so a copy counts as done when its
        Wait is reached, nothing is pruned, and the captured copies are forgotten afterwards
        (their buffers are the arenas', which outlive the graph)."""
        before, self.capturing = list(self.in_flight), True
        try:
            yield
        finally:
            self.in_flight, self.capturing = before, False

    def start(self, dst, src, direction):
        """Queue the copy of ``src`` into ``dst`` (contiguous, of equal size) on ``direction``'s
        stream after what the compute stream has queued so far; returns at once."""
        cuda = self.cuda
        stream = self.streams[direction]
        stream.wait_event(cuda.get_current_stream().record())
        kind = cuda.runtime.memcpyDeviceToHost if direction == "d2h" else cuda.runtime.memcpyHostToDevice
        assert dst.nbytes == src.nbytes, (dst.nbytes, src.nbytes)
        cuda.runtime.memcpyAsync(address(dst), address(src), src.nbytes, kind, stream.ptr)
        finished = stream.record()
        if not self.capturing:
            self.in_flight = [c for c in self.in_flight if not c[0].done]  # queried, never waited on
        self.in_flight.append((finished, dst, src))
        return Copy(lambda: self.capturing or finished.done, lambda: cuda.get_current_stream().wait_event(finished),
                    finished.synchronize, keep=(dst, src))

    def close(self):
        for s in self.streams.values():
            s.synchronize()
        self.in_flight = []


def copies_for(backend):
    """The asynchronous copy queues of ``backend``: CUDA streams where it has a ``cuda`` module
    (a GPU, or a test's stand-in for one), threads on the CPU (chosen here, so that the backend,
    a floor below the runtime, never imports it)."""
    cuda = getattr(backend, "cuda", None)
    if cuda is not None:
        return StreamCopies(cuda)
    return ThreadCopies()
