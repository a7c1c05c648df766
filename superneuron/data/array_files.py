"""Sample arrays from files: ``.npz`` archives (their headers checked against the bytes they
hold before anything is read, values checked finite) and CIFAR-10's python batches (unpickled
with an allow-list of NumPy's exact names), and the check that data fits this machine's memory
before it is made. :mod:`superneuron.data.sources` opens its sources through these.
"""

import math
import os
import pickle
import zipfile
import zlib

import numpy as np

from ..errors import SNError
from ..limits import host_memory_bytes
from ..sizes import human_bytes
from .dataset import one_line


def check_memory(src, nbytes, what):
    """SNError when data of ``nbytes`` cannot be held in this machine's memory (checked before it
    is made: NumPy would raise MemoryError, or the system kill the process)."""
    total = host_memory_bytes()
    if total is not None and nbytes > total:
        raise SNError(f"{src}: {what} would take {human_bytes(nbytes)}, more than this machine's "
                      f"{human_bytes(total)} of memory")


def _sample_shape(path, shape, key="x"):
    """(C, H, W) for an array of ``shape`` (3-D arrays get one channel); SNError otherwise."""
    if len(shape) == 3:
        return (1,) + tuple(shape[1:])
    if len(shape) == 4:
        return tuple(shape[1:])
    raise SNError(f"{path}: '{key}' has shape {tuple(shape)}; expected (N, C, H, W) or (N, H, W)")


def _labels(path, y, n, key="y"):
    """``y`` checked to be ``n`` non-negative integers; returned as int64."""
    if y.ndim != 1 or len(y) != n:
        raise SNError(f"{path}: '{key}' has shape {y.shape}; expected ({n},), one label per sample")
    if not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating)) \
            or not np.all(np.isfinite(y)) or np.any(y != np.round(y)) or np.any(y < 0):
        raise SNError(f"{path}: '{key}' must hold non-negative integer class labels")
    return y.astype(np.int64)


def _npz_read(path, keys, headers=()):
    """Arrays ``keys`` (those present) and the shapes of ``headers`` read from their .npy headers.
    Every header is checked before any array is loaded: what it claims must be what its member
    holds (a crafted header could otherwise ask for terabytes) and fit in memory."""
    try:
        arrays, shapes = {}, {}
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            for key in set(headers) | set(keys):
                if key + ".npy" in names:
                    shape, dtype, header_bytes = _npy_header(z, key + ".npy")
                    nbytes = math.prod(shape) * dtype.itemsize
                    held = z.getinfo(key + ".npy").file_size - header_bytes
                    if dtype.hasobject or nbytes != held:
                        raise SNError(f"{path}: damaged .npz: the header of '{key}' says {shape} {dtype} "
                                      f"({nbytes} bytes), but the file holds {max(held, 0)} bytes")
                    if key in keys:
                        check_memory(path, nbytes, f"'{key}'")
                    shapes[key] = shape
        with np.load(path, allow_pickle=False) as f:
            for key in keys:
                if key in f.files:
                    arrays[key] = f[key]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError, zlib.error, MemoryError) as e:
        raise SNError(f"{path}: not a readable .npz file ({one_line(e)})") from None
    members = [n[:-4] for n in names]
    for need in ("x", "y"):
        if need not in members:
            raise SNError(f"{path}: no array '{need}' (it has {', '.join(members) or 'none'}); "
                          "expected x (N, C, H, W) or (N, H, W), y (N,) and optionally x_test, y_test")
    if ("x_test" in members) != ("y_test" in members):
        raise SNError(f"{path}: has one of x_test and y_test without the other")
    return arrays, shapes


def _npy_header(z, name):
    """``(shape, dtype, bytes before the data)`` of the .npy member ``name`` of zip ``z``."""
    with z.open(name) as f:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0), (3, 0)):
            raise ValueError(f"'{name}': .npy version {version}")
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(f)
        return shape, dtype, f.tell()


def npz_describe(path):
    arrays, shapes = _npz_read(path, ("y", "y_test"), ("x", "x_test"))
    shape = _sample_shape(path, shapes["x"])
    classes = _labels(path, arrays["y"], shapes["x"][0]).max(initial=-1)
    if "x_test" in shapes:
        if _sample_shape(path, shapes["x_test"], "x_test") != shape:
            raise SNError(f"{path}: x_test samples {shapes['x_test'][1:]} differ from x samples {shape}")
        classes = max(classes, _labels(path, arrays["y_test"], shapes["x_test"][0], "y_test").max(initial=-1))
    return shape, int(classes) + 1


