"""The ranks of data-parallel training, launched by ``mpiexec -n N sn-train ...``: MPI through
mpi4py on the CPU (``Iallreduce`` on the arena's bucket buffers), NCCL through CuPy's
``cupy.cuda.nccl`` on a stream of its own on GPUs (MPI only hands the NCCL id round).

mpi4py is imported only when the process was launched with more than one rank (the launcher's
environment says so): one process alone runs as before, with or without mpi4py installed.

Nothing waits without a deadline: every collective (NCCL's id exchange too) is started
non-blocking and polled by one loop (:meth:`MpiGroup._poll`) until it ends or ``timeout``
seconds pass; then the rank says which of the others did not answer (a rank on this machine
whose process is gone is named as exited), :class:`NoAnswer`, and the job is aborted
(:func:`abort`), so that no rank hangs.

A rank that fails tells the others (a notice, point to point, which the same loop listens
for: they stop with :class:`Stopped` instead of waiting), and every rank ends in
:meth:`MpiGroup.conclude`, which gathers each rank's exit status and a checksum of its
message: so that a failure every rank hits (a bad file, a bad flag) can be said once, and the
job still ends without MPI_Abort.
"""

import os
import socket
import sys
import threading
import time
import zlib

import numpy as np

from ..backend import address
from ..errors import SNError

# What launchers set in each process: MPICH's Hydra (PMI), Open MPI, Slurm's srun.
SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "SLURM_NTASKS")
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
DEFAULT_TIMEOUT = 300.0  # seconds: longer than rank 0's test passes, which the others wait out
NCCL_ID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES in nccl.h
STOPPED = -1  # the status :meth:`MpiGroup.conclude` gets from a rank that another's failure stopped
_POLL = 0.0005
_NOTICE = 16  # the tag of a failure notice


class NoAnswer(SNError):
    """Another rank did not answer within the timeout: this rank says so and aborts the job."""


class Stopped(Exception):
    """Another rank failed and said so (``rank``, its exit ``status``): this one stops where it
    waits and leaves the telling to that rank."""

    def __init__(self, rank, status):
        super().__init__(f"rank {rank} failed (status {status})")
        self.rank, self.status = rank, status

_world = None  # the Group of this process, once made (MPI's world is one per process too)


def launched_ranks(environ=os.environ):
    """How many ranks the launcher started (1 when it was not launched by one)."""
    for name in SIZE_VARIABLES:
        value = environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def launched_rank(environ=os.environ):
    """This process's rank as the launcher numbered it (0 when it was not launched by one):
    known before MPI starts, so that only rank 0 prints even what comes before."""
    for name in RANK_VARIABLES:
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def world(device="cpu", timeout=DEFAULT_TIMEOUT):
    """The Group of this process's ranks on ``device``, or None when it runs alone. SNError
    when a launcher started several ranks but mpi4py cannot be imported."""
    global _world
    if _world is not None or launched_ranks() <= 1:
        return _world
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise SNError(f"launched as {launched_ranks()} ranks, but mpi4py cannot be imported ({e}): "
                      f"pip install 'superneuron[mpi]'") from None
    if MPI.COMM_WORLD.Get_size() <= 1:
        return None  # a launcher variable without MPI ranks behind it: run alone
    group = (NcclGroup if device == "gpu" else MpiGroup)(MPI, timeout)
    _world = group  # joined: from here a failure is told to the others (see conclude)
    group.connect()
    return _world


def current():
    """The Group of this process once made (None before, or when it runs alone)."""
    return _world


def abort(status):
    """End every rank now with ``status`` (one did not answer: nothing else would end it);
    never returns."""
    from mpi4py import MPI
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(0.5)  # for the launcher to pass the message on before it kills the ranks
    MPI.COMM_WORLD.Abort(int(status))
    os._exit(int(status))  # MPICH's Abort may return before the launcher has ended this process


