"""The fuzz suite's tools: run a command-line tool's ``main(argv)`` in this process under a time
and memory guard, and judge what came out.

A case passes when it ends, within its time, in either a clean error (exit status 2, stderr a
first line ``error: ...`` and nothing else but one line per further problem of a file, at most
102 lines, no traceback, no warning) or a correct run (an expected status, no traceback or
warning on stderr). A hang (SIGALRM at the case's time) or an exception escaping ``main`` fails.
Memory is capped per case (the address space, 4 GiB above what the process holds), so a case
that would take the machine's memory fails with a MemoryError instead; a case must not even
reach the tools' last-resort "out of memory" message: a limit should have stopped it first.
A hang inside one C call (which SIGALRM cannot interrupt) ends the process after a longer
wait, with every thread's traceback: pytest-xdist then reports that case as crashed.

The cases are generated from a fixed seed (``SN_FUZZ_SEED``, default 17), so a failure is
reproduced by its id.
"""

import contextlib
import faulthandler
import io
import os
import random
import resource
import signal
import time
import traceback

SEED = int(os.environ.get("SN_FUZZ_SEED", "17"))
CASE_SECONDS = 20  # every case takes well under a second; a hang is what exceeds this
HEADROOM = 4 << 30


def rng(name):
    """A random generator for one family of cases: the same cases on every run with one seed."""
    return random.Random(f"{SEED}:{name}")


class Hang(BaseException):
    """Raised by SIGALRM in a case that ran past its time (a BaseException: no ``except
    Exception`` in the code under test may swallow it)."""


class Outcome:
    """What one run of a tool gave: exit status, stdout, stderr, seconds, and the traceback of
    an exception that escaped (None when none did)."""

    def __init__(self, rc, out, err, seconds, escaped=None):
        self.rc, self.out, self.err, self.seconds, self.escaped = rc, out, err, seconds, escaped

    def __repr__(self):
        tail = (self.escaped or self.err)[-1500:]
        return f"Outcome(rc={self.rc!r}, {self.seconds:.2f} s, stderr/traceback:\n{tail})"


def _vm_size():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return None


@contextlib.contextmanager
def guard(seconds=CASE_SECONDS):
    """Run the body with SIGALRM after ``seconds`` (raising Hang), an address-space cap of
    HEADROOM above the present size, and a last-resort exit (with tracebacks) after 3x the time."""
    alarm = None
    try:
        alarm = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    except ValueError:  # not the main thread: the faulthandler exit below still ends a hang
        alarm = None
    faulthandler.dump_traceback_later(seconds * 3 + 30, exit=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    size = _vm_size() if os.path.exists("/proc/self/status") else None
    if size is not None:
        cap = size + HEADROOM
        if hard == resource.RLIM_INFINITY or cap < hard:
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        faulthandler.cancel_dump_traceback_later()
        if alarm is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, alarm)


def _on_alarm(signum, frame):
    raise Hang(f"still running after {CASE_SECONDS} s")


def run_main(main, argv, seconds=CASE_SECONDS, stdout=None):
    """Call ``main(argv)`` as the command line would, in this process, under :func:`guard`."""
    out, err = stdout or io.StringIO(), io.StringIO()
    start, rc, escaped = time.perf_counter(), None, None
    try:
        with guard(seconds), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's errors, and --help
        rc = e.code if isinstance(e.code, int) else 2
    except BaseException:  # noqa: BLE001 - a Hang, a MemoryError, any escaped exception: the case failed
        escaped = traceback.format_exc()
    text = out.getvalue() if isinstance(out, io.StringIO) else ""
    return Outcome(rc, text, err.getvalue(), time.perf_counter() - start, escaped)


def problems_of(outcome, ok=(0,)):
    """What is wrong with ``outcome`` for a fuzz case (an empty list when nothing is): it must be a
    clean error or a run that ended with a status in ``ok``."""
    bad = []
    if outcome.escaped is not None:
        kind = "hang" if "Hang: still running" in outcome.escaped else "exception escaped"
        return [f"{kind}: {outcome.escaped.strip().splitlines()[-1]}"]
    err = outcome.err
    lines = err.rstrip("\n").splitlines()
    if "Traceback" in err:
        bad.append("a traceback on stderr")
    if any("Warning" in line for line in lines):
        bad.append("a warning on stderr")
    if "out of memory" in err:
        bad.append("reached the last-resort out-of-memory message: no limit caught it first")
    if outcome.rc == 2:
        if not lines or not lines[0].startswith("error:"):
            bad.append(f"status 2 without an 'error:' line (stderr {err[:200]!r})")
        elif len(lines) > 1 and lines[0] != "error:":
            bad.append(f"a one-problem error on {len(lines)} lines")
        elif len(lines) > 102:
            bad.append(f"{len(lines)} lines of errors: more than the first 100 and a count")
    elif outcome.rc not in ok:
        bad.append(f"exit status {outcome.rc!r} (expected 2 or one of {ok})")
    return bad


def assert_clean(outcome, ok=(0,)):
    """Fail the test, showing the outcome, unless :func:`problems_of` finds nothing."""
    found = problems_of(outcome, ok)
    assert not found, f"{'; '.join(found)}\n{outcome!r}"


# -- hostile values ------------------------------------------------------------------------

HUGE_INTS = [10**12, 2**31, 2**31 - 1, 2**63, 10**30, 10**400, -1, -(10**12), 0, 1e23, 1.0e23]
BAD_SCALARS = [None, True, False, "", "x" * 5000, 3.5, -0.0, float("nan"), float("inf"), -1e308,
               "conv1", "data_split_1", "a@b", "x.grad", "pool1#0", "ws:x", "\u2028", "${1/0}",
               "${'a' * 10**12}", "${9 ** 4096 ** 4096}", "${sum([[0]] * 10**6, [])}",
               "${'%*d' % (2**31, 1)}", "${" + "(" * 300 + "1" + ")" * 300 + "}", "${" + "+".join(["1"] * 30000) + "}",
               "${range(10**9)}", "${[[0] * 1000] * 1000}", "${int('9' * 5000)}", "${error('stop')}", "${nope}"]
BAD_CONTAINERS = [[], [1] * 1000, [[[[[]]]]], {}, {"type": "gaussian", "std": "x"}, [None], ["a", 1],
                  {"a": {"b": {"c": {}}}}]
HOSTILE = HUGE_INTS + BAD_SCALARS + BAD_CONTAINERS


def nested(depth, leaf=1):
    """A list nested ``depth`` deep."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value
