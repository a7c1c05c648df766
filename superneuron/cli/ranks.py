"""How sn-train runs and ends when a launcher started several ranks (``mpiexec -n N``).

Only rank 0 prints, from the start: the launcher's rank is known before MPI is, so argparse's
errors and ``--help`` are not printed once per rank either. Every rank ends in the conclusion
(runtime/mpi_group.py, ``MpiGroup.conclude``; a rank that failed before it joined the others
joins first, since they cannot start MPI without it), which gathers each rank's exit status
and a checksum of what it would say. Then each distinct failure is said once, by the first
rank that hit it (:func:`telling`): bare, as one rank would say it, when every rank hit it (a
bad net file, a bad flag value, missing data); after ``rank 1:`` (or ``ranks 1, 3:``) when only
some did; a rank that another's failure stopped says nothing. Every rank exits with the job's
status, and a failed job ends without MPI_Abort. Only a rank that does not answer within
``--timeout`` still aborts the job, naming itself and what it waited for.
"""

import os
import sys
import traceback
import zlib

from ..errors import SNError
from ..runtime import collective
from ..runtime.mpi_group import STOPPED, NoAnswer, Stopped
from .common import error_text, run_cli

BUG = 1  # the status of an exception that is not a user error


def main(parser, run, argv=None):
    """sn-train's ``main`` on one of several ranks: run, conclude with the others, say once."""
    if collective.launched_rank() != 0:
        sys.stdout = open(os.devnull, "w")  # the others' stderr stays: what rank 0 cannot see
    failures = []  # (error, status): what this rank would have said

    def hold(error, status=2):
        failures.append((error, status))
        return status

    try:
        status = run_cli(parser, run, argv, fail=hold)
    except Stopped:  # another rank failed: it says why
        status = STOPPED
    except SystemExit:
        if not failures:
            raise  # --help: every rank alike, none joined
        status = failures[-1][1]
    except Exception:  # noqa: BLE001 - a bug: said as Python says it, once
        failures.append((traceback.format_exc().rstrip(), BUG))
        status = BUG
    error = failures[-1][0] if failures and status == failures[-1][1] else None
    if isinstance(error, NoAnswer):  # a rank is gone or hangs: nothing else would end it
        print(error_text(error), file=sys.stderr)
        collective.abort(status)
    text = "" if error is None else str(error)
    try:
        group = collective.current() or collective.world("cpu")  # MPI alone, to conclude
    except SNError as e:  # mpi4py is missing: every rank has found it so
        if collective.launched_rank() == 0:
            print(error_text(e), file=sys.stderr)
        return 2
    if group is None:  # a launcher's variables, one process: as sn-train alone
        if text:
            print(error_text(text, status), file=sys.stderr)
        return status
    try:
        outcome = group.conclude(status, text)
    except NoAnswer as e:
        if text:
            print(_said(text, status, f"rank {group.rank}: "), file=sys.stderr)
        print(error_text(e), file=sys.stderr)
        collective.abort(status if status > 0 else 2)
    prefix, final = telling(outcome, group.rank)
    if prefix is not None:
        print(_said(text, status, prefix), file=sys.stderr)
    return group.leave(final)


def telling(outcome, rank):
    """``(prefix, status)``: what ``rank`` says of its own failure, given every rank's
    ``(status, crc32 of its message)`` in ``outcome`` (None: nothing, another rank says it or
    there is nothing to say), and the status every rank exits with (the highest of the failed
    ranks', 0 when none failed)."""
    failed = [r for r, (status, _) in enumerate(outcome) if status not in (0, STOPPED)]
    final = max((outcome[r][0] for r in failed), default=0)
    if rank not in failed or outcome[rank][1] == zlib.crc32(b""):
        return None, final
    same = [r for r in failed if outcome[r][1] == outcome[rank][1]]
    if rank != same[0]:
        return None, final  # the first rank that hit it says it
    if len(same) == len(outcome):
        return "", final
    if len(same) == 1:
        return f"rank {rank}: ", final
    return f"ranks {', '.join(map(str, same))}: ", final


def _said(text, status, prefix):
    """The line(s) that say ``text``; a bug's traceback as Python prints it, under its ranks."""
    if status == BUG:
        return f"{prefix.rstrip()}\n{text}" if prefix else text
    return error_text(text, status, prefix)
