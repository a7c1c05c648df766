"""The ranks over MPI (mpi4py): :class:`MpiGroup`, whose collectives are started
non-blocking and polled by one loop (:meth:`MpiGroup._poll`) until they end or ``timeout``
seconds pass; then the rank says which of the others did not answer (a rank on this machine
whose process is gone is named as exited), :class:`NoAnswer`, and the job is aborted
(collective.abort), so that no rank hangs.

A rank that fails tells the others (a notice, point to point, which the same loop listens
for: they stop with :class:`Stopped` instead of waiting), and every rank ends in
:meth:`MpiGroup.conclude`, which gathers each rank's exit status and a checksum of its
message: so that a failure every rank hits (a bad file, a bad flag) can be said once, and the
job still ends without MPI_Abort.
"""

import os
import socket
import sys
import time
import zlib

import numpy as np

from ..errors import SNError

DEFAULT_TIMEOUT = 300.0  # seconds: longer than rank 0's test passes, which the others wait out
STOPPED = -1  # the status :meth:`MpiGroup.conclude` gets from a rank that another's failure stopped
POLL_SECONDS = 0.0005
_NOTICE = 16  # the tag of a failure notice


class NoAnswer(SNError):
    """Another rank did not answer within the timeout: this rank says so and aborts the job."""


class Stopped(Exception):
    """Another rank failed and said so (``rank``, its exit ``status``): this one stops where it
    waits and leaves the telling to that rank."""

    def __init__(self, rank, status):
        super().__init__(f"rank {rank} failed (status {status})")
        self.rank, self.status = rank, status


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
            time.sleep(POLL_SECONDS)

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
