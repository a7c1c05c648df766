"""The one shape of an error a user can cause (DESIGN.md invariant 4, the issue's "exit 2 with
one line"): a single non-empty line, never a traceback. Every test of such an error goes
through these, so the shape is checked the same way everywhere."""

import contextlib

import pytest


def one_line(text):
    """``text`` (what stderr got, or an exception's message) as its one line; fails the test
    when it is empty, holds a traceback, or runs over more than one line."""
    assert "Traceback" not in text, text
    lines = text.strip("\n").splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"not one line:\n{text}"
    return lines[0]


def cli_error(capsys, main, argv, status=2, quiet=False):
    """Run a CLI's ``main(argv)`` in this process; assert it returns ``status`` (2: the user's
    mistake) with one line on stderr (and, if ``quiet``, nothing on stdout); return the line."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == status, f"exit {code}, not {status}\nstdout: {out}\nstderr: {err}"
    assert not quiet or out == "", out
    return one_line(err)


@contextlib.contextmanager
def raises_one_line(exception, match=None):
    """``pytest.raises(exception, match=match)``, the message also required to be one line."""
    with pytest.raises(exception, match=match) as info:
        yield info
    one_line(str(info.value))
