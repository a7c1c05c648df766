"""The GPU's elementwise kernels (layers/cuda_kernels.py) checked on the CPU: each body,
compiled as C++ by the host's compiler inside the loop that CuPy's ElementwiseKernel wraps it
in (an index ``i`` over the non-raw arrays, a reference to each one's element, raw arrays
indexed by hand), run on NumPy arrays and compared with the layers' NumPy code.

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
from superneuron.layers.base import Context

CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")

C_TYPES = {"T": "T", "float32": "float", "float64": "double", "int64": "long long", "int32": "int",
           "uint8": "unsigned char"}
SCALARS = {"float": ctypes.c_float, "double": ctypes.c_double, "long long": ctypes.c_longlong,
           "int": ctypes.c_int}
HEADER = """template <class U> struct Raw { U* p; U& operator[](long long k) const { return p[k]; } };
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
        (folder / f"{key}.cpp").write_text(source)
        subprocess.run([CXX, "-O1", "-shared", "-fPIC", "-o", str(folder / f"{key}.so"), str(folder / f"{key}.cpp")],
                       check=True)
        return getattr(ctypes.CDLL(str(folder / f"{key}.so")), key)

    def make(key):
        params, _ = bodies[key]

        def call(*values):
            fn = compiled(key, [isinstance(v, np.ndarray) for v in values])
            count = next(v.size for (raw, _, _), v in zip(params, values) if isinstance(v, np.ndarray) and not raw)
            out = [ctypes.c_longlong(count)]
            for (_, ctype, _), v in zip(params, values, strict=True):
                if isinstance(v, np.ndarray):
                    assert v.flags.c_contiguous and v.dtype != np.float64
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
    host_kernel("relu_backward_bits")(dy, np.packbits(y > 0), dx)
    np.testing.assert_array_equal(dx, np.where(y > 0, dy, np.float32(0)))


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
