"""Asynchronous host↔device copies for offload and prefetch: one queue per direction.

On the CPU the "device" is the arena and the host is a second block; each direction has one
worker thread (NumPy's copy releases the GIL), so a copy overlaps the layers computing
meanwhile, as it would on a GPU. On the GPU each direction is a CUDA stream that first waits
for the compute stream (the tensor being offloaded was just written; the memory being
prefetched into was just freed by it), and a Copy keeps its pinned host buffer referenced until
the copy has completed. There a Wait blocks no thread: it makes the compute stream wait for the
copy's event, so the host goes on queueing kernels; only what the host itself reads (the
host-side optimiser's gradients) needs :meth:`Copy.sync`.
"""

from concurrent.futures import ThreadPoolExecutor


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
    stream by events."""

    def __init__(self, cupy):
        self.cupy = cupy
        self.streams = {d: cupy.cuda.Stream(non_blocking=True) for d in ("d2h", "h2d")}

    def start(self, dst, src, direction):
        cuda = self.cupy.cuda
        stream = self.streams[direction]
        stream.wait_event(cuda.get_current_stream().record())
        if direction == "d2h":
            src.get(stream=stream, out=dst)
        else:
            dst.set(src, stream=stream)
        finished = stream.record()
        return Copy(lambda: finished.done, lambda: cuda.get_current_stream().wait_event(finished),
                    finished.synchronize, keep=(dst, src))

    def close(self):
        for s in self.streams.values():
            s.synchronize()


def copies_for(backend):
    """The asynchronous copy queues of ``backend``: CUDA streams on a GPU, threads on the CPU
    (chosen here, so that the backend, a floor below the runtime, never imports it)."""
    if backend.name == "gpu":
        return StreamCopies(backend.xp)
    return ThreadCopies()
