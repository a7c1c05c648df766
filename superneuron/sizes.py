"""Sizes for people: ``human_bytes`` formats a byte count, ``parse_size`` reads one (the
``--memory`` and ``--host-memory`` arguments). A floor everyone may use: it imports nothing of
the package but its errors and limits."""

import re

from .errors import SNError
from .limits import MAX_SIZE_BYTES, over

_UNITS = {"": 1, "B": 1, "K": 1000, "KB": 1000, "M": 1000**2, "MB": 1000**2, "G": 1000**3,
          "GB": 1000**3, "T": 1000**4, "TB": 1000**4, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30,
          "TIB": 2**40}


def human_bytes(nbytes):
    """``1288490188`` → ``'1.2 GiB'``."""
    nbytes = int(nbytes)
    for unit, div in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= div:
            return f"{nbytes / div:.1f} {unit}"
    return f"{nbytes} B"


def parse_size(text):
    """``'12GiB'``, ``'500MB'``, ``'1.5 GiB'``, ``'4096'`` → bytes; SNError when malformed."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise SNError(f"bad size '{str(text)[:40]}'; use e.g. 12GiB, 500MB or 4096")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]  # 400 digits: inf, not an error
    if not value <= MAX_SIZE_BYTES:
        shown = f"{value:.3g}" if value < float("inf") else "more than 1e308"
        raise SNError(over(f"size '{str(text)[:40]}' of", shown, MAX_SIZE_BYTES, "MAX_SIZE_BYTES", " bytes"))
    return int(value)
