"""The GPU backend's host-side decisions, on a fake CuPy: ``--policy auto`` without
``--memory`` fits what is free less a reserve for the libraries' handles and buffers
(backend.library_reserve: the larger of 1 GiB and 5 % of what is free, never more than that;
the CPU has no device budget), and measured kernel timings are cached under the GPU's model
and the cuDNN engine filters in force, never under a bare "gpu"."""

import sys
import types

import pytest

from superneuron import backend
from superneuron.graph import Graph
from superneuron.netfile.spec import loads_spec
from superneuron.scheduler.cost import cache_path

GIB = 1 << 30


def _fake_cupy(free=GIB, name=b"NVIDIA H100 80GB HBM3"):
    runtime = types.SimpleNamespace(memGetInfo=lambda: (free, 2 * free), getDeviceCount=lambda: 1,
                                    getDeviceProperties=lambda i: {"name": name})
    return types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime,
                                                            Device=lambda: types.SimpleNamespace(id=0)))


@pytest.mark.parametrize("free, budget", [(80 * GIB, 76 * GIB), (10 * GIB, 9 * GIB), (GIB // 2, 0)])
def test_auto_leaves_the_libraries_their_reserve(monkeypatch, free, budget):
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(free))
    assert backend.free_device_bytes("gpu") == budget
    assert backend.free_device_bytes("cpu") is None


def test_timings_are_cached_by_the_gpus_model_and_engine_filters(monkeypatch):
    monkeypatch.setitem(sys.modules, "cudnn", None)  # no frontend: no filters
    h100 = backend.GPUBackend(_fake_cupy())
    assert h100.device_model() == "gpu-NVIDIA_H100_80GB_HBM3"
    h200 = backend.GPUBackend(_fake_cupy(name=b"NVIDIA H200"))
    assert h200.device_model() == "gpu-NVIDIA_H200"
    filtered = backend.GPUBackend(_fake_cupy())
    filtered._kernels = types.SimpleNamespace(tf32=False, deterministic=True, exact=True)
    assert filtered.device_model() == "gpu-NVIDIA_H100_80GB_HBM3-deterministic-exact"
    assert backend.Backend().device_model() == "cpu"
    graph = Graph(loads_spec("name: t\ninput: {data: [1, 4]}\nlayers:\n"
                             "  - {name: fc, type: InnerProduct, bottom: data, top: fc, num_output: 2}\n"))
    paths = {cache_path(graph, b.device_model()) for b in (h100, h200, filtered)}
    assert len(paths) == 3