class MpiGroup:
    """The ranks over MPI, the CPU's collectives. ``rank``, ``size``; :meth:`start` and
    :meth:`wait` all-reduce (sum) a buffer; :meth:`agree` and :meth:`gather` exchange small
    integers on a communicator of their own, so that they never cross a gradient's all-reduce."""

    def __init__(self, MPI, timeout):
        self.MPI, self.timeout = MPI, float(timeout)
        self.comm = MPI.COMM_WORLD
        self.control = self.comm.Dup()
        self.layers = self.comm.Dup()  # synchronised BatchNorm's sums, in the midst of the steps
        self.faults = self.comm.Dup()  # failure notices and the conclusion (conclude)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.pending = []  # requests started, polled by progress()
        self.listening = None  # no notices while joining: a rank that fails joins first
        self.told = []  # the notices this rank sent, with their buffers (kept until sent)
        self.pids = self.hosts = None  # not known until every rank has joined
        self.pids = self.gather(os.getpid(), "start-up")
        name = np.frombuffer(socket.gethostname().encode()[:64].ljust(64), np.uint8)
        names = np.zeros((self.size, 64), np.uint8)
        self._poll(self.control.Iallgather(name, names).Test, "start-up")
        self.hosts = [bytes(n).rstrip(b" ").decode(errors="replace") for n in names]
        self.notice = np.zeros(2, np.int64)  # (rank, status) of a rank that failed
        self.listening = self.faults.Irecv(self.notice, source=MPI.ANY_SOURCE, tag=_NOTICE)

    def connect(self):
        """What the device's collectives need once the ranks have joined: nothing over MPI."""

    def describe(self):
        """``rank 0 pid 123 on host, rank 1 pid 124 on host``: which process is which rank
        (mpiexec names a process that dies by its pid)."""
        return ", ".join(f"rank {r} pid {p} on {h}" for r, (p, h) in enumerate(zip(self.pids, self.hosts)))

    def start(self, buffer):
        """Start summing ``buffer`` (the arena's bucket, in place) over the ranks; a handle."""
        request = self.comm.Iallreduce(self.MPI.IN_PLACE, buffer, op=self.MPI.SUM)
        self.pending.append(request)
        return request

    def progress(self):
        """Let started all-reduces advance (MPI moves data when it is called): after each
        backward step, so that they overlap the backward rather than wait for their Wait."""
        if self.pending:
            self.pending = [r for r in self.pending if not r.Test()]

    def settle(self, what):
        """The end of an iteration: every all-reduce has ended (MPI's were waited for already)."""

    def wait(self, request, what):
        """Block until ``request`` has ended, at most the timeout; ``what`` names it for the message."""
        self._poll(request.Test, what)
        if request in self.pending:
            self.pending.remove(request)

    def _poll(self, done, what, on_timeout=None, listen=True):
        """Wait until ``done()`` (a request's Test, an event's done), at most the timeout, then
        call ``on_timeout`` and raise NoAnswer naming ``what``. While it waits, a notice that
        another rank failed raises Stopped (``listen``: the conclusion expects notices)."""
        deadline = time.monotonic() + self.timeout
        while not done():
            if listen and self.listening is not None and self.listening.Test():
                self.listening = None
                raise Stopped(int(self.notice[0]), int(self.notice[1]))
            if time.monotonic() > deadline:
                if on_timeout is not None:
                    on_timeout()
                raise NoAnswer(self._silent(what))
            time.sleep(_POLL)

    def _silent(self, what):
        """The message when the others did not answer within the timeout."""
        if self.pids is None or self.hosts is None:  # at start-up: who is who is not known yet
            return (f"rank {self.rank}: no answer within {self.timeout:g} s at {what}: not every rank "
                    f"joined within it (one hangs, or is slower to start than --timeout); stopping every rank")
        here = socket.gethostname()
        gone = [r for r, (p, h) in enumerate(zip(self.pids, self.hosts))
                if r != self.rank and h == here and not _alive(p)]
        told = (", ".join(f"rank {r} (pid {self.pids[r]}) has exited" for r in gone) if gone
                else "another rank did not answer (it hangs, died on another machine, or is slower than --timeout)")
        return f"rank {self.rank}: no answer within {self.timeout:g} s at {what}: {told}; stopping every rank"

    def agree(self, value, what):
        """Whether every rank holds the same integer ``value`` (the iteration before a snapshot)."""
        values = self.gather(value, what)
        return min(values) == max(values)

    def mean(self, values, what):
        """The mean over the ranks of each float in ``values`` (all ranks call it)."""
        buffer = np.array(values, np.float64)
        self._poll(self.control.Iallreduce(self.MPI.IN_PLACE, buffer, op=self.MPI.SUM).Test, what)
        return [float(v) / self.size for v in buffer]

    def sum(self, array, what):
        """``array`` (a few floats, on the host or a GPU) summed over the ranks: a new array
        where ``array`` is (all ranks call it, in the same order)."""
        on_gpu = hasattr(array, "get")
        host = np.array(array.get() if on_gpu else array)
        self._poll(self.layers.Iallreduce(self.MPI.IN_PLACE, host, op=self.MPI.SUM).Test, what)
        if on_gpu:
            import cupy
            return cupy.asarray(host)
        return host

    def gather(self, value, what):
        """Every rank's integer ``value``, in rank order (all ranks call it)."""
        mine, out = np.array([int(value)], np.int64), np.zeros(self.size, np.int64)
        self._poll(self.control.Iallgather(mine, out).Test, what)
        return [int(v) for v in out]

    def broadcast(self, values, count, what):
        """Rank 0's ``count`` integers ``values`` on every rank (the others pass anything), as a
        list: a non-blocking broadcast polled like every collective (NCCL's id goes so)."""
        buffer = np.zeros(count, np.int64)
        if self.rank == 0:
            buffer[:] = values
        self._poll(self.control.Ibcast(buffer, root=0).Test, what)
        return [int(v) for v in buffer]

    def conclude(self, status, text=""):
        """Where every rank ends: ``status`` is its exit status (STOPPED when another's failure
        stopped it) and ``text`` what it would say. A rank that failed first tells the others,
        so that none waits for it; then the ranks gather ``[(status, crc32 of text)]``, in rank
        order, which this returns: a failure every rank hit has the same checksum everywhere.
        NoAnswer when a rank does not come within the timeout."""
        if status not in (0, STOPPED):
            for other in range(self.size):
                if other != self.rank:
                    notice = np.array([self.rank, status], np.int64)
                    self.told.append((notice, self.faults.Isend(notice, dest=other, tag=_NOTICE)))
        mine = np.array([status, zlib.crc32(text.encode())], np.int64)
        every = np.zeros((self.size, 2), np.int64)
        self._poll(self.faults.Iallgather(mine, every).Test, "the end of the run", listen=False)
        if self.listening is not None:  # no notice came: MPI_Finalize wants no receive open
            self.listening.Cancel()
            self.listening.Wait()
            self.listening = None
        return [(int(s), int(c)) for s, c in every]

    def leave(self, status):
        """End this rank with the job's ``status``, once it has said what it had to say. A job
        that ended well returns ``status`` and MPI finalizes as usual. A failed one leaves at
        once, without MPI_Finalize, which would complain of a stopped rank's all-reduce that
        never ends; but the launcher ends every rank when one leaves so, so first every rank
        waits for every other to have said its part (a barrier, polled with the timeout)."""
        if not status:
            return status
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            self._poll(self.faults.Ibarrier().Test, "the end of the run", listen=False)
        finally:
            os._exit(int(status))


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
            time.sleep(_POLL)


def nccl_module(cupy):
    """``cupy.cuda.nccl``, or SNError saying how to install it (CuPy imports without NCCL,
    and its ``nccl`` module then says ``available = False``)."""
    try:
        import importlib
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
