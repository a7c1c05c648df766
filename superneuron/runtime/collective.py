"""The ranks of data-parallel training, launched by ``mpiexec -n N sn-train ...``: MPI through
mpi4py on the CPU (``Iallreduce`` on the arena's bucket buffers), NCCL through CuPy's
``cupy.cuda.nccl`` on a stream of its own on GPUs (MPI only hands the NCCL id round).

mpi4py is imported only when the process was launched with more than one rank (the launcher's
environment says so): one process alone runs as before, with or without mpi4py installed.

Nothing waits without a deadline: every collective is started non-blocking and polled until it
ends or ``timeout`` seconds pass; then the rank says which of the others did not answer (a
rank on this machine whose process is gone is named as exited) and the job is aborted, so that
no rank hangs. A rank that fails ends every rank too (:func:`end`).
"""

import os
import socket
import sys
import time

import numpy as np

from ..errors import SNError

# What launchers set in each process: MPICH's Hydra (PMI), Open MPI, Slurm's srun.
SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "SLURM_NTASKS")
DEFAULT_TIMEOUT = 300.0  # seconds: longer than rank 0's test passes, which the others wait out
_POLL = 0.0005

_world = None  # the Group of this process, once made (MPI's world is one per process too)


def launched_ranks(environ=os.environ):
    """How many ranks the launcher started (1 when it was not launched by one)."""
    for name in SIZE_VARIABLES:
        value = environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


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
    _world = (NcclGroup if device == "gpu" else MpiGroup)(MPI, timeout)
    return _world


def running():
    """Whether this process is one of several ranks."""
    return _world is not None


def end(status):
    """The rank is ending with ``status``: when it failed (not 0, nor 130 after a Ctrl-C, which
    mpiexec gave every rank) while others run, abort them all (they would wait for it until
    their timeout). Returns ``status``."""
    if _world is not None and status not in (0, 130, None):
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(0.5)  # for the launcher to pass the message on before it kills the ranks
        _world.comm.Abort(int(status))
    return status


class MpiGroup:
    """The ranks over MPI, the CPU's collectives. ``rank``, ``size``; :meth:`start` and
    :meth:`wait` all-reduce (sum) a buffer; :meth:`agree` and :meth:`gather` exchange small
    integers on a communicator of their own, so that they never cross a gradient's all-reduce."""

    def __init__(self, MPI, timeout):
        self.MPI, self.timeout = MPI, float(timeout)
        self.comm = MPI.COMM_WORLD
        self.control = self.comm.Dup()
        self.layers = self.comm.Dup()  # synchronised BatchNorm's sums, in the midst of the steps
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.pending = []  # requests started, polled by progress()
        self.pids = self.gather(os.getpid(), "start-up")
        name = np.frombuffer(socket.gethostname().encode()[:64].ljust(64), np.uint8)
        names = np.zeros((self.size, 64), np.uint8)
        self._poll(self.control.Iallgather(name, names), "start-up")
        self.hosts = [bytes(n).rstrip(b" ").decode(errors="replace") for n in names]

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

    def wait(self, request, what):
        """Block until ``request`` has ended, at most the timeout; ``what`` names it for the message."""
        self._poll(request, what)
        if request in self.pending:
            self.pending.remove(request)

    def _poll(self, request, what):
        deadline = time.monotonic() + self.timeout
        while not request.Test():
            if time.monotonic() > deadline:
                raise SNError(self._silent(what))
            time.sleep(_POLL)

    def _silent(self, what):
        """The message when the others did not answer within the timeout."""
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
        self._poll(self.control.Iallreduce(self.MPI.IN_PLACE, buffer, op=self.MPI.SUM), what)
        return [float(v) / self.size for v in buffer]

    def sum(self, array, what):
        """``array`` (a few floats, on the host or a GPU) summed over the ranks: a new array
        where ``array`` is (all ranks call it, in the same order)."""
        on_gpu = hasattr(array, "get")
        host = np.array(array.get() if on_gpu else array)
        self._poll(self.layers.Iallreduce(self.MPI.IN_PLACE, host, op=self.MPI.SUM), what)
        if on_gpu:
            import cupy
            return cupy.asarray(host)
        return host

    def gather(self, value, what):
        """Every rank's integer ``value``, in rank order (all ranks call it)."""
        mine, out = np.array([int(value)], np.int64), np.zeros(self.size, np.int64)
        self._poll(self.control.Iallgather(mine, out), what)
        return [int(v) for v in out]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class NcclGroup(MpiGroup):
    """The ranks on GPUs: gradients summed by NCCL (``cupy.cuda.nccl``) on a stream of its
    own, ordered after the compute stream by an event and waited for by the compute stream
    (polled on the host, for the deadline); MPI only hands NCCL's unique id round, and carries
    :meth:`agree` and :meth:`gather`. Not run in this project's CI (no GPU there)."""

    def __init__(self, MPI, timeout):
        super().__init__(MPI, timeout)
        import cupy
        from cupy.cuda import nccl
        self.cupy, self.nccl = cupy, nccl
        local = self.comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()  # the rank among this node's
        cupy.cuda.Device(local % cupy.cuda.runtime.getDeviceCount()).use()  # one GPU per rank
        uid = nccl.get_unique_id() if self.rank == 0 else None
        uid = self.control.bcast(uid, root=0)
        self.communicator = nccl.NcclCommunicator(self.size, uid, self.rank)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.types = {np.dtype("float32"): nccl.NCCL_FLOAT32, np.dtype("float64"): nccl.NCCL_FLOAT64}

    def start(self, buffer):
        cuda = self.cupy.cuda
        self.stream.wait_event(cuda.get_current_stream().record())  # the bucket is packed
        self.communicator.allReduce(buffer.data.ptr, buffer.data.ptr, buffer.size, self.types[buffer.dtype],
                                    self.nccl.NCCL_SUM, self.stream.ptr)
        return self.stream.record()

    def progress(self):
        pass  # NCCL runs on its stream by itself

    def wait(self, event, what):
        deadline = time.monotonic() + self.timeout
        while not event.done:
            if time.monotonic() > deadline:
                self.communicator.abort()
                raise SNError(self._silent(what))
            time.sleep(_POLL)
        self.cupy.cuda.get_current_stream().wait_event(event)
