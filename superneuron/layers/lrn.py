"""LRN: Caffe's local response normalisation, across channels or within a channel.

Its window sums need temporaries the size of the map (the forward one, the backward two), in
the step's workspace. It offers two algorithms: ``default``, which takes the whole batch at
once, and ``chunked``, which takes it a few samples at a time (:attr:`LRN.CHUNK_BYTES` of
each temporary at most, one sample at least) and so needs the temporaries of one chunk only.
Every window lies within one sample, so both compute the same values, bit for bit: the same
elementwise operations on the same elements, only fewer of them per call. The workspace pass
(scheduler/workspace.py) takes ``chunked`` where ``default``'s workspace does not fit the
memory free at the step: GoogLeNet's ``conv2_norm2`` backward needs 220 MiB with it at batch
32, 21 MiB chunked.

The backward reads the bottom alone: it works the top out again from the bottom, a chunk at a
time in its workspace, with the forward's operations (the same bits as the top the forward
wrote), rather than have the top kept for it. So where the layer after an LRN keeps no use of
the top for its own backward (a max pooling that keeps its argmax), the top is not stashed at
all: GoogLeNet's ``conv2_norm2`` (73 MiB at batch 32).
"""

import numpy as np

from .base import Algo, Cost, Key, Layer, workspace_bytes
from .join import shape_str
from .norm import _ncl
from .registry import register


def _box_sum(xp, src, dst, half, axis):
    """``dst[..., i, ...] = sum of src[..., i - half .. i + half, ...]`` along ``axis``
    (positions outside count as 0)."""
    xp.copyto(dst, src)
    before = (slice(None),) * axis
    for o in range(1, half + 1):
        dst[before + (slice(o, None),)] += src[before + (slice(None, -o),)]
        dst[before + (slice(None, -o),)] += src[before + (slice(o, None),)]


