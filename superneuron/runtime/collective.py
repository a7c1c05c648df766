"""The ranks of data-parallel training, launched by ``mpiexec -n N sn-train ...``: MPI through
mpi4py on the CPU (``Iallreduce`` on the arena's bucket buffers), NCCL through CuPy's
``cupy.cuda.nccl`` on a stream of its own on GPUs (MPI only hands the NCCL id round).

mpi4py is imported only when the process was launched with more than one rank (the launcher's
environment says so): one process alone runs as before, with or without mpi4py installed.

Nothing waits without a deadline, and a rank that fails tells the others: the MPI side is
mpi_group.py (:class:`~.mpi_group.MpiGroup`, :class:`~.mpi_group.NoAnswer`), the NCCL side
nccl.py; this module finds the ranks the launcher started and makes the group.
"""

import os
import sys
import time

from ..errors import SNError
from .mpi_group import DEFAULT_TIMEOUT, MpiGroup
from .nccl import NcclGroup

# What launchers set in each process: MPICH's Hydra (PMI), Open MPI, Slurm's srun.
SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "SLURM_NTASKS")
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")

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
