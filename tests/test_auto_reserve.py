"""``--policy auto`` without ``--memory`` on a GPU fits what is free less a reserve for the
libraries' handles and buffers (backend.library_reserve): the larger of 1 GiB and 5 % of
what is free, never more than that; the CPU has no device budget."""

import sys
import types

import pytest

from superneuron import backend

GIB = 1 << 30


@pytest.mark.parametrize("free, budget", [(80 * GIB, 76 * GIB), (10 * GIB, 9 * GIB), (GIB // 2, 0)])
def test_auto_leaves_the_libraries_their_reserve(monkeypatch, free, budget):
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(
        memGetInfo=lambda: (free, 2 * free), getDeviceCount=lambda: 1)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert backend.free_device_bytes("gpu") == budget
    assert backend.free_device_bytes("cpu") is None
