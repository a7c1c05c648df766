"""Fused CuPy kernels for the per-channel layers (BatchNorm, Scale, ReLU) on the GPU.

Written as array expressions, a BatchNorm is a dozen kernels and as many temporaries of the
feature map's size, each a trip through device memory and an allocation outside the arena.
Here each pass over the data is one kernel that allocates nothing: a per-channel reduction
that takes two sums at once (:func:`channel_sums`), and elementwise kernels that read the
per-channel factors by the element's channel. The layers call these where ``xp`` is CuPy and
keep their NumPy code as the one definition of the math (tests hold the two together).

Arrays are contiguous ``(N, C, L)`` views; sums accumulate in double precision, so the result
does not depend on how the work is split between blocks.
"""

import functools

import numpy as np

BLOCK = 256
TARGET_BLOCKS = 528  # about four blocks per multiprocessor on an H100 (132)

_SUMS = r"""
extern "C" __global__ void channel_sums(const T* a, const T* b, double* part,
                                        int n_samples, int channels, long long length, int splits) {
    // block (c, s) sums EXPR1 and EXPR2 over samples s, s + splits, ... of channel c
    int c = blockIdx.x, s = blockIdx.y;
    double s1 = 0.0, s2 = 0.0;
    for (int n = s; n < n_samples; n += splits) {
        long long base = ((long long)n * channels + c) * length;
        for (long long l = threadIdx.x; l < length; l += blockDim.x) {
            double av = (double)a[base + l], bv = (double)b[base + l];
            s1 += EXPR1;
            s2 += EXPR2;
        }
    }
    __shared__ double sh1[BLOCK], sh2[BLOCK];
    sh1[threadIdx.x] = s1;
    sh2[threadIdx.x] = s2;
    __syncthreads();
    for (int w = BLOCK / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) {
            sh1[threadIdx.x] += sh1[threadIdx.x + w];
            sh2[threadIdx.x] += sh2[threadIdx.x + w];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        part[(long long)s * channels + c] = sh1[0];
        part[(long long)(splits + s) * channels + c] = sh2[0];
    }
}
"""


def on_gpu(xp):
    """Whether ``xp`` is CuPy (these kernels apply)."""
    return xp is not np


@functools.lru_cache(maxsize=None)
def _sums_kernel(dtype, expr1, expr2):
    import cupy
    ctype = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}[np.dtype(dtype)]
    code = (_SUMS.replace("EXPR1", expr1).replace("EXPR2", expr2)
            .replace("BLOCK", str(BLOCK)).replace("const T*", f"const {ctype}*"))
    return cupy.RawKernel(code, "channel_sums")


