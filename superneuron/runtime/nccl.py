"""The ranks on GPUs: NCCL through CuPy's ``cupy.cuda.nccl``, each sum on a stream of its
own (:class:`NcclDevice`); MPI (mpi_group.py) only hands NCCL's unique id round
(:func:`nccl_id`). :class:`SoloNccl`: one rank on one GPU, the whole NCCL path without MPI.
Every wait has the deadline of every collective (mpi_group.py).
"""

import importlib
import threading
import time
import zlib

import numpy as np

from ..backend import address
from ..errors import SNError
from .mpi_group import DEFAULT_TIMEOUT, POLL_SECONDS, MpiGroup, NoAnswer

NCCL_ID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES in nccl.h


class NcclDevice:
    """The device half of NCCL's ranks: each bucket (and synchronised BatchNorm's sums) summed
    on a stream of NCCL's own, ordered after the compute stream by an event; the compute stream
    waits for it by an event too, so the host never waits inside an iteration. The deadline is
    kept at its end (:meth:`settle`, polled once for every sum of the iteration). Needs
    ``cupy``, ``nccl``, ``communicator``, ``stream``, ``types`` and ``_poll``."""

    def _device_sum(self, buffer):
        """Start summing the device array ``buffer`` in place over the ranks; its event."""
        cuda = self.cupy.cuda
        self.stream.wait_event(cuda.get_current_stream().record())  # the buffer is written
        ptr = address(buffer)
        self.communicator.allReduce(ptr, ptr, buffer.size, self.types[buffer.dtype], self.nccl.NCCL_SUM,
                                    self.stream.ptr)
        event = self.stream.record()
        self.unsettled.append(event)
        return event

    def start(self, buffer):
        return self._device_sum(buffer)

    def progress(self):
        pass  # NCCL runs on its stream by itself

    def wait(self, event, what):
        self.cupy.cuda.get_current_stream().wait_event(event)  # the device waits, not the host

    def sum(self, array, what):
        """``array`` (a few floats per channel, on the GPU) summed over the ranks, on the device:
        a new array (not the arena's), ready for what the compute stream queues next."""
        out = array.copy()
        self.wait(self._device_sum(out), what)
        return out

    def settle(self, what):
        """Every sum started this iteration has ended, within the timeout (else the
        communicator is aborted and NoAnswer names ``what``)."""
        events, self.unsettled = self.unsettled, []
        for event in events:
            self._poll(lambda e=event: e.done, what, on_timeout=self.communicator.abort)


class NcclGroup(NcclDevice, MpiGroup):
    """The ranks on GPUs: gradients summed by NCCL (``cupy.cuda.nccl``, :class:`NcclDevice`);
    MPI only hands NCCL's unique id round, and carries :meth:`agree` and :meth:`gather`. Not
    run in this project's CI (no GPU there); the id's exchange (:func:`nccl_id`) and the
    polling are the CPU's, and tested there."""

    def connect(self):
        """One GPU per rank, and NCCL's communicator over the ranks."""
        import cupy
        nccl = nccl_module(cupy)
        self.cupy, self.nccl = cupy, nccl
        # the rank among this node's, from the names gathered at the join (no blocking collective)
        local = sum(1 for host in self.hosts[:self.rank] if host == self.hosts[self.rank])
        device = cupy.cuda.Device(local % cupy.cuda.runtime.getDeviceCount())
        device.use()  # one GPU per rank
        self.communicator = communicator(self, nccl, nccl_id(self, nccl), on_thread=device.use)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.types = {np.dtype("float32"): nccl.NCCL_FLOAT32, np.dtype("float64"): nccl.NCCL_FLOAT64}
        self.unsettled = []


