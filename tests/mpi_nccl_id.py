"""Run under mpiexec by tests/test_ranks_failures.py: NCCL's unique id exchange and the making
of its communicator (runtime/nccl.nccl_id and communicator), the code the GPU path runs,
with a stand-in for ``cupy.cuda.nccl`` (NCCL itself needs a GPU per rank).
``python mpi_nccl_id.py TIMEOUT ABSENT [communicator]``: rank ABSENT (-1: none) never comes to
the exchange (with ``communicator``: comes to the exchange, never to the communicator, whose
making then waits for it as NCCL's does); it stays alive, silent, as a rank that hangs. Each
other rank but rank 0 prints whether it holds rank 0's id (and its communicator's size); a
rank that stopped says why and aborts the job, as sn-train does when a rank does not answer."""

import random
import sys
import time

from superneuron.runtime import collective, nccl
from superneuron.runtime.mpi_group import NoAnswer


class StandInNccl:
    """``cupy.cuda.nccl.get_unique_id``'s shape: NCCL_ID_BYTES C chars as Python ints, signed
    on x86 (-128..127), so that a broadcast that lost the sign would show."""

    @staticmethod
    def get_unique_id():
        rng = random.Random(16)
        return tuple(rng.randrange(-128, 128) for _ in range(nccl.NCCL_ID_BYTES))

    class NcclCommunicator:
        """Made at once, or (``waits``: a rank is missing) not before that rank comes: never."""

        waits = False

        def __init__(self, size, unique_id, rank):
            assert unique_id == StandInNccl.get_unique_id()
            if self.waits:
                time.sleep(60)
            self.ranks = size


def main():
    timeout, absent, stage = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3:] or ["id"]
    group = collective.world("cpu", timeout)
    if group.rank == absent and stage != ["communicator"]:
        time.sleep(60)
        return
    try:
        held = nccl.nccl_id(group, StandInNccl)
        if group.rank == absent:
            time.sleep(60)
            return
        StandInNccl.NcclCommunicator.waits = absent >= 0
        made = nccl.communicator(group, StandInNccl, held)
    except NoAnswer as e:
        print(f"error: {e}", flush=True)
        collective.abort(2)
    if group.rank != 0:  # one line per receiving rank (lines of two ranks may interleave)
        print(f"rank {group.rank}: holds rank 0's id: {held == StandInNccl.get_unique_id()}, "
              f"communicator of {made.ranks}", flush=True)
    group.conclude(0)  # as sn-train ends: no receive left open for MPI_Finalize


if __name__ == "__main__":
    main()