@register
class LRN(Layer):
    """Local response normalisation over Caffe's two regions (``norm_region``):

    - ``ACROSS_CHANNELS`` (the default): ``y = x / (k + alpha/n * s)^beta``, s the sum of x^2
      over the n channels centred on this one, the window clipped at the first and last channel;
    - ``WITHIN_CHANNEL``: ``y = x / (1 + alpha/n^2 * s)^beta``, s the sum of x^2 over the n x n
      pixels centred on this one, zeros beyond the border. Caffe computes this with an AVE
      pooling padded by (n-1)/2 (whose every window counts n^2, padding included) and a power
      layer with shift 1, so ``k`` plays no part there, nor here. Needs a 4-D bottom.

    Algorithms (both phases): ``default`` (the whole batch in one pass) and, where a chunk is
    smaller than the batch, ``chunked`` (module docstring).
    """

    KEYS = {
        "local_size": Key("int", 5, doc="n, the window of channels or pixels (odd)"),
        "alpha": Key("float", 1.0),
        "beta": Key("float", 0.75),
        "k": Key("float", 1.0, doc="ACROSS_CHANNELS only (Caffe's WITHIN_CHANNEL ignores it)"),
        "norm_region": Key("str", "ACROSS_CHANNELS", choices=("ACROSS_CHANNELS", "WITHIN_CHANNEL")),
    }
    CHEAP = True
    CHUNK_BYTES = 8 << 20  # ``chunked``: the most bytes of one temporary (whole samples, one at least)
    CHUNKED_SPEED = 0.9    # its relative speed: more, smaller calls (the cost model's weighing)

    def setup(self, bottom_shapes):
        shape, n = tuple(bottom_shapes[0]), self.cfg["local_size"]
        within = self.cfg["norm_region"] == "WITHIN_CHANNEL"
        if len(shape) < 2 or (within and len(shape) != 4):
            need = ("a 4-D bottom (N, C, H, W) within a channel" if within
                    else "a bottom of at least 2 dims (N, C, ...)")
            self.fail(f"needs {need}, got {shape_str(shape)}")
        if n < 1 or n % 2 == 0:
            self.fail(f"local_size must be a positive odd number, got {n}")
        if not within and self.cfg["k"] <= 0:
            self.fail(f"k must be > 0, got {self.cfg['k']}")
        # kernels view the bottom as ``view`` and sum windows along ``axes`` of it; a sample is
        # ``rows`` of the view's first axis
        if within:
            self.view, self.axes = (shape[0] * shape[1],) + shape[2:], (1, 2)
            self.window, self.k, rows = n * n, 1.0, shape[1]
        else:
            self.view, self.axes = _ncl(shape), (1,)
            self.window, self.k, rows = n, self.cfg["k"], 1
        sample = int(np.prod(self.view[1:])) * rows * self.dtype.itemsize
        chunk = min(shape[0], max(1, self.CHUNK_BYTES // max(sample, 1)))  # samples a chunk takes
        self.chunk_rows = chunk * rows
        return [shape]

    def backward_reads(self):
        return (0,), ()  # the top is worked out again from the bottom (the module's docstring)

    def grad_inplace(self):
        return [(0, 0)]  # each sample's dy is read whole (into the room) before its dx is written

    def _room(self, algo):
        """The shape of one temporary under ``algo`` (name; None: the default)."""
        return ((self.chunk_rows,) if algo == "chunked" else self.view[:1]) + tuple(self.view[1:])

    def _spans(self, algo):
        """The ranges of the view's rows that ``algo`` takes at a time."""
        rows = self.view[0]
        step = self.chunk_rows if algo == "chunked" else rows
        return [(a, min(a + step, rows)) for a in range(0, rows, step)]

    def algorithms(self, phase):
        count = 1 if phase == "forward" else 3  # x^2 / the scale, and the backward's top and window terms
        names = ["default"] + (["chunked"] if self.chunk_rows < self.view[0] else [])
        return [Algo(name, workspace_bytes(*[(self._room(name), self.dtype)] * count),
                     self.CHUNKED_SPEED if name == "chunked" else 1.0) for name in names]

    def cost(self):
        e = int(np.prod(self.view))
        item, n = self.dtype.itemsize, self.cfg["local_size"] * len(self.axes)
        # the backward works the top out again (one product more) and reads x and dy, writes dx
        return Cost(e * (n + 6), e * (2 * n + 13), 2 * e * item, 3 * e * item)

    def _window_sum(self, xp, src, dst):
        """``dst`` = the sum of ``src`` over each position's window (separable: along each axis
        in turn, the first pass's sums copied back into ``src``, which is lost)."""
        for i, axis in enumerate(self.axes):
            if i:
                xp.copyto(src, dst)
            _box_sum(xp, src, dst, self.cfg["local_size"] // 2, axis)

    def _scale(self, xp, x, sq, out):
        """``out = k + alpha/window * window sum of x^2``, with ``sq`` as room for x^2."""
        xp.multiply(x, x, out=sq)
        self._window_sum(xp, sq, out)
        out *= self.cfg["alpha"] / self.window
        out += self.k

    def forward(self, ctx, bottoms, tops, params):
        xp = ctx.xp
        x, y = bottoms[0].reshape(self.view), tops[0].reshape(self.view)
        sq = ctx.scratch(self._room(ctx.algo), self.dtype)
        for a, b in self._spans(ctx.algo):
            ys = y[a:b]
            self._scale(xp, x[a:b], sq[:b - a], ys)
            xp.power(ys, -self.cfg["beta"], out=ys)
            ys *= x[a:b]

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        # dx = dy * scale^-beta - 2*alpha*beta/window * x * window sum of (dy * y / scale)
        if bottom_grads[0] is None:
            return
        xp, view = ctx.xp, self.view
        x, dy = bottoms[0].reshape(view), top_grads[0].reshape(view)
        dx = bottom_grads[0].reshape(view)
        room = self._room(ctx.algo)
        tmp, scale, y = (ctx.scratch(room, self.dtype) for _ in range(3))
        for a, b in self._spans(ctx.algo):
            self._backward_rows(xp, x[a:b], dy[a:b], dx[a:b], tmp[:b - a], scale[:b - a], y[:b - a])

    def _backward_rows(self, xp, x, dy, dx, tmp, scale, y):
        """The backward of some whole samples (rows of the view), ``tmp``, ``scale`` and ``y``
        their room; ``dy`` is read whole before ``dx`` is written (it may be the same memory)."""
        self._scale(xp, x, tmp, scale)
        xp.power(scale, -self.cfg["beta"], out=tmp)  # scale^-beta, as the forward ...
        xp.multiply(tmp, x, out=y)                    # ... and its top: the same bits
        xp.multiply(dy, y, out=y)
        y /= scale
        xp.multiply(tmp, dy, out=scale)  # the first term: dy * scale^-beta
        self._window_sum(xp, y, dx)
        dx *= x
        dx *= -2.0 * self.cfg["alpha"] * self.cfg["beta"] / self.window
        dx += scale