class SoloNccl(NcclDevice):
    """One rank on one GPU, its gradients "summed" by NCCL over a communicator of size 1 (no
    MPI), so that one card runs the whole NCCL path: a schedule planned for several ranks (its
    AllReduce and WaitReduce steps) run with this group changes no value, a sum over one rank
    being the value itself (tests/test_nccl_solo.py). ``cupy`` is CuPy (or a stand-in with ``cuda`` and
    ``cuda.nccl``); SNError when NCCL is missing."""

    def __init__(self, cupy, timeout=DEFAULT_TIMEOUT):
        self.cupy, self.timeout, self.rank, self.size = cupy, float(timeout), 0, 1
        self.nccl = nccl_module(cupy)
        self.communicator = self.nccl.NcclCommunicator(1, self.nccl.get_unique_id(), 0)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.types = {np.dtype("float32"): self.nccl.NCCL_FLOAT32, np.dtype("float64"): self.nccl.NCCL_FLOAT64}
        self.unsettled = []

    def _poll(self, done, what, on_timeout=None):
        deadline = time.monotonic() + self.timeout
        while not done():
            if time.monotonic() > deadline:
                if on_timeout is not None:
                    on_timeout()
                raise NoAnswer(f"NCCL did not end {what} within {self.timeout:g} s")
            time.sleep(POLL_SECONDS)


def nccl_module(cupy):
    """``cupy.cuda.nccl``, or SNError saying how to install it (CuPy imports without NCCL,
    and its ``nccl`` module then says ``available = False``)."""
    try:
        nccl = getattr(cupy.cuda, "nccl", None) or importlib.import_module("cupy.cuda.nccl")
    except Exception as e:  # noqa: BLE001 - a missing libnccl raises more than ImportError
        nccl, why = None, f"{type(e).__name__}: {e}"
    else:
        why = "CuPy says NCCL is not available"
    if nccl is None or not getattr(nccl, "available", True):
        raise SNError(f"NCCL cannot be used ({why}): pip install 'superneuron[cuda12]' or "
                      f"'[cuda13]' (they bring nvidia-nccl-cu12 / -cu13)")
    return nccl


def communicator(group, nccl, unique_id, on_thread=None):
    """NCCL's communicator over ``group``'s ranks from ``unique_id``, made with the timeout of
    every collective: NCCL's ``ncclCommInitRank`` waits for every rank without a deadline (and
    CuPy offers no non-blocking form of it), so it runs on a thread of its own (CuPy releases
    the GIL for it) while this one polls, a failed rank's notice stopping it too, and a rank
    that never comes to it is NoAnswer here (the job is then aborted, that thread with it).
    ``on_thread``: called first on that thread (CUDA's current device is the thread's own)."""
    made = {}

    def make():
        try:
            if on_thread is not None:
                on_thread()
            made["communicator"] = nccl.NcclCommunicator(group.size, unique_id, group.rank)
        except BaseException as e:  # noqa: BLE001 - raised on the polling thread below
            made["error"] = e

    thread = threading.Thread(target=make, name="nccl-init", daemon=True)
    thread.start()
    group._poll(lambda: not thread.is_alive(), "the making of NCCL's communicator")
    if "error" in made:
        raise made["error"]
    return made["communicator"]


def nccl_id(group, nccl):
    """NCCL's unique id (a tuple of NCCL_ID_BYTES C chars, as ``cupy.cuda.nccl`` gives and takes
    it), made by rank 0 and handed to every rank of ``group`` over MPI with the timeout of
    every collective. Then the ranks compare checksums of the id they hold: rank 0's broadcast
    of a small buffer may end before anyone receives it, so this is where a rank that never
    came to the exchange is noticed (NoAnswer) on every rank, rank 0 included; one that comes
    to the exchange and not to the communicator is noticed there (:func:`communicator`)."""
    what = "the exchange of NCCL's unique id"
    made = nccl.get_unique_id() if group.rank == 0 else ()
    held = group.broadcast(made, NCCL_ID_BYTES, what)
    sums = group.gather(zlib.crc32(np.array(held, np.int64).tobytes()), what)
    if len(set(sums)) != 1:
        raise SNError(f"the ranks hold different NCCL ids after {what} (checksums {sums})")
    return tuple(held)