def sums_bytes(ncl):
    """The scratch bytes :func:`channel_sums` takes at most for (N, C, L) arrays: with them,
    :func:`splits_for` gives as many splits as any larger scratch would."""
    n, c, _ = ncl
    return 16 * c * (min(n, -(-TARGET_BLOCKS // c)) + 1)


def splits_for(ncl, room_bytes):
    """How many blocks share a channel in :func:`channel_sums`, given ``room_bytes`` of scratch
    (the partial sums take 16 bytes per channel per split, the result 16 per channel): 0 where
    the scratch is too small, and the caller uses its array code."""
    n, c, _ = ncl
    fit = room_bytes // (16 * c) - 1
    return max(0, min(n, -(-TARGET_BLOCKS // c), fit))


def channel_sums(a, b, expr1, expr2, ncl, words, splits):
    """Per channel, the sums of ``expr1`` and ``expr2`` over axes 0 and 2 of (N, C, L) arrays,
    into the (2, C) float64 tail of ``words`` (a float64 scratch of ``2 * (splits + 1) * C``;
    the rest holds the blocks' partial sums). In the expressions ``av`` and ``bv`` are the
    elements of ``a`` and ``b`` (None: unused)."""
    import cupy
    n, c, l = ncl
    part, out = words[:2 * splits * c], words[2 * splits * c:].reshape(2, c)
    _sums_kernel(a.dtype, expr1, expr2)(
        (c, splits), (BLOCK,),
        (a, a if b is None else b, part, np.int32(n), np.int32(c), np.int64(l), np.int32(splits)))
    cupy.sum(part.reshape(2, splits, c), axis=1, out=out)
    return out


# Max pooling's window (NCHW, contiguous): the input's and output's sizes, the kernel, stride
# and padding; each output (n, c, oh, ow) finds its window's maximum ``m`` (from ``lowest``,
# -inf).
_WINDOW = ("T lowest, int64 h, int64 w, int64 ho, int64 wo, int32 kh, int32 kw, int32 sh, int32 sw, int32 ph, "
           "int32 pw")
_MAX_OF_WINDOW = """long long ow = i % wo, oh = (i / wo) % ho, plane = (i / (wo * ho)) * h * w;
    T m = lowest;  // -inf
    for (int a = 0; a < kh; a++) {
        long long r = oh * sh - ph + a;
        if (r < 0 || r >= h) continue;
        for (int b = 0; b < kw; b++) {
            long long c = ow * sw - pw + b;
            if (c < 0 || c >= w) continue;
            T v = x[plane + r * w + c];
            if (v > m || v != v) m = v;  // a NaN, once seen, stays: nothing compares above it
        }
    }
"""


@functools.lru_cache(maxsize=None)
def _kernels():
    import cupy
    idx = "long long c = (i / length) % channels;"
    return {
        # per channel: the mean (kept for a recomputation) and invstd from the sums of x and x^2
        # (double), and the running statistics (unbiased variance) updated
        "bn_stats": cupy.ElementwiseKernel(
            "raw float64 sums, float64 count, float64 eps, float64 f, int64 channels",
            "T saved_mean, T invstd, T running_mean, T running_var",
            """double mean = sums[i] / count;
               double var = sums[channels + i] / count - mean * mean;
               if (var < 0.0) var = 0.0;
               saved_mean = (T)mean;
               invstd = (T)(1.0 / sqrt(var + eps));
               running_mean = (T)(f * (double)running_mean + mean);
               running_var = (T)(f * (double)running_var + var * (count / (count > 1.0 ? count - 1.0 : 1.0)));""",
            "sn_bn_stats"),
        # y = (x - mean[c]) * invstd[c]   (y may be x): the forward's and a recomputation's
        "bn_normalize": cupy.ElementwiseKernel(
            "T x, raw T mean, raw T invstd, int64 length, int64 channels",
            "T y", idx + "y = (x - mean[c]) * invstd[c];", "sn_bn_normalize"),
        # the same, and z = h * w[c] (+ b[c]) from the normalised h in hand, then max(z, 0) where
        # ``relu``: a BatchNorm with the Scale after it in one pass (its own kernel's arithmetic,
        # a ReLU as "relu" below; y may be x)
        "bn_normalize_scale": cupy.ElementwiseKernel(
            "T x, raw T mean, raw T invstd, raw T w, int64 length, int64 channels, int32 relu", "T y, T z",
            idx + "T h = (x - mean[c]) * invstd[c]; y = h;"
                  " T s = h * w[c]; z = relu && s < (T)0 ? (T)0 : s;", "sn_bn_normalize_scale"),
        "bn_normalize_scale_bias": cupy.ElementwiseKernel(
            "T x, raw T mean, raw T invstd, raw T w, raw T b, int64 length, int64 channels, int32 relu",
            "T y, T z",
            idx + "T h = (x - mean[c]) * invstd[c]; y = h;"
                  " T s = h * w[c] + b[c]; z = relu && s < (T)0 ? (T)0 : s;", "sn_bn_normalize_scale_bias"),
        # dx = (dy - mean(dy)[c] - x_hat * mean(dy x_hat)[c]) * invstd[c]   (dx may be dy)
        "bn_backward": cupy.ElementwiseKernel(
            "T dy, T x_hat, raw float64 sums, raw T invstd, float64 count, int64 length, "
            "int64 channels", "T dx",
            idx + "dx = (dy - x_hat * (T)(sums[channels + c] / count) - (T)(sums[c] / count))"
                  " * invstd[c];", "sn_bn_backward"),
        # y = x * w[c] (+ b[c])
        "scale": cupy.ElementwiseKernel(
            "T x, raw T w, int64 length, int64 channels", "T y", idx + "y = x * w[c];", "sn_scale"),
        "scale_bias": cupy.ElementwiseKernel(
            "T x, raw T w, raw T b, int64 length, int64 channels", "T y",
            idx + "y = x * w[c] + b[c];", "sn_scale_bias"),
        # the same, then a ReLU (as "relu" below) in the same pass: a Recompute with a fused ReLU
        "scale_relu": cupy.ElementwiseKernel(
            "T x, raw T w, int64 length, int64 channels", "T y",
            idx + "T z = x * w[c]; y = z < (T)0 ? (T)0 : z;", "sn_scale_relu"),
        "scale_bias_relu": cupy.ElementwiseKernel(
            "T x, raw T w, raw T b, int64 length, int64 channels", "T y",
            idx + "T z = x * w[c] + b[c]; y = z < (T)0 ? (T)0 : z;", "sn_scale_bias_relu"),
        # y = max(a + b, 0): Eltwise's sum with the ReLU after it
        "add_relu": cupy.ElementwiseKernel(
            "T a, T b", "T y", "T z = a + b; y = z < (T)0 ? (T)0 : z;", "sn_add_relu"),
        # y = max(x, 0), NaN kept; in place without the copy CuPy's maximum makes then
        "relu": cupy.ElementwiseKernel("T x", "T y", "y = x < (T)0 ? (T)0 : x;", "sn_relu"),
        # dx = dy where the unit was active, else 0, as a product (Caffe's; the CPU's): a NaN dy
        # stays NaN, a negative one gives -0.0
        "relu_backward": cupy.ElementwiseKernel(
            "T dy, T y", "T dx", "dx = dy * (T)(y > (T)0);", "sn_relu_backward"),
        # the same from ReLU's direct sign form: bit i (high bit first, as numpy.packbits)
        "relu_backward_bits": cupy.ElementwiseKernel(
            "T dy, raw uint8 bits", "T dx", "dx = dy * (T)((bits[i >> 3] >> (7 - (i & 7))) & 1);",
            "sn_relu_backward_bits"),
        # "relu" writing that form in the same pass: byte i of the bits from values 8i..8i+7
        # (flat x and y, ``size`` values; y may be x)
        "relu_bits": cupy.ElementwiseKernel(
            "raw T x, int64 size", "raw T y, uint8 bits",
            """unsigned char b = 0;
               for (int j = 0; j < 8; j++) {
                   long long k = (long long)i * 8 + j;
                   if (k < size) {
                       T v = x[k];
                       T r = v < (T)0 ? (T)0 : v;
                       y[k] = r;
                       if (r > (T)0) b |= (unsigned char)(0x80 >> j);
                   }
               }
               bits = b;""", "sn_relu_bits"),
        # max pooling, one output a thread: the window's maximum from -inf, NaN kept (as
        # ``maximum`` taken tap by tap), over the taps that see the image
        "max_pool": cupy.ElementwiseKernel(
            "raw T x, " + _WINDOW, "T top", _MAX_OF_WINDOW + "top = m;", "sn_max_pool"),
        # the same, and the argmax form (layers/pool.py): the scan-order index of the first tap
        # equal to the maximum, 255 where none is (a NaN window)
        "max_pool_argmax": cupy.ElementwiseKernel(
            "raw T x, " + _WINDOW, "T top, uint8 argmax",
            _MAX_OF_WINDOW + """top = m;
               unsigned char arg = 255;
               for (int a = 0; a < kh && arg == 255; a++) {
                   long long r = oh * sh - ph + a;
                   if (r < 0 || r >= h) continue;
                   for (int b = 0; b < kw; b++) {
                       long long c = ow * sw - pw + b;
                       if (c >= 0 && c < w && x[plane + r * w + c] == m) { arg = a * kw + b; break; }
                   }
               }
               argmax = arg;""", "sn_max_pool_argmax"),
    }


def kernel(name):
    """The fused elementwise kernel ``name`` (see the table in :func:`_kernels`)."""
    return _kernels()[name]
