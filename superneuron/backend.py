"""Backends: NumPy on the CPU, CuPy on the GPU, behind one small interface (``xp`` and copies).

Layers compute with ``backend.xp``; the runtime asks the backend for the arena's one block of
memory, for host↔device copies, and for seeded random numbers. CuPy is imported only when the
GPU is asked for, and any failure to import it (a broken CUDA install raises more than
ImportError) becomes a one-line error.
"""

import collections
import contextlib
from dataclasses import dataclass

import numpy as np

from .errors import SNError
from .layers.cudnn import probe


@dataclass
class Allocations:
    """What the array library allocated outside the arena while watched."""

    count: int = 0
    bytes: int = 0


class Backend:
    """The CPU backend; :class:`GPUBackend` overrides what differs."""

    name = "cpu"
    xp = np
    cuda = None   # the CUDA module of a GPU backend: its copies go on streams, not threads

    def __init__(self):
        self.syncs = collections.Counter()  # host_sync's reasons, each with how often
        self.draws = 0  # calls of uniform(): random numbers from a host seed (runtime/graphs.py)

    def host_sync(self, reason):
        """Say that the host is about to read a device value (``reason``: which, and why). On a
        GPU that waits for every kernel queued before it, and the host stops running ahead of
        the device. The CPU notes it too, where it would sync on a GPU, so that a test there
        can assert a training iteration has none before its end."""
        self.syncs[reason] += 1

    def host_value(self, value, reason):
        """``value`` (a device scalar, or a host number) as a Python float, noting the sync."""
        self.host_sync(reason)
        return float(value)

    def empty_bytes(self, nbytes):
        """One block of ``nbytes`` bytes (the arena)."""
        return np.empty(max(int(nbytes), 1), dtype=np.uint8)

    def host_bytes(self, nbytes):
        """One block of ``nbytes`` bytes of host memory for offloaded tensors."""
        return np.empty(max(int(nbytes), 1), dtype=np.uint8)

    def copy_from_host(self, dst, src):
        """Copy the host array ``src`` into ``dst`` (same shape; dtype converted)."""
        np.copyto(dst, src, casting="same_kind")

    def to_host(self, array):
        """A NumPy copy of ``array``."""
        self.host_sync("a copy to the host")
        return np.array(array)

    def uniform(self, seed, out):
        """Fill ``out`` with U[0, 1) numbers determined by ``seed`` alone."""
        self.draws += 1
        np.random.default_rng(seed).random(out=out, dtype=out.dtype)
        return out

    def synchronize(self):
        """Wait for queued device work (nothing to wait for on the CPU; noted as a host sync)."""
        self.host_sync("synchronize")

    def kernels(self):
        """Vendor kernels the layers may use here (None: the portable NumPy/CuPy ones)."""
        return None

    def device_model(self):
        """The name measured kernel timings are cached under (runtime/profile.py): ``cpu`` here;
        on a GPU its model and the engine filters in force, so that an H100's table never
        serves an H200, nor a deterministic run's an unfiltered one."""
        return self.name

    def convolutions(self):
        """One line saying which convolution kernels run here and, on a GPU without cuDNN,
        why they fell back (what sn-train prints at start)."""
        return "im2col + GEMM and direct loops in NumPy (CPU)"

    @contextlib.contextmanager
    def watch_allocations(self):
        """Yield an :class:`Allocations` counting device allocations made outside the arena
        meanwhile. On the CPU the device is host memory and NumPy's temporaries are not seen:
        it stays at zero."""
        yield Allocations()


