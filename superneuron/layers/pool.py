"""Pooling (Caffe's ``Pooling``): MAX or AVE over windows, with Caffe's rounding of the output size.

The window takes Convolution's keys (``kernel_size`` or ``kernel_h``/``kernel_w``, and the same
for ``stride`` and ``pad``). The output size rounds up, as Caffe's does:
``Ho = ceil((H + 2p - k) / s) + 1``, less one if the last window would start at or beyond
``H + p`` (it would see only padding); ``ceil_mode: false`` (an extension found in some Caffe
forks) rounds down as convolution does. Both kinds loop over the kernel taps (i, j) like the
convolution's direct algorithm, each tap one strided view of the input against the outputs
whose window sees the image there (see :func:`~superneuron.layers.windows.window_taps`):

- MAX ignores padding; its backward sends each output's gradient to the first maximum of its
  window in scan order (as PyTorch does with ties), finding it again from the bottom and top.
- With ``argmax`` (an encoded form, Gist's), the backward reads instead the index of each
  window's first maximum, one byte per output, found by the same scan and written by the
  forward (``ctx.encoded``) or an Encode step, and routes the gradient by it: the same adds in
  the same order, so the same bits. On a GPU a max pooling's forward is one kernel, an output
  a thread, that writes the argmax form in the same pass (layers/cuda_kernels.py).
- AVE divides by the window's size clipped to the padded extent, ``H + p`` (Caffe's
  ``pool_size``, computed before clipping the window to the image); its backward reads
  nothing but the top gradient.

Where the windows tile the image (kernel = stride, no padding, the size a multiple of the
kernel: LeNet's and VGG's 2x2s) each pixel lies in exactly one window, so the backward writes
each tap's gradient straight into its pixels of dx, without zeroing dx first or adding.

The backward's temporaries (a max pooling's first-max flags and windows still to route, the
routed or divided gradient) take the batch's maps at once under ``default``, a few samples'
under ``chunked`` (:attr:`Pooling.CHUNK_BYTES` of gradient): every window lies within one
sample, so both compute the same bits. The workspace pass takes ``chunked`` where the
default's room does not fit (GoogLeNet's ``inception_3b_pool`` at batch 32: 68 MiB, 10 MiB).
"""

import functools

import numpy as np

from . import cuda_kernels as cuda
from . import parallel
from .base import Algo, Cost, Key, Layer, workspace_bytes
from .codecs import Encoding
from .conv import window_keys, window_settings
from .registry import register
from .windows import scatter_add, window_taps

NO_MAXIMUM = 255  # the argmax form's byte for a window with no maximum (all NaN)
# A max pooling's backward makes about this many passes over its top per tap (the first-max
# test's three, the routing's one): its work, for whether splitting it over the threads pays
BACKWARD_PASSES_PER_TAP = 4


