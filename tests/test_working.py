"""Progress that tells the truth on long work without iterations (sn-plan's solver, sn-depth's
search): a line every PERIOD seconds off a terminal, a bar on one, and Ctrl-C that stops the
tool at once with one line and status 130, even inside HiGHS (C code that returns only at its
time limit)."""

import io
import os
import signal
import subprocess
import sys
import textwrap
import time

from superneuron.cli.progress import INTERRUPTED, Working

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT, PYTHONDONTWRITEBYTECODE="1")


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_off_a_terminal_a_line_each_period_and_none_before():
    out, clock = io.StringIO(), FakeClock()
    with Working("sn-plan: planning x", limit="the solver's time limit: 20 s", out=out, tty=False,
                 period=10, clock=clock) as working:
        clock.now = 9.0
        time.sleep(0.6)  # the watcher looks every 0.25 s: nothing yet
        assert out.getvalue() == ""
        clock.now = 10.0
        deadline = time.monotonic() + 5
        while not out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        working.step("liveness depth 20 fits")
        clock.now = 25.0
        while out.getvalue().count("\n") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert out.getvalue().splitlines() == [
        "progress: sn-plan: planning x: 10 s elapsed (the solver's time limit: 20 s)",
        "progress: sn-plan: planning x: 1 done, the last liveness depth 20 fits; 25 s elapsed (the solver's "
        "time limit: 20 s)"]


def test_on_a_terminal_a_bar_after_a_second():
    out, clock = io.StringIO(), FakeClock()
    with Working("sn-depth: searching", out=out, tty=True, clock=clock):
        time.sleep(0.4)
        assert out.getvalue() == ""  # quick work stays quiet
        clock.now = 3.0
        deadline = time.monotonic() + 5
        while "sn-depth: searching: 3 s" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert "sn-depth: searching: 3 s" in out.getvalue()


HIGHS = textwrap.dedent("""
    import sys, time
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from superneuron.cli.progress import Working
    from superneuron.scheduler.optimal_model import silenced_output
    rng = np.random.default_rng(0)
    a = rng.integers(0, 20, (200, 300))
    with Working("a solve", out=sys.stderr, tty=False):
        print("solving", flush=True)
        with silenced_output():  # as sn-plan solves: descriptors 1 and 2 on /dev/null
            milp(-rng.random(300), integrality=np.ones(300), bounds=Bounds(0, 1),
                 constraints=LinearConstraint(a, -np.inf, a.sum(1) // 2), options={"time_limit": 60})
    print("solved", flush=True)
""")


def test_ctrl_c_inside_highs_stops_at_once_with_one_line():
    """Even while the solve has sent the descriptors to /dev/null, the line is said."""
    proc = subprocess.Popen([sys.executable, "-c", HIGHS], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "solving\n"
    time.sleep(1.0)  # inside milp by now
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 5, "waited for the solver's time limit"
    assert proc.returncode == INTERRUPTED and out == ""
    [line] = err.splitlines()
    assert line.startswith("interrupted: a solve: ") and line.endswith(" elapsed")


def _interrupt(argv, wait_for):
    """Run a tool, send SIGINT once ``wait_for`` is on its stderr; (status, stderr lines)."""
    proc = subprocess.Popen([sys.executable, "-m", *argv], env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    lines, deadline = [], time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if wait_for in line:
            break
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    lines += proc.communicate(timeout=60)[1].splitlines()
    assert time.monotonic() - sent < 10
    return proc.returncode, lines


def test_sn_depth_stops_at_once_on_ctrl_c():
    status, lines = _interrupt(["superneuron.cli.depth", "nets/resnet_cifar.yaml", "--memory", "64GiB",
                                "--batch", "2", "--size", "8", "--policies", "liveness"], "depth")
    assert status == INTERRUPTED, lines
    assert not any("Traceback" in line for line in lines)
    said = [line for line in lines if line.startswith("interrupted")]
    assert len(said) == 1 and said[0].startswith("interrupted: sn-depth: searching resnet_cifar.yaml with "
                                                 "liveness: "), lines
    assert lines[-1] == said[0]