def read_npz(path):
    a, _ = _npz_read(path, ("x", "y", "x_test", "y_test"))
    out = []
    for xk, yk in (("x", "y"), ("x_test", "y_test")):
        if xk not in a:
            out += [None, None]
            continue
        x = a[xk]
        if x.dtype.kind not in "biuf":
            raise SNError(f"{path}: '{xk}' has dtype {x.dtype}; expected numbers")
        shape = _sample_shape(path, x.shape, xk)
        _check_finite(path, x, xk)
        out += [x.reshape((len(x),) + shape), _labels(path, a[yk], len(x), yk)]
    if out[2] is not None and out[2].shape[1:] != out[0].shape[1:]:
        raise SNError(f"{path}: x_test samples {out[2].shape[1:]} differ from x samples {out[0].shape[1:]}")
    return out


def _check_finite(path, x, key):
    """SNError naming the first sample of ``x`` that holds a NaN or an infinity (checked a slice
    at a time, so no mask as large as the data is made)."""
    if x.dtype.kind not in "fc" or not len(x):
        return
    step = max(1, (1 << 22) // max(1, x[0].size))
    for start in range(0, len(x), step):
        ok = np.isfinite(x[start:start + step].reshape(min(step, len(x) - start), -1)).all(axis=1)
        if not ok.all():
            raise SNError(f"{path}: '{key}' sample {start + int(np.argmin(ok))} (of {len(x)}) holds a NaN "
                          "or an infinity; data must be finite")


# The only globals a CIFAR-10 python batch names: an ndarray rebuilt by NumPy's own reducer
# (numpy.core.multiarray._reconstruct in CIFAR's files, numpy._core... from NumPy 2; pickle
# protocol 5 uses numeric._frombuffer), ndarray and dtype, and a numeric scalar (labels kept as
# NumPy integers by a batch written today), through a guard. Each is taken from NumPy as it is
# loaded here, so no module a file names is ever imported.
_RECONSTRUCT = np.zeros(1).__reduce__()[0]
_FROMBUFFER = np.zeros(1).__reduce_ex__(5)[0]
_SCALAR = np.int64(0).__reduce__()[0]
_NUMERIC_KINDS = "biufc"  # bool, signed and unsigned integers, floats, complex


def _numeric_scalar(dtype, data=None, *rest):
    """NumPy's scalar reconstruction (``numpy._core.multiarray.scalar``: labels that today's
    NumPy writes as ``np.int64``), for a plain numeric dtype and exactly its bytes only: an
    object scalar hands back any object it is given (NumPy 1), a structured one fields."""
    if not (isinstance(dtype, np.dtype) and dtype.kind in _NUMERIC_KINDS and dtype.names is None
            and dtype.subdtype is None and isinstance(data, bytes) and len(data) == dtype.itemsize
            and not rest):
        what = f"dtype {dtype}" if isinstance(dtype, np.dtype) else f"a {type(dtype).__name__}"
        raise pickle.UnpicklingError(f"refusing to load a NumPy scalar of {what} (a CIFAR-10 batch holds "
                                     "plain numeric ones only)")
    return _SCALAR(dtype, data)


_PICKLE_GLOBALS = {
    ("numpy.core.multiarray", "scalar"): _numeric_scalar,
    ("numpy._core.multiarray", "scalar"): _numeric_scalar,
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy.core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy._core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Loads dicts, lists, bytes and NumPy arrays only: a data file cannot run code or import
    anything."""

    def find_class(self, module, name):
        found = _PICKLE_GLOBALS.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} (a CIFAR-10 batch names only "
                                         "NumPy's array globals)")
        return found


def _cifar_batch(path):
    if os.path.exists(path) and not os.path.isfile(path):  # a FIFO would block the reader for ever
        raise SNError(f"{path}: not a regular file (a CIFAR-10 batch is a file)")
    if not os.path.isfile(path):
        raise SNError(f"{path}: missing (a CIFAR-10 python directory has data_batch_1..5 and test_batch)")
    try:
        with open(path, "rb") as f:
            d = _NumpyOnlyUnpickler(f, encoding="bytes").load()
        data = np.asarray(d.get(b"data", d.get("data")))
        labels = np.asarray(d.get(b"labels", d.get("labels")))
    except Exception as e:  # unpickling a damaged file can raise almost anything
        raise SNError(f"{path}: not a CIFAR-10 python batch ({one_line(e)})") from None
    if data.ndim != 2 or data.shape[1] != 3072 or data.dtype != np.uint8:
        raise SNError(f"{path}: b'data' has shape {data.shape} and dtype {data.dtype}; "
                      "expected (N, 3072) uint8")
    return data.reshape(-1, 3, 32, 32), _labels(path, labels, len(data), "labels")


def read_cifar(root):
    names = sorted((n for n in os.listdir(root) if n.startswith("data_batch_") and n[11:].isdigit()),
                   key=lambda n: int(n[11:]))
    parts = [_cifar_batch(os.path.join(root, n)) for n in names]
    x_test, y_test = _cifar_batch(os.path.join(root, "test_batch"))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), x_test, y_test
