"""The GPU's elementwise kernels (layers/cuda_kernels.py) checked on the CPU: each body,
compiled as C++ by the host's compiler inside the loop that CuPy's ElementwiseKernel wraps it
in (an index ``i`` over the non-raw arrays, a reference to each one's element, raw arrays
indexed by hand), run on NumPy arrays and compared with the layers' NumPy code; then the
layers' GPU branches themselves (what they pass to which kernel, in which order), run on NumPy
arrays with those kernels and NumPy's per-channel sums in place of the CUDA ones.

This is not the GPU (tests/test_gpu.py runs the kernels there, where there is one): it checks
the kernels' logic and their C, which no machine without a GPU would compile otherwise. The
cases are the GPU tests' own: NaN, infinities, -0.0, ties, padding, Caffe's rounded-up last
window, a ragged last byte. Skipped where there is no C++ compiler.
"""

import ctypes
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest
from layer_harness import build
from test_encode import POOLS, SPECIAL, max_pool_case

from superneuron.layers import cuda_kernels
from superneuron.layers.activation import _relu_backward
from superneuron.layers.base import Context

CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")

C_TYPES = {"T": "T", "float32": "float", "float64": "double", "int64": "long long", "int32": "int",
           "uint8": "unsigned char"}
SCALARS = {"float": ctypes.c_float, "double": ctypes.c_double, "long long": ctypes.c_longlong,
           "int": ctypes.c_int}
HEADER = """#include <math.h>
template <class U> struct Raw { U* p; U& operator[](long long k) const { return p[k]; } };
typedef float T;
"""


@pytest.fixture(scope="module")
def bodies():
    """``{kernel name: (parameters, body)}`` of every ElementwiseKernel, read through a stand-in
    for CuPy; each parameter ``(raw, C type, name)``, inputs first, as the kernel takes them."""
    made = {}

    def elementwise(in_params, out_params, body, name, **_):
        params = [p.split() for p in f"{in_params}, {out_params}".split(",")]
        made[name] = ([("raw" in p, C_TYPES[p[-2]], p[-1]) for p in params], body)
        return name

    cuda_kernels._kernels.cache_clear()
    saved = sys.modules.get("cupy")
    sys.modules["cupy"] = types.SimpleNamespace(ElementwiseKernel=elementwise)
    try:
        names = cuda_kernels._kernels()
    finally:
        if saved is None:
            del sys.modules["cupy"]
        else:
            sys.modules["cupy"] = saved
        cuda_kernels._kernels.cache_clear()
    return {key: made[name] for key, name in names.items()}


@pytest.fixture(scope="module")
def host_kernel(bodies, tmp_path_factory):
    """``host_kernel(key)(*values)``: run kernel ``key`` for float32, compiled for the host, on
    its parameters in order (NumPy arrays, contiguous: raw ones indexed by hand, the others
    element by element; or scalars, by value)."""
    folder = tmp_path_factory.mktemp("kernels")

    def compiled(key, arrays):
        params, body = bodies[key]
        args, setup, per_element = ["long long n_"], [], []
        for (raw, ctype, name), array in zip(params, arrays):
            if not array:
                args.append(f"{ctype} {name}")
            elif raw:
                args.append(f"{ctype}* {name}_p")
                setup.append(f"Raw<{ctype}> {name}{{{name}_p}};")
            else:
                args.append(f"{ctype}* {name}_p")
                per_element.append(f"{ctype}& {name} = {name}_p[i];")
        source = (HEADER + f'extern "C" void {key}({", ".join(args)}) {{\n' + "\n".join(setup)
                  + "\nfor (long long i = 0; i < n_; i++) {\n" + "\n".join(per_element) + "\n" + body + "\n}\n}\n")
        stem = folder / (key + "_" + "".join("a" if a else "s" for a in arrays))  # one library a signature
        stem.with_suffix(".cpp").write_text(source)
        subprocess.run([CXX, "-O1", "-shared", "-fPIC", "-o", str(stem.with_suffix(".so")),
                        str(stem.with_suffix(".cpp"))], check=True)
        return getattr(ctypes.CDLL(str(stem.with_suffix(".so"))), key)

    built = {}

    def make(key):
        params, _ = bodies[key]

        def call(*values):
            arrays = tuple(isinstance(v, np.ndarray) for v in values)
            fn = built.get((key, arrays)) or built.setdefault((key, arrays), compiled(key, arrays))
            sizes = {v.size for (raw, _, _), v in zip(params, values) if isinstance(v, np.ndarray) and not raw}
            assert len(sizes) == 1, "no broadcasting here: the non-raw arrays are one size"
            count = sizes.pop()
            out = [ctypes.c_longlong(count)]
            for (_, ctype, _), v in zip(params, values, strict=True):
                if isinstance(v, np.ndarray):
                    assert v.flags.c_contiguous and (ctype != "T" or v.dtype == np.float32)
                    out.append(ctypes.c_void_p(v.ctypes.data))
                else:
                    out.append(SCALARS["float" if ctype == "T" else ctype](v))
            fn(*out)
        return call
    return make


