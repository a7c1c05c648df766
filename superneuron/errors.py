"""User-facing errors: each prints as one line (or one line per problem), never a traceback."""

from .limits import MAX_PROBLEMS


class SNError(Exception):
    """An error the user can fix: bad network file, bad option, missing data, budget too small.

    The command-line tools print ``str(error)`` and exit with status 2; nothing below ``cli/``
    prints.
    """


class LayerError(SNError):
    """Raised by a layer while checking its configuration or shapes; the graph adds where."""


class SpecError(SNError):
    """One or more problems in a network file, each as ``file:line:col: layer 'x' (Type): msg``;
    past MAX_PROBLEMS of them, the rest are counted in a last line, not listed."""

    def __init__(self, problems):
        problems = list(problems) if isinstance(problems, (list, tuple)) else [problems]
        if len(problems) > MAX_PROBLEMS + 1:
            problems = problems[:MAX_PROBLEMS] + [f"... and {len(problems) - MAX_PROBLEMS} more problems "
                                                  f"(the first {MAX_PROBLEMS} are shown: MAX_PROBLEMS)"]
        self.problems = problems
        super().__init__("\n".join(self.problems))


def where(file=None, line=None, col=None, layer=None, ltype=None):
    """The ``file:line:col: layer 'name' (Type): `` prefix of a spec error (parts may be missing)."""
    parts = []
    if file is not None:
        loc = str(file)
        if line is not None:
            loc += f":{line}"
            if col is not None:
                loc += f":{col}"
        parts.append(loc + ":")
    if layer is not None:
        parts.append(f"layer '{layer}'" + (f" ({ltype})" if ltype else "") + ":")
    return " ".join(parts) + (" " if parts else "")
