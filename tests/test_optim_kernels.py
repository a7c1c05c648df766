"""The GPU's one-kernel SGD update (superneuron/train/optim_kernels.py) on the CPU: its element code,
compiled for the host as C++ (without fused multiply-adds, as the GPU kernel is built), run
over the table the GPU kernel reads, gives the NumPy per-parameter update's bits for plain,
momentum and Nesterov SGD with and without weight decay, learning-rate and decay multipliers
included; each element finds its tensor in the table. On a GPU (marked gpu): the fused kernel
against CuPy's per-parameter path, bit for bit."""

import ctypes
import shutil
import subprocess
import types

import numpy as np
import pytest

from superneuron.backend import address
from superneuron.layers.base import Context
from superneuron.train import optim_kernels
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig

CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")

SHIM = """
#define __device__
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
"""
HOST = """
extern "C" void sgd_host(float* W, float* G, float* V, long long n, float lr, float decay, float mu, int mode,
                         int ok) {
    for (long long i = 0; i < n; i++) sgd_element(W, G, V, i, lr, decay, mu, mode, ok != 0);
}
extern "C" long long tensor_of_host(const long long* starts, long long count, long long k) {
    return tensor_of(starts, count, k);
}
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    if CXX is None:
        pytest.skip("no C++ compiler")
    folder = tmp_path_factory.mktemp("optim_kernels")
    src, lib = folder / "sgd.cpp", folder / "sgd.so"
    src.write_text(SHIM + optim_kernels.ELEMENT + HOST)
    subprocess.run([CXX, "-O2", "-ffp-contract=off", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    dll = ctypes.CDLL(str(lib))
    dll.sgd_host.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_longlong, ctypes.c_float, ctypes.c_float,
                                                     ctypes.c_float, ctypes.c_int, ctypes.c_int]
    dll.tensor_of_host.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_longlong]
    dll.tensor_of_host.restype = ctypes.c_longlong
    return dll


def _entries(rng, slots):
    out = []
    for size, lr_mult, decay_mult in ((5, 1.0, 1.0), (17, 2.0, 0.0), (1000, 0.5, 2.0)):
        w, g = (rng.standard_normal(size).astype(np.float32) for _ in range(2))
        out.append((w, g, [rng.standard_normal(size).astype(np.float32) for _ in range(slots)], lr_mult, decay_mult))
    return out


def _copy(entries):
    return [(w.copy(), g.copy(), [s.copy() for s in st], a, b) for w, g, st, a, b in entries]


@pytest.mark.parametrize("kind, momentum", [("SGD", 0.0), ("SGD", 0.9), ("Nesterov", 0.9)])
@pytest.mark.parametrize("decay", [0.0, 5e-4])
def test_the_kernels_element_is_the_numpy_update_bit_for_bit(host, rng, kind, momentum, decay):
    cfg = SolverConfig(type=kind, base_lr=0.1, momentum=momentum, weight_decay=decay)
    opt = make_optimizer(cfg)
    mode = optim_kernels.mode_of(cfg)
    assert mode == {("SGD", 0.0): 0, ("SGD", 0.9): 1, ("Nesterov", 0.9): 2}[kind, momentum]
    entries = _entries(rng, opt.slots)
    ref = _copy(entries)
    ws = np.zeros(max(opt.workspace_bytes([e[0].shape for e in ref], np.float32), 1), np.uint8)
    opt.update(np, 3, ref, Context(np, workspace=ws).scratch)
    lr = opt.lr(3)
    w, g, v, starts, total, lrs, decays = optim_kernels.table(entries, lr, cfg.weight_decay, address)
    assert total == sum(e[0].size for e in entries)
    for t, (wt, gt, st, *_) in enumerate(entries):
        assert w[t] == wt.ctypes.data and g[t] == gt.ctypes.data
        host.sgd_host(wt.ctypes.data, gt.ctypes.data, st[0].ctypes.data if st else None, wt.size,
                      lrs[t], decays[t], np.float32(momentum), mode, 1)
    for (w1, g1, s1, *_), (w2, g2, s2, *_) in zip(entries, ref):
        np.testing.assert_array_equal(w1, w2)
        np.testing.assert_array_equal(g1, g2)  # both leave the step in the gradient
        for a, b in zip(s1, s2):
            np.testing.assert_array_equal(a, b)


def test_a_false_finiteness_flag_leaves_everything_as_it_was(host, rng):
    (w, g, (v,), *_), = _entries(rng, 1)[:1]
    before = [a.copy() for a in (w, g, v)]
    host.sgd_host(w.ctypes.data, g.ctypes.data, v.ctypes.data, w.size, 0.1, 1e-3, 0.9, 1, 0)
    for a, b in zip((w, g, v), before):
        np.testing.assert_array_equal(a, b)


def test_each_element_finds_its_tensor(host):
    starts = np.array([0, 5, 22, 1022], np.int64)
    for k in (0, 4, 5, 21, 22, 1021, 1022, 5000):
        assert host.tensor_of_host(starts.ctypes.data, len(starts), k) == np.searchsorted(starts, k, "right") - 1


def test_what_the_kernel_does_not_take_goes_the_per_parameter_way():
    assert optim_kernels.mode_of(SolverConfig(type="Adam")) is None
    assert optim_kernels.mode_of(SolverConfig(momentum=0.9, weight_decay=1e-4, regularization_type="L1")) is None


@pytest.mark.gpu
@pytest.mark.parametrize("kind, momentum, decay", [("SGD", 0.9, 5e-4), ("Nesterov", 0.9, 0.0), ("SGD", 0.0, 1e-3)])
def test_the_fused_kernel_on_the_gpu_is_the_per_parameter_path(monkeypatch, rng, kind, momentum, decay):
    import cupy
    cfg = SolverConfig(type=kind, base_lr=0.1, momentum=momentum, weight_decay=decay)
    entries = _entries(rng, make_optimizer(cfg).slots)
    runs = []
    for fused in ("1", "0"):
        monkeypatch.setenv("SN_FUSED_UPDATE", fused)
        opt = make_optimizer(cfg)
        dev = [(cupy.asarray(w), cupy.asarray(g), [cupy.asarray(s) for s in st], a, b) for w, g, st, a, b in entries]
        ws = cupy.zeros(max(opt.workspace_bytes([e[0].shape for e in dev], np.float32), 1), np.uint8)
        for it in range(2):
            opt.update(cupy, it, dev, Context(cupy, workspace=ws).scratch)
        assert bool(opt._fused) == (fused == "1"), opt.fused_missing
        runs.append([cupy.asnumpy(a) for w, g, st, *_ in dev for a in (w, g, *st)])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_a_kernel_that_does_not_compile_falls_back_once_and_says_why(rng):
    """Where NVRTC refuses the kernel (nothing has run yet), the per-parameter path takes over
    for good, and the optimiser says why."""
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise RuntimeError("nvrtc: error: unknown option --fmad=false")
    fake = types.SimpleNamespace(RawKernel=refuse)
    opt = make_optimizer(SolverConfig(momentum=0.9))
    entries = _entries(rng, 1)
    assert opt._fused_update(fake, entries, 0.1) is False
    assert opt._fused is False and "unknown option" in opt.fused_missing
    assert opt._fused_update(fake, entries, 0.1) is False and len(calls) == 1
