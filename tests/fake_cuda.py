"""A stand-in for ``cupy.cuda`` that runs on the CPU: streams, events and ``memcpyAsync``
between NumPy arrays, so that the GPU's copy code (runtime/copies.py StreamCopies) runs here.

The data moves at once (NumPy's layers compute at once too, so the bytes are right when a
later step reads them), but a copy-stream event *completes* only when the test says so
(:meth:`FakeCuda.finish`), when the host waits for it, or (``lag``) once that many later copies
have been started (the device is that far behind the host). So ``Event.done`` at a Wait tells
whether the copy had been overlapped, as on a GPU, and every call that would block the host
(``Event.synchronize``, ``Stream.synchronize``) is counted in ``host_waits``.
"""

import ctypes
import types

from superneuron.backend import Backend


class FakeEvent:
    """A recorded point on a fake stream; ``done`` until :meth:`FakeCuda.finish` only where
    its stream is the compute stream (which computes at once, as NumPy does)."""

    def __init__(self, cuda, done):
        self.cuda, self._done = cuda, done

    @property
    def done(self):
        return self._done or self.cuda.idle

    def synchronize(self):
        self.cuda.host_waits.append("event")
        self._done = True


class FakeStream:
    """A fake CUDA stream: records events, waits for events on the device (no host wait)."""

    def __init__(self, cuda, compute=False, non_blocking=False):
        self.cuda, self.compute, self.ptr = cuda, compute, id(self)
        self.device_waits = 0

    def record(self):
        event = FakeEvent(self.cuda, done=self.compute)
        if not self.compute:
            cuda = self.cuda
            cuda.open.append(event)
            if cuda.lag is not None and len(cuda.open) > cuda.lag:  # the oldest copies landed
                for old in cuda.open[:-cuda.lag]:
                    old._done = True
                cuda.open = cuda.open[-cuda.lag:]
        return event

    def wait_event(self, event):
        self.device_waits += 1  # the device orders this stream after ``event``; the host goes on

    def synchronize(self):
        self.cuda.host_waits.append("stream")
        self.cuda.finish()


class FakeCuda:
    """The few names of ``cupy.cuda`` the copies use. ``copies`` lists each copy's
    ``(kind, nbytes, stream)``; ``host_waits`` each call that would have blocked the host."""

    def __init__(self, lag=None):
        self.open, self.host_waits, self.copies, self.lag = [], [], [], lag
        self.idle = False  # True: the device has done everything queued whenever asked
        self.compute = FakeStream(self, compute=True)
        self.runtime = types.SimpleNamespace(memcpyDeviceToHost=2, memcpyHostToDevice=1,
                                             memcpyAsync=self._memcpy_async)

    def Stream(self, non_blocking=False):  # noqa: N802 - cupy.cuda's name
        return FakeStream(self, non_blocking=non_blocking)

    def get_current_stream(self):
        return self.compute

    def finish(self):
        """The device catches up: every event recorded so far completes."""
        for event in self.open:
            event._done = True
        self.open = []

    def _memcpy_async(self, dst, src, nbytes, kind, stream):
        ctypes.memmove(dst, src, nbytes)
        self.copies.append((kind, nbytes, stream))


class FakeGPUBackend(Backend):
    """The CPU backend (NumPy computes, the arena is host memory) whose copies go through a
    :class:`FakeCuda`'s streams, as a GPU backend's do through CuPy's."""

    def __init__(self, lag=None):
        super().__init__()
        self.cuda = FakeCuda(lag)


class FakeNccl:
    """The few names of ``cupy.cuda.nccl`` that runtime/nccl.py uses, for one rank: an
    all-reduce over one rank leaves its buffer as it is; each is recorded in ``sums``."""

    NCCL_FLOAT32, NCCL_FLOAT64, NCCL_SUM = 7, 8, 0
    available = True

    def __init__(self):
        self.sums, self.aborted = [], False
        nccl = self

        class NcclCommunicator:
            def __init__(self, size, unique_id, rank):
                assert (size, rank) == (1, 0)

            def allReduce(self, send, recv, count, dtype, op, stream):  # noqa: N802 - NCCL's name
                assert send == recv and op == nccl.NCCL_SUM
                nccl.sums.append((count, dtype, stream))

            def abort(self):
                nccl.aborted = True

        self.NcclCommunicator = NcclCommunicator

    def get_unique_id(self):
        return (0,) * 128