class GPUBackend(Backend):
    """CuPy on the current CUDA device."""

    name = "gpu"

    def __init__(self, cupy):
        super().__init__()
        self.xp = cupy
        self.cuda = getattr(cupy, "cuda", None)  # its streams and events carry the runtime's copies (runtime/copies.py)
        self._kernels = False   # loaded on first use
        self.kernels_missing = None   # why cuDNN is not used, once kernels() has looked

    def kernels(self):
        """cuDNN through its Frontend where it imports (layers/cudnn.py), else None."""
        if self._kernels is False:
            self._kernels, self.kernels_missing = probe()
        return self._kernels

    def device_model(self):
        import re
        name = self.xp.cuda.runtime.getDeviceProperties(self.xp.cuda.Device().id)["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        kernels = self.kernels()
        modes = [m for m in ("tf32", "deterministic", "exact") if getattr(kernels, m, False)]
        return "-".join(["gpu", re.sub(r"[^A-Za-z0-9._]+", "_", name).strip("_")] + modes)

    def convolutions(self):
        kernels = self.kernels()
        if kernels is not None:
            return kernels.describe() + " (GPU)"
        return (f"im2col + GEMM in CuPy (GPU), the fallback: {self.kernels_missing}; install "
                f"superneuron[cuda12] or [cuda13] for cuDNN")

    def empty_bytes(self, nbytes):
        return self.xp.empty(max(int(nbytes), 1), dtype=self.xp.uint8)

    def host_bytes(self, nbytes):
        import cupyx  # pinned, so that copies are asynchronous
        return cupyx.empty_pinned(max(int(nbytes), 1), dtype=np.uint8)

    def copy_from_host(self, dst, src):
        if isinstance(dst, np.ndarray):  # a host-resident tensor (parameter offload)
            np.copyto(dst, src, casting="same_kind")
            return
        if isinstance(src, self.xp.ndarray):  # already on the device (a benchmark's batch)
            self.xp.copyto(dst, src.astype(dst.dtype, copy=False))
            return
        dst.set(np.ascontiguousarray(src, dtype=dst.dtype).reshape(dst.shape))

    @contextlib.contextmanager
    def watch_allocations(self):
        """Route CuPy's allocator through a counter: every allocation CuPy makes meanwhile
        (a kernel's temporary, a reduction's scratch) is one the arena does not own."""
        cuda = self.xp.cuda
        inner = cuda.get_allocator()
        seen = Allocations()

        def counted(nbytes):
            seen.count += 1
            seen.bytes += nbytes
            return inner(nbytes)
        cuda.set_allocator(counted)
        try:
            yield seen
        finally:
            cuda.set_allocator(inner)

    def to_host(self, array):
        self.host_sync("a copy to the host")
        return self.xp.asnumpy(array)

    def uniform(self, seed, out):
        self.draws += 1
        gen = self.xp.random.default_rng(seed)
        out[...] = gen.random(out.shape, dtype=out.dtype)
        return out

    def synchronize(self):
        self.host_sync("synchronize")
        self.xp.cuda.Device().synchronize()  # every stream: the copy streams too


def address(array):
    """The address of ``array``'s first byte: a CuPy array's device pointer, a NumPy (pinned)
    array's host pointer."""
    data = getattr(array, "data", None)
    ptr = getattr(data, "ptr", None)
    return int(ptr) if ptr is not None else int(array.ctypes.data)


def gpu_available():
    """``(True, None)`` when CuPy imports and sees a CUDA device, else ``(False, why)``."""
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - any failure means "no usable GPU"
        return False, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip(": ")
    if count < 1:
        return False, "no CUDA device found"
    return True, None


def get_backend(device="cpu"):
    """The backend for ``--device cpu|gpu``; SNError (one line) when the GPU cannot be used."""
    if device == "cpu":
        return Backend()
    if device == "gpu":
        ok, why = gpu_available()
        if not ok:
            raise SNError(f"--device gpu: no usable GPU ({why}); install CuPy with "
                          f"pip install 'superneuron[cuda12]' or '[cuda13]', or use --device cpu")
        import cupy
        return GPUBackend(cupy)
    raise SNError(f"unknown device '{device}'; use cpu or gpu")


def planning_kernels(device):
    """The vendor kernels a plan for ``device`` should offer (cuDNN's convolutions when
    ``device`` is ``'gpu'`` and a GPU is usable here), so that it plans what a run there
    executes; None otherwise (the portable kernels' algorithms)."""
    if device == "gpu" and gpu_available()[0]:
        return get_backend("gpu").kernels()
    return None



# What the arena leaves free on a GPU when ``--policy auto`` sizes it without ``--memory``: the
# libraries allocate beside it after it is made (cuBLAS's handle and its workspace, 32 MiB per
# stream on Hopper; cuDNN's handle; CuPy's compiled kernels and its few scalars; NCCL's buffers,
# a few hundred MiB under data parallelism), so the arena takes what is free less the larger of
# 1 GiB and 5 % of it.
LIBRARY_RESERVE_BYTES = 1 << 30
LIBRARY_RESERVE_SHARE = 0.05


def library_reserve(free):
    """The bytes of ``free`` device memory left to the libraries' handles and buffers."""
    return min(free, max(LIBRARY_RESERVE_BYTES, int(free * LIBRARY_RESERVE_SHARE)))


def free_device_bytes(device):
    """The device memory ``--policy auto`` fits by default on ``device`` (bytes): what is free
    now on a GPU less :func:`library_reserve`; None on the CPU (no device memory apart from the
    host's) or where it cannot be told."""
    if device != "gpu" or not gpu_available()[0]:
        return None
    import cupy
    free = int(cupy.cuda.runtime.memGetInfo()[0])
    return free - library_reserve(free)