def pooled_size(n, k, s, p, ceil=True):
    """Caffe's pooled size along one axis (ceil rounding, dropping a window that sees only
    padding; Caffe checks that only when padding, but without padding such a window can only
    arise when stride > kernel, and Caffe would output garbage for it). ``ceil=False`` rounds
    down; then every window starts inside the image, as p < k."""
    if not ceil:
        return (n + 2 * p - k) // s + 1
    out = -(-(n + 2 * p - k) // s) + 1
    if (out - 1) * s >= n + p:
        out -= 1
    return out


def window_sizes(n, k, s, p, n_out):
    """AVE's divisors along one axis: each window's extent clipped to [-p, n + p)."""
    return [min(o * s - p + k, n + p) - (o * s - p) for o in range(n_out)]


@register
class Pooling(Layer):
    """Max or average pooling over kh x kw windows, or over the whole map (``global_pooling``).
    A MAX pooling may have a second top, Caffe's mask: the index (h * W + w, as a number) in
    its input map of each output's first maximum in scan order, which SegNet's Upsample reads."""

    KEYS = {
        "pool": Key("str", "MAX", choices=("MAX", "AVE")),
        **window_keys("window"),  # the window is required unless global_pooling
        "global_pooling": Key("bool", False, doc="one window covering the whole map"),
        "ceil_mode": Key("bool", True, doc="round the output size up (Caffe); false: down"),
    }
    TOPS = (1, 2)
    CHEAP = True
    CHUNK_BYTES = 8 << 20  # the backward's ``chunked``: the most bytes of its gradient room (whole samples)
    CHUNKED_SPEED = 0.9    # its relative speed: more, smaller calls (the cost model's weighing)

    def setup(self, bottom_shapes):
        shape = tuple(bottom_shapes[0])
        if len(shape) != 4:
            self.fail(f"expects a 4-D bottom (N, C, H, W), got {shape}")
        n, c, h, w = shape
        cfg = self.cfg
        kernel, stride, pad = window_settings(self)
        if cfg["global_pooling"]:
            if kernel is not None:
                self.fail("global_pooling takes its window from the input; drop kernel_size "
                          "(or kernel_h and kernel_w)")
            if stride != (1, 1) or pad != (0, 0):
                self.fail(f"global_pooling needs stride 1 and pad 0, got stride {list(stride)} "
                          f"and pad {list(pad)}")
            kernel = (h, w)
        elif kernel is None:
            self.fail("missing kernel_size (or kernel_h and kernel_w, or global_pooling: true)")
        if min(kernel) < 1 or min(stride) < 1 or min(pad) < 0:
            self.fail(f"kernel_size {list(kernel)} and stride {list(stride)} must be >= 1 and "
                      f"pad {list(pad)} >= 0")
        if pad[0] >= kernel[0] or pad[1] >= kernel[1]:
            self.fail(f"pad {list(pad)} must be smaller than kernel_size {list(kernel)}")
        if h + 2 * pad[0] < kernel[0] or w + 2 * pad[1] < kernel[1]:
            self.fail(f"input {h}x{w} (pad {list(pad)}) is smaller than the "
                      f"{kernel[0]}x{kernel[1]} window")
        ho, wo = (pooled_size((h, w)[a], kernel[a], stride[a], pad[a], cfg["ceil_mode"]) for a in (0, 1))
        self.kernel, self.stride, self.pad = tuple(kernel), stride, pad
        self._taps = window_taps(kernel, stride, pad, (1, 1), (h, w), (ho, wo))
        self._tiles = kernel == stride and pad == (0, 0) and (ho * stride[0], wo * stride[1]) == (h, w)
        self._sizes = [np.array(window_sizes((h, w)[a], kernel[a], stride[a], pad[a], (ho, wo)[a]),
                                dtype=self.dtype) for a in (0, 1)]
        self.bottom_shapes, self.top_shapes = [shape], [(n, c, ho, wo)] * len(self.tops)
        if len(self.tops) == 2:
            if cfg["pool"] != "MAX":
                self.fail("a second top (the mask) is MAX pooling's only")
            self._places = [None if out_index is None else
                            (np.arange(in_index[1].start, in_index[1].stop, in_index[1].step)[:, None] * w
                             + np.arange(in_index[2].start, in_index[2].stop, in_index[2].step)[None, :])
                            for _, _, out_index, in_index in self._taps]
        self.chunk = min(n, max(1, self.CHUNK_BYTES // (c * ho * wo * self.dtype.itemsize)))
        return list(self.top_shapes)

    def backward_reads(self):
        return ((0,), (0,)) if self.cfg["pool"] == "MAX" else ((), ())

    def encodings(self):
        # a window's index fits a byte, with 255 left for "no maximum found" (NaN windows)
        if self.cfg["pool"] != "MAX" or len(self._taps) > NO_MAXIMUM:
            return []
        shape = self.top_shapes[0]
        return [Encoding("argmax", bottoms=(0,), tops=(0,), direct=True, form=(shape, np.uint8),
                         workspace=workspace_bytes((shape, np.bool_), (shape, np.bool_)))]

    def encode(self, ctx, codec, bottoms, tops, out):
        """The ``argmax`` form: ``out[o]`` = the tap of output o's first maximum in scan order
        (NO_MAXIMUM where none equals it: a NaN window)."""
        assert codec == "argmax", codec
        xp, shape = ctx.xp, self.top_shapes[0]
        hit, todo = ctx.scratch(shape, np.bool_), ctx.scratch(shape, np.bool_)
        out.fill(NO_MAXIMUM)
        todo.fill(True)
        for tap, (_, _, out_index, in_index) in enumerate(self._taps):
            if out_index is None:
                continue
            h, _ = self._first_hits(xp, bottoms[0], tops[0], hit, todo, out_index, in_index)
            xp.copyto(out[out_index], np.uint8(tap), where=h)

    def _first_hits(self, xp, x, top, hit, todo, out_index, in_index):
        """The outputs whose first maximum is seen through this tap: ``hit`` there, and
        ``todo`` cleared for them (a window is done once routed)."""
        h, t = hit[out_index], todo[out_index]
        xp.equal(x[in_index], top[out_index], out=h)
        xp.logical_and(h, t, out=h)
        xp.logical_xor(t, h, out=t)  # hit implies todo
        return h, t

    def algorithms(self, phase):
        if phase == "forward":
            mask = len(self.tops) == 2
            return [Algo("default", workspace_bytes(*[(self.top_shapes[0], np.bool_)] * 2) if mask else 0)]
        # the backward: ``default`` takes the batch at once, ``chunked`` (where a chunk is less)
        # a few samples at a time (CHUNK_BYTES of routed gradient), with the room of a chunk
        # only: the same operations on the same values, bit for bit, fewer to a call
        names = ["default"] + (["chunked"] if self.chunk < self.top_shapes[0][0] else [])
        return [Algo(name, workspace_bytes(*self._room(name)), self.CHUNKED_SPEED if name == "chunked" else 1.0)
                for name in names]

    def _room(self, algo):
        """The backward's temporaries under ``algo`` (name; None: the default), as ``(shape,
        dtype)``: a max pooling's first-max flags and windows still to route, and the routed
        (or, averaging, divided) gradient."""
        n, *rest = self.top_shapes[0]
        shape = (self.chunk if algo == "chunked" else n, *rest)
        return ([(shape, np.bool_)] * 2 if self.cfg["pool"] == "MAX" else []) + [(shape, self.dtype)]

    def cost(self):
        x, y = (int(np.prod(s)) for s in (self.bottom_shapes[0], self.top_shapes[0]))
        taps = self.kernel[0] * self.kernel[1]
        item = self.dtype.itemsize
        reads = x + y if self.cfg["pool"] == "MAX" else 0
        return Cost(float(y * taps), float(2 * y * taps), float((x + y) * item),
                    float((reads + x + y) * item))

    def _divide_by_sizes(self, xp, a, out):
        """``out = a / pool_size``, the divisor being separable into rows times columns."""
        rows, cols = (self.constant(xp, f"sizes{k}", s) for k, s in enumerate(self._sizes))
        xp.divide(a, rows.reshape(-1, 1), out=out)
        xp.divide(out, cols, out=out)

    def forward(self, ctx, bottoms, tops, params):
        self._pool(ctx, bottoms, tops)
        if len(tops) == 2:
            self._mask(ctx, bottoms[0], tops[0], tops[1])

    def _mask(self, ctx, x, top, mask):
        """Caffe's mask top: each output's first maximum's index h * W + w in its input map."""
        xp, shape = ctx.xp, self.top_shapes[0]
        hit, todo = ctx.scratch(shape, np.bool_), ctx.scratch(shape, np.bool_)
        mask.fill(-1)  # a window with no maximum (all NaN): no place
        todo.fill(True)
        for k, ((_, _, out_index, in_index), places) in enumerate(zip(self._taps, self._places)):
            if out_index is None:
                continue
            h, _ = self._first_hits(xp, x, top, hit, todo, out_index, in_index)
            xp.copyto(mask[out_index], self.constant(xp, f"places{k}", places, mask.dtype), where=h)

    def _pool(self, ctx, bottoms, tops):
        xp, is_max = ctx.xp, self.cfg["pool"] == "MAX"
        if is_max and cuda.on_gpu(xp):
            self._max_pool_gpu(bottoms[0], tops[0], ctx.encoded)
            return

        def samples(a, b):  # samples a..b, on one thread
            x, top = bottoms[0][a:b], tops[0][a:b]
            top.fill(-np.inf if is_max else 0)
            for _, _, out_index, in_index in self._taps:
                if out_index is None:
                    continue  # this tap sees only padding
                view = top[out_index]
                (xp.maximum if is_max else xp.add)(view, x[in_index], out=view)
            if not is_max:
                self._divide_by_sizes(xp, top, top)
        parallel.run(samples, len(tops[0]), tops[0][0].size * len(self._taps), xp)
        if ctx.encoded is not None:
            self.encode(ctx, "argmax", bottoms, tops, ctx.encoded)

    def _max_pool_gpu(self, x, top, argmax):
        """The max pooling's forward in one kernel, and its ``argmax`` form where asked."""
        (_, _, h, w), (_, _, ho, wo) = x.shape, top.shape
        window = (x.dtype.type(-np.inf), h, w, ho, wo, *self.kernel, *self.stride, *self.pad)
        flat = x.reshape(-1)  # indexed by hand: a flat index, not unravelled per dimension
        if argmax is None:
            cuda.kernel("max_pool")(flat, *window, top)
        else:
            cuda.kernel("max_pool_argmax")(flat, *window, top, argmax)

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        if bottom_grads[0] is None:
            return
        xp, shape = ctx.xp, self.top_shapes[0]
        # (tiling windows leave the routed-gradient buffer unused: the plan keeps one workspace
        # size per layer, whatever its shape)
        room = [ctx.scratch(*temporary) for temporary in self._room(ctx.algo)]
        arrays = (bottoms[0], tops[0], top_grads[0], bottom_grads[0], ctx.encoded)

        def samples(first, a, b):  # samples first+a..first+b, on one thread (x, top, argmax may be None)
            part = [None if t is None else t[first + a:first + b] for t in arrays]
            self._backward_samples(xp, [t[a:b] for t in room], *part)
        step, passes = len(room[0]), BACKWARD_PASSES_PER_TAP * len(self._taps)
        for first in range(0, shape[0], step):  # the batch at once, or a chunk at a time
            parallel.run(functools.partial(samples, first), min(step, shape[0] - first),
                         int(np.prod(shape[1:])) * passes, xp)

    def _backward_samples(self, xp, room, x, top, dy, dx, argmax):
        """The backward of some samples: ``room`` their (hit, todo,) routed-gradient scratch,
        ``argmax`` their encoded form (or None)."""
        tiles = self._tiles
        if not tiles:  # pixels in no window get 0, those in several a sum
            dx.fill(0)
        if self.cfg["pool"] == "AVE":
            (g,) = room
            self._divide_by_sizes(xp, dy, g)
            for _, _, out_index, in_index in self._taps:
                if tiles:
                    xp.copyto(dx[in_index], g[out_index])
                else:
                    scatter_add(xp, dx, g, out_index, in_index)
            return
        hit, todo, g = room
        todo.fill(True)
        for tap, (_, _, out_index, in_index) in enumerate(self._taps):  # scan order: the first max wins
            if out_index is None:
                continue
            if argmax is None:
                h, _ = self._first_hits(xp, x, top, hit, todo, out_index, in_index)
            else:  # the encoded form says where each window's first maximum is
                h = hit[out_index]
                xp.equal(argmax[out_index], tap, out=h)
            if tiles:
                xp.multiply(dy[out_index], h, out=dx[in_index])
            else:
                xp.multiply(dy[out_index], h, out=g[out_index])
                scatter_add(xp, dx, g, out_index, in_index)