def test_relu_writing_its_signs_in_its_pass_is_the_layers_forward_and_encode(host_kernel):
    n = 1003  # a ragged last byte
    layer, _ = build("ReLU", [(n,)], dtype=np.float32)
    x = np.resize(SPECIAL, n) * np.random.default_rng(0).uniform(0.5, 2, n).astype(np.float32)
    y = np.zeros_like(x)
    layer.forward(Context(), [x], [y], {})
    top, bits = x.copy(), np.zeros((n + 7) // 8, np.uint8)
    host_kernel("relu_bits")(top, n, top, bits)  # in place, as the forward runs it
    np.testing.assert_array_equal(bits, np.packbits(y > 0))
    np.testing.assert_array_equal(top, y)


def test_relu_backward_from_the_bits_routes_as_the_top_does(host_kernel):
    n = 1003
    rng = np.random.default_rng(1)
    y = np.maximum(rng.standard_normal(n), 0).astype(np.float32)
    dy, dx = rng.standard_normal(n).astype(np.float32), np.full(n, 7.0, np.float32)
    dy[::7] = np.nan  # a NaN gradient stays NaN where the unit was off too, as Caffe's product
    expected = np.empty_like(dy)
    _relu_backward(y, dy, expected, np.empty(n, bool))  # the CPU's
    for kernel, operand in (("relu_backward_bits", np.packbits(y > 0)), ("relu_backward", y)):
        host_kernel(kernel)(dy, operand, dx)
        assert np.array_equal(dx.view(np.uint32), expected.view(np.uint32)), kernel  # NaNs, -0.0 too


@pytest.mark.parametrize("kernel, stride, pad, side", POOLS)
def test_max_pooling_in_one_pass_is_the_layers_forward_and_argmax(host_kernel, kernel, stride, pad, side):
    _, x, y, argmax = max_pool_case(kernel, stride, pad, side)
    shape = y.shape
    window = (np.float32(-np.inf), side, side, shape[2], shape[3], kernel, kernel, stride, stride, pad, pad)
    top, written = np.zeros(shape, np.float32), np.zeros(shape, np.uint8)
    host_kernel("max_pool")(x.reshape(-1), *window, top)
    np.testing.assert_array_equal(top, y)  # (a tie of -0.0 and 0.0 may keep either)
    top[...] = 0
    host_kernel("max_pool_argmax")(x.reshape(-1), *window, top, written)
    np.testing.assert_array_equal(top, y)
    np.testing.assert_array_equal(written, argmax)
    assert (argmax == 255).any()  # a NaN window: no tap equals its maximum


SUMS = {"av": lambda a, b: a, "av * av": lambda a, b: a * a, "av * bv": lambda a, b: a * b}


def _channel_sums(a, b, expr1, expr2, ncl, words, splits):
    """cuda_kernels.channel_sums' contract in NumPy (float64 sums per channel into the tail of
    ``words``); test_gpu.py checks the CUDA one against this."""
    av = a.reshape(ncl).astype(np.float64)
    bv = av if b is None else b.reshape(ncl).astype(np.float64)
    out = words[2 * splits * ncl[1]:].reshape(2, ncl[1])
    for row, expr in enumerate((expr1, expr2)):
        out[row] = SUMS[expr](av, bv).sum(axis=(0, 2))
    return out


def _on_the_gpu(monkeypatch, host_kernel):
    """The layers' GPU branches taken from here on, on NumPy arrays with the kernels compiled
    for the host and NumPy's per-channel sums; the list of the kernels they call, in order."""
    called = []

    def kernel(name):
        called.append(name)
        return host_kernel(name)
    monkeypatch.setattr(cuda_kernels, "on_gpu", lambda xp: True)
    monkeypatch.setattr(cuda_kernels, "kernel", kernel)
    monkeypatch.setattr(cuda_kernels, "channel_sums", _channel_sums)
    return called


def _forward_backward(layer, params, bottoms, relu=False):
    """The layer's training forward (``relu``: with the ReLU after it in its pass) and backward
    on NumPy arrays: ``[tops, bottom gradients, parameter gradients, parameters after]``."""
    f, b = layer.algorithms("forward")[0], layer.algorithms("backward")[0]
    params = {k: v.copy() for k, v in params.items()}
    bottoms = [x.copy() for x in bottoms]
    tops = [np.zeros(s, layer.dtype) for s in layer.top_shapes]
    layer.forward(Context(workspace=np.zeros(max(f.workspace, 1), np.uint8), relu=relu), bottoms, tops, params)
    tg = [np.random.default_rng(2).standard_normal(s).astype(layer.dtype) for s in layer.top_shapes]
    bg = [np.zeros(s, layer.dtype) for s in layer.bottom_shapes]
    pg = {p.name: np.zeros(p.shape, layer.dtype) for p in layer.param_specs() if p.learnable}
    if not relu:
        layer.backward(Context(workspace=np.zeros(max(b.workspace, 1), np.uint8)), bottoms, tops, tg, bg, params, pg)
    return [*tops, *bg, *(pg[k] for k in sorted(pg)), *(params[k] for k in sorted(params))]


@pytest.mark.parametrize("type_name, shapes, cfg, relu", [
    ("BatchNorm", [(16, 8, 5, 5)], {}, False), ("BatchNorm", [(2, 256, 4, 4)], {}, False),
    ("Scale", [(16, 8, 5, 5)], dict(bias_term=True), False), ("Scale", [(16, 8, 5, 5)], {}, False),
    ("Scale", [(16, 8, 5, 5)], dict(bias_term=True), True), ("Scale", [(16, 8, 5, 5)], {}, True),
    ("ReLU", [(4, 8, 5, 5)], {}, False), ("Pooling", [(2, 3, 9, 9)], dict(pool="MAX", kernel_size=3, stride=2), False),
    ("Eltwise", [(4, 8, 5, 5)] * 2, {}, True)])
def test_the_layers_gpu_branches_compute_what_their_numpy_code_does(monkeypatch, host_kernel, type_name, shapes,
                                                                     cfg, relu):
    layer, params = build(type_name, shapes, dtype=np.float32, **cfg)
    bottoms = [np.random.default_rng(k).standard_normal(s).astype(np.float32) for k, s in enumerate(shapes)]
    numpy_ = _forward_backward(layer, params, bottoms, relu)
    called = _on_the_gpu(monkeypatch, host_kernel)
    gpu = _forward_backward(layer, params, bottoms, relu)
    assert called  # the GPU branch ran
    for a, b in zip(numpy_, gpu, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5 * max(np.abs(a).max(), 1))


@pytest.mark.parametrize("type_name, shape, cfg", [("ReLU", (4, 8, 5, 5), {}), ("ReLU", (1003,), {}),
                                                   ("Pooling", (2, 3, 10, 10), dict(pool="MAX", kernel_size=3,
                                                                                    stride=2))])
def test_the_gpu_branches_write_a_layers_own_form_as_its_numpy_code(monkeypatch, host_kernel, type_name, shape, cfg):
    """A ReLU's and a max pooling's forward given ``ctx.encoded``, through their GPU branches
    (one kernel each) and their NumPy code: the same top, the same form."""
    layer, _ = build(type_name, [shape], dtype=np.float32, **cfg)
    x = np.resize(SPECIAL, int(np.prod(shape))).reshape(shape) * np.float32(3)
    (enc,) = [e for e in layer.encodings() if e.direct]
    out = []
    for gpu in (False, True):
        if gpu:
            monkeypatch.setattr(cuda_kernels, "on_gpu", lambda xp: True)
            monkeypatch.setattr(cuda_kernels, "kernel", host_kernel)
        top, form = np.zeros(layer.top_shapes[0], np.float32), np.zeros(*enc.form)
        layer.forward(Context(workspace=np.zeros(enc.workspace, np.uint8), encoded=form), [x.copy()], [top], {})
        out.append((top, form))
    np.testing.assert_array_equal(out[1][0], out[0][0])
    np.testing.assert_array_equal(out[1][1], out[0][1])


@pytest.mark.parametrize("bias, relu", [(True, True), (True, False), (False, True), (False, False)])
def test_a_batchnorm_writing_its_scale_on_the_gpu_is_its_kernel_then_the_scales(monkeypatch, host_kernel, bias, relu):
    """BatchNorm's GPU branch with ``ctx.scale`` (one kernel, ``bn_normalize_scale[_bias]``,
    writing x_hat and the Scale's top) gives the bits of its own kernel and then the Scale's
    GPU branch (``scale[_bias][_relu]``), and what its NumPy code gives to float32 rounding."""
    from superneuron.layers.norm import ScaleAfter
    shape = (16, 8, 5, 5)
    bn, bn_params = build("BatchNorm", [shape], dtype=np.float32)
    scale, scale_params = build("Scale", [shape], dtype=np.float32, bias_term=bias)
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(np.float32)
    for k in scale_params:
        scale_params[k][...] = rng.standard_normal(scale_params[k].shape)
    room = bn.algorithms("forward")[0].workspace

    def run(fused):
        y, z = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        ctx = Context(workspace=np.zeros(room, np.uint8), relu=relu,
                      scale=ScaleAfter(scale, scale_params, z) if fused else None)
        bn.forward(ctx, [x], [y], {k: v.copy() for k, v in bn_params.items()})
        if not fused:
            scale.forward(Context(relu=relu), [y], [z], scale_params)
        return y, z
    host = run(True)
    called = _on_the_gpu(monkeypatch, host_kernel)
    fused = run(True)
    assert called[-1] == "bn_normalize_scale" + ("_bias" if bias else "")
    apart = run(False)
    for a, b, c in zip(fused, apart, host, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=0, atol=1e-5 * np.abs(c).max())
    assert (fused[1] == 0).any() == relu


@pytest.mark.parametrize("bias", [None, False, True])
def test_a_batchnorm_recomputed_on_the_gpu_is_one_kernel_with_the_forwards_bits(monkeypatch, host_kernel, bias):
    """BatchNorm's GPU branch recomputing (``ctx.recompute``): one kernel from the mean and
    invstd that its forward's ``bn_stats`` saved (no sums, no ``bn_stats``), writing the
    forward's x_hat (and the Scale's top, with ``ctx.scale``) bit for bit, the statistics kept."""
    from superneuron.layers.norm import ScaleAfter
    shape = (16, 8, 5, 5)
    bn, params = build("BatchNorm", [shape], dtype=np.float32)
    x = np.random.default_rng(9).standard_normal(shape).astype(np.float32)
    if bias is not None:
        scale, scale_params = build("Scale", [shape], dtype=np.float32, bias_term=bias)
    room = np.zeros(bn.algorithms("forward")[0].workspace, np.uint8)
    called = _on_the_gpu(monkeypatch, host_kernel)

    def run(recompute):
        y, z = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        after = None if bias is None else ScaleAfter(scale, scale_params, z)
        bn.forward(Context(workspace=room, recompute=recompute, scale=after, relu=True), [x], [y], params)
        return y, z
    first = run(False)
    assert called[0] == "bn_stats"
    kept = {k: v.copy() for k, v in params.items()}
    del called[:]
    monkeypatch.setattr(cuda_kernels, "channel_sums", None)  # a recomputation takes no sums
    again = run(True)
    assert called == ["bn_normalize" + ("" if bias is None else "_scale" + ("_bias" if bias else ""))]
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    for k in params:
        np.testing.assert_array_equal(params[k], kept[k])
