"""How ranks fail and end (issue 16's faults): a user error that every rank hits is said once,
as one rank alone says it, and the job exits 2 (the line compared with sn-train's own, run
alone); who says what (cli/ranks.telling); NCCL's id exchange with the timeout of every
collective, run on the CPU with a stand-in for NCCL (which needs a GPU per rank). A fault in
one rank, named by its rank, and Ctrl-C are tested in test_data_parallel.py."""

import os
import pathlib
import shutil
import subprocess
import sys
import time
import zlib

import pytest
from one_line import one_line

from superneuron.cli.ranks import telling
from superneuron.runtime.mpi_group import STOPPED

ROOT = pathlib.Path(__file__).resolve().parent.parent
MPIEXEC = shutil.which("mpiexec", path=str(pathlib.Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
LENET = str(ROOT / "nets/lenet.yaml")


def launch(argv, ranks, timeout=60):
    """``argv`` (a Python module or script and its arguments) run alone, or by mpiexec as
    ``ranks`` ranks; the CompletedProcess, with ``seconds``."""
    cmd = [sys.executable, *map(str, argv)]
    if ranks > 1:
        cmd = [MPIEXEC, "-n", str(ranks), *cmd]
    started = time.monotonic()
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    run.seconds = time.monotonic() - started
    return run


@pytest.mark.parametrize("case", ["net file", "flag (argparse)", "flag (sn-train)", "data", "non-finite loss"])
def test_a_user_error_every_rank_hits_is_said_once(tmp_path, case):
    """Each rank hits the same error, before joining the others (argparse's), after (a bad
    net file, --bucket-size, missing data) or in training (a loss every rank sees non-finite):
    two ranks print the one line that one rank alone prints, once, and exit 2; nothing from
    MPI (no MPI_Abort's line)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nlayers: [\n")
    argv = {"net file": [bad], "flag (argparse)": [LENET, "--lr", "fast"],
            "flag (sn-train)": [LENET, "--bucket-size", "lots"], "data": [LENET, "--data", tmp_path / "gone.npz"],
            "non-finite loss": [LENET, "--lr", "1e30"]}[case]
    argv = ["-m", "superneuron.cli.train", *argv, "--iters", "3", "--batch", "8"]
    alone, two = launch(argv, 1), launch(argv, 2)
    assert alone.returncode == 2 and two.returncode == 2, two.stderr[-2000:]
    said = one_line(alone.stderr)
    assert said.startswith("error: ") and not said.startswith("error: rank")
    assert one_line(two.stderr) == said


def outcome(*ranks):
    """``[(status, crc32 of message)]`` from ``(status, message)`` pairs."""
    return [(status, zlib.crc32(text.encode())) for status, text in ranks]


def test_telling_says_each_failure_once_and_names_its_ranks():
    every = outcome((2, "bad.yaml:2: bad"), (2, "bad.yaml:2: bad"), (2, "bad.yaml:2: bad"))
    assert [telling(every, r) for r in range(3)] == [("", 2), (None, 2), (None, 2)]  # bare, by rank 0
    one = outcome((STOPPED, ""), (2, "a fault"), (STOPPED, ""))
    assert [telling(one, r) for r in range(3)] == [(None, 2), ("rank 1: ", 2), (None, 2)]
    some = outcome((0, ""), (2, "no shard"), (STOPPED, ""), (2, "no shard"), (1, "Traceback ..."))
    assert [telling(some, r) for r in range(5)] == [(None, 2), ("ranks 1, 3: ", 2), (None, 2), (None, 2),
                                                    ("rank 4: ", 2)]  # each distinct one; the worst status
    fine = outcome((0, ""), (0, ""))
    assert [telling(fine, r) for r in range(2)] == [(None, 0), (None, 0)]
    interrupted = outcome((130, ""), (130, ""))  # Ctrl-C in training: the progress line said it
    assert [telling(interrupted, r) for r in range(2)] == [(None, 130), (None, 130)]


def test_nccl_id_reaches_every_rank_whole():
    """rank 0's id, 128 signed chars, is the id every rank holds after the exchange."""
    run = launch([ROOT / "tests/mpi_nccl_id.py", 20, -1], 2)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == "rank 1: holds rank 0's id: True, communicator of 2"


@pytest.mark.parametrize("absent", [0, 1])
def test_nccl_id_exchange_has_the_collectives_deadline(absent):
    """A rank that never comes to the exchange (alive, silent) stops the other within the
    timeout, with the message of every collective's deadline: rank 1 waiting for rank 0's id,
    and rank 0, whose broadcast ended without rank 1, at the checksums that follow it."""
    run = launch([ROOT / "tests/mpi_nccl_id.py", 2, absent], 2)
    waiting = 1 - absent
    assert run.returncode != 0 and run.seconds < 30  # the absent rank would sleep 60 s
    assert (f"error: rank {waiting}: no answer within 2 s at the exchange of NCCL's unique id: another rank "
            f"did not answer") in run.stdout, run.stdout + run.stderr


@pytest.mark.parametrize("absent", [0, 1])
def test_making_nccls_communicator_has_the_collectives_deadline(absent):
    """A rank that comes to the id's exchange and never to the communicator, which NCCL makes
    only once every rank has come (here a stand-in that waits as it would), stops the other
    within the timeout, named at that stage, where NCCL's own call would wait forever."""
    run = launch([ROOT / "tests/mpi_nccl_id.py", 2, absent, "communicator"], 2)
    waiting = 1 - absent
    assert run.returncode != 0 and run.seconds < 30  # the absent rank would sleep 60 s
    assert (f"error: rank {waiting}: no answer within 2 s at the making of NCCL's communicator: another "
            f"rank did not answer") in run.stdout, run.stdout + run.stderr


def test_ranks_whose_plans_pair_different_sums_are_refused_before_training(tmp_path):
    """Each rank plans alone. Given different bucket sizes (mpiexec's MPMD form: one command
    per rank), their gradients' all-reduces differ: sn-train refuses, once, before any
    iteration. Given different policies with --sync-bn, one rank recomputes bn2 and the other
    keeps it; a Recompute sums nothing (it normalises with the statistics its forward saved),
    so their collectives are the same, and they train."""
    from test_data_parallel import BATCH_NORM
    net = tmp_path / "bn.yaml"
    net.write_text(BATCH_NORM)

    def mpmd(first, second):
        train = [sys.executable, "-m", "superneuron.cli.train", str(net), "--iters", "2", "--batch", "4"]
        cmd = [MPIEXEC, "-n", "1", *train, *first, ":", "-n", "1", *train, *second]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})

    refused = mpmd(["--bucket-size", "1"], ["--bucket-size", "25MiB"])
    assert refused.returncode == 2 and "iter 1" not in refused.stdout
    assert one_line(refused.stderr).startswith("error: the ranks' plans make their collectives in different orders")
    trained = mpmd(["--sync-bn", "--policy", "recompute"], ["--sync-bn", "--policy", "liveness"])
    assert trained.returncode == 0 and "parameters identical on every rank" in trained.stdout, trained.stderr
