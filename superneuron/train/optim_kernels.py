"""SGD's update of every parameter in one GPU kernel (a multi-tensor update, as PyTorch's
``foreach``/``fused`` optimisers): instead of five or six CuPy launches per parameter, one
launch covers the parameters of an Update step, each element finding its tensor in a table
of device pointers. The arena's resident tensors never move, so the table of an Update step
is built once and kept (keyed by the pointers), and its copy to the device is made once.

The arithmetic is the per-parameter path's, operation for operation, each rounded to float32
(``__fmul_rn``/``__fadd_rn``: no fused multiply-adds), so the results are the same bits:
``g += decay * w``; ``v = v * mu + g`` (Nesterov: ``g += mu * v``, the step is ``g``, else
``v``); ``g = step * lr``; ``w -= g``. Plain, momentum and Nesterov SGD with L2 (or no)
weight decay on float32; anything else takes the per-parameter path.

It reads a device flag ``ok`` (the losses were finite, computed on the device by the
Runtime) and leaves everything as it was where it is false: the guard against a non-finite
loss without reading the loss back.

The element's code (``ELEMENT``) is shared with the host: tests/test_optim_kernels.py compiles
it as C++ and checks it against the NumPy path bit for bit.
"""

import numpy as np

from ..backend import address

ELEMENT = r"""
__device__ inline void sgd_element(float* W, float* G, float* V, long long i, float lr, float decay,
                                   float mu, int mode, bool ok) {
    if (!ok) return;  // a loss was not finite: the parameters stay as they were
    float g = G[i];
    if (decay != 0.0f) g = __fadd_rn(g, __fmul_rn(W[i], decay));
    float step = g;
    if (mode >= 1) {
        float v = __fadd_rn(__fmul_rn(V[i], mu), g);
        V[i] = v;
        step = v;
        if (mode == 2) { g = __fadd_rn(g, __fmul_rn(v, mu)); step = g; }
    }
    float s = __fmul_rn(step, lr);
    G[i] = s;
    W[i] = __fsub_rn(W[i], s);
}

__device__ inline long long tensor_of(const long long* starts, long long count, long long k) {
    long long lo = 0, hi = count - 1;  // the last tensor whose start is <= k
    while (lo < hi) {
        long long mid = (lo + hi + 1) / 2;
        if (starts[mid] <= k) lo = mid; else hi = mid - 1;
    }
    return lo;
}
"""

KERNEL = ELEMENT + r"""
extern "C" __global__ void sgd_multi(const long long* w, const long long* g, const long long* v,
                                     const long long* starts, long long count, long long total,
                                     const float* lr, const float* decay, float mu, int mode,
                                     const bool* ok) {
    bool go = ok[0];
    for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < total;
         k += (long long)gridDim.x * blockDim.x) {
        long long t = tensor_of(starts, count, k);
        sgd_element((float*)w[t], (float*)g[t], mode ? (float*)v[t] : (float*)0, k - starts[t],
                    lr[t], decay[t], mu, mode, go);
    }
}
"""

MODES = {"SGD": 1, "Nesterov": 2}  # 0: no momentum


def mode_of(cfg):
    """The kernel's mode for SolverConfig ``cfg`` (0 plain, 1 momentum, 2 Nesterov), or None
    where it does not apply (another solver, L1 decay)."""
    if cfg.type not in MODES or (cfg.weight_decay and cfg.regularization_type == "L1"):
        return None
    return MODES[cfg.type] if cfg.momentum else (0 if cfg.type == "SGD" else None)


def table(entries, lr, weight_decay, address):
    """The kernel's host-side table of ``entries`` ``(w, g, [v], lr_mult, decay_mult)``: the
    pointers of w, g and v (int64), the start of each tensor in the flat index (int64), and
    each tensor's learning rate and decay (float32, rounded as the NumPy path rounds a Python
    float against a float32 array)."""
    w = np.array([address(e[0]) for e in entries], np.int64)
    g = np.array([address(e[1]) for e in entries], np.int64)
    v = np.array([address(e[2][0]) if e[2] else 0 for e in entries], np.int64)
    sizes = np.array([e[0].size for e in entries], np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    lrs = rates([e[3] for e in entries], lr)
    decays = np.array([weight_decay * e[4] for e in entries], np.float64).astype(np.float32)
    return w, g, v, starts, int(sizes.sum()), lrs, decays


def rates(lr_mults, lr):
    """Each tensor's learning rate ``lr * lr_mult`` (float32, rounded as the NumPy path rounds a
    Python float against a float32 array)."""
    return np.array([lr * m for m in lr_mults], np.float64).astype(np.float32)


class FusedSGD:
    """The kernel on CuPy ``cupy``, with the device tables of the Update steps seen so far.

    A table's learning rates live on the device and are written again where the rate has
    changed since (:meth:`refresh`, or an update at a new rate), so that a captured CUDA graph of
    the update (runtime/graphs.py), which replays the kernel on the same tables, runs each
    iteration at that iteration's rate once :meth:`refresh` has written it before the launch."""

    def __init__(self, cupy):
        self.cupy = cupy
        self.kernel = cupy.RawKernel(KERNEL, "sgd_multi", options=("--fmad=false",))
        # a table's rates from its multipliers on the device, rounded as :func:`rates` rounds
        # them: no copy from the host when the rate changes (every iteration under poly or inv)
        self.rate_kernel = cupy.ElementwiseKernel("float64 m, float64 lr", "float32 y",
                                                  "y = (float)(m * lr);", "sn_sgd_rates")
        self.tables = {}  # (pointers, decay, multipliers) → [device arrays, the lr written, the lr_mults
        #                   (float64, on the device)]
        self.always = cupy.ones((), dtype=bool)

    def refresh(self, lr):
        """Write ``lr``'s per-tensor rates into every table whose rates are another's."""
        for t in self.tables.values():
            self._write_rates(t, lr)

    def _write_rates(self, t, lr):
        arrays, written, mults = t
        if written != lr:  # (outside a capture: a kernel, no copy from the host)
            self.rate_kernel(mults, lr, arrays[5])
            t[1] = lr

    def update(self, entries, lr, weight_decay, mu, mode, ok=None):
        """One launch updating every entry (float32, contiguous); none where the device flag
        ``ok`` (a 0-d bool array) is false."""
        cp = self.cupy
        key = (tuple((address(e[0]), address(e[1]), address(e[2][0]) if e[2] else 0) for e in entries),
               weight_decay, tuple((e[3], e[4]) for e in entries))
        if key not in self.tables:
            if len(self.tables) > 4096:  # a schedule has a few hundred Update steps at most
                self.tables.clear()
            w, g, v, starts, total, lrs, decays = table(entries, lr, weight_decay, address)
            arrays = [cp.asarray(a) for a in (w, g, v, starts)] + [total, cp.asarray(lrs), cp.asarray(decays)]
            self.tables[key] = [arrays, lr, cp.asarray(np.array([e[3] for e in entries], np.float64))]
        t = self.tables[key]
        self._write_rates(t, lr)
        (w, g, v, starts, total, lrs, decays), count = t[0], len(entries)
        threads = 256
        blocks = max(1, min(4096, -(-total // threads)))
        self.kernel((blocks,), (threads,), (w, g, v, starts, np.int64(count), np.int64(total), lrs, decays,
                                            np.float32(mu), np.int32(mode),
                                            self.always if ok is None else ok))
