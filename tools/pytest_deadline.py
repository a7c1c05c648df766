"""A per-test time limit for pytest without pytest-timeout (which the GPU machine may lack):
``PYTHONPATH=tools python -m pytest -p pytest_deadline --deadline 60 ...``.

Each test's call runs under ``signal.alarm``: past the deadline, SIGALRM raises in the test,
which then fails with "over the N s deadline" and the run goes on to the next test, so one
hung kernel cannot take the rest of the GPU tests with it. (A test stuck inside a C call that
does not return to Python is cut by the stage's ``timeout -s INT`` instead, after which pytest
still writes its summary and its XML.) POSIX only; the main thread only, as pytest runs tests.
"""

import signal

import pytest


class DeadlinePassed(Exception):
    """A test ran past ``--deadline`` seconds."""


def pytest_addoption(parser):
    parser.addoption("--deadline", type=float, default=0.0,
                     help="fail a test that runs longer than this many seconds (0: no limit)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    seconds = item.config.getoption("--deadline")
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def passed(signum, frame):
        raise DeadlinePassed(f"{item.nodeid}: over the {seconds:g} s deadline")

    previous = signal.signal(signal.SIGALRM, passed)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
