"""ReLU and Dropout: elementwise layers that may run in place and are cheap to recompute.

Neither backward reads its bottom, so both may overwrite it: ReLU's backward finds the active
units from its top (``y > 0`` exactly where ``x > 0`` when the slope is not negative), and
Dropout's backward draws its mask again from the step's seed (the same numbers on recompute).

ReLU's backward needs only the signs of its top, so it offers it in two encoded forms (Gist's
binarization, 1 bit a value): ``sign`` as a tensor form, which a Decode writes back as a map of
1.0 and 0.0 before the backward, and, where the slope is 0, as its own *direct* form, which the
backward reads itself: it unpacks the bits a span at a time (on a GPU one fused kernel reads
them), so its step holds the gradient and 1/32 of the map, never the map.
"""

import numpy as np

from . import codecs, parallel
from . import cuda_kernels as cuda
from .base import Algo, Key, Layer, workspace_bytes
from .codecs import Encoding, packed_bytes
from .registry import register


@register
class ReLU(Layer):
    """``y = max(x, 0)``, or ``x`` where positive and ``negative_slope * x`` elsewhere (leaky)."""

    KEYS = {"negative_slope": Key("float", 0.0, doc="slope for x < 0 (leaky ReLU); must be >= 0")}
    INPLACE = True
    CHEAP = True
    CHUNK = 1 << 21  # the backward's ``chunked`` algorithm: values a span takes (a multiple of 8)
    CHUNKED_SPEED = 0.95

    def setup(self, bottom_shapes):
        if self.cfg["negative_slope"] < 0:
            # y < 0 would no longer mean x < 0, and the backward could not work from the top
            self.fail(f"negative_slope must be >= 0, got {self.cfg['negative_slope']}")
        return [tuple(bottom_shapes[0])]

    def backward_reads(self):
        return (), (0,)

    def encodings(self):
        # the backward reads only where the top is > 0 (Gist's binarization: 1 bit a value)
        forms = [Encoding("sign", tops=(0,))]
        if not self.cfg["negative_slope"]:
            shape = self.bottom_shapes[0]
            forms.append(Encoding("sign", tops=(0,), direct=True, form=((packed_bytes(self._size),), np.uint8),
                                  workspace=codecs.workspace_of("sign", shape, self.dtype)))
        return forms

    @property
    def _size(self):
        return int(np.prod(self.bottom_shapes[0], dtype=np.int64))

    def _span_room(self, values):
        """Workspace of a backward span of ``values`` from the direct form: the stand-in of the
        top (1.0 or 0.0), the mask of active units, the bit plane."""
        return workspace_bytes(((values,), self.dtype), ((values,), np.bool_), ((packed_bytes(values),), np.uint8))

    def algorithms(self, phase):
        shape, slope = self.bottom_shapes[0], self.cfg["negative_slope"]
        if phase == "forward":
            # leaky: slope * x beside x, so that the top may overwrite the bottom
            return [Algo("default", workspace_bytes((shape, self.dtype)) if slope else 0)]
        if slope:  # a factor per unit
            return [Algo("default", workspace_bytes((shape, self.dtype)))]
        # a mask of the active units, 1 byte each (from the direct form, spans of what fits in
        # it; a tiny map's mask is padded to hold a span of 8); ``chunked``: a span of CHUNK
        # values at a time
        algos = [Algo("default", max(workspace_bytes((shape, np.bool_)), self._span_room(8)))]
        if self._size > self.CHUNK:
            algos.append(Algo("chunked", self._span_room(self.CHUNK), self.CHUNKED_SPEED))
        return algos

    def encode(self, ctx, codec, bottoms, tops, out):
        """The direct ``sign`` form: the bits of ``top > 0``, as the tensor form packs them."""
        assert codec == "sign", codec
        codecs.encode(ctx, "sign", tops[0], out)

    def forward(self, ctx, bottoms, tops, params):
        xp, slope = ctx.xp, self.cfg["negative_slope"]
        x, y = bottoms[0], tops[0]
        if not slope and cuda.on_gpu(xp):
            if ctx.encoded is None:
                cuda.kernel("relu")(x, y)
            else:  # the direct sign form in the same pass
                cuda.kernel("relu_bits")(x.reshape(-1), self._size, y.reshape(-1), ctx.encoded)
            return
        if not slope:
            kernel = parallel.max_zero if xp is np else lambda xs, ys: xp.maximum(xs, 0, out=ys)
            parallel.elementwise(kernel, (x, y), xp)
        else:
            scaled = xp.multiply(x, slope, out=ctx.scratch(x.shape, x.dtype))
            # max(x, s*x) picks x where x > 0 when s < 1; min does when s > 1
            (xp.maximum if slope <= 1 else xp.minimum)(x, scaled, out=y)
        if ctx.encoded is not None:
            self.encode(ctx, "sign", bottoms, tops, ctx.encoded)

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is None:
            return
        xp, slope = ctx.xp, self.cfg["negative_slope"]
        y, dy = tops[0], top_grads[0]
        if ctx.encoded is not None:
            self._backward_from_bits(ctx, ctx.encoded, dy.reshape(-1), dx.reshape(-1))
            return
        if not slope and cuda.on_gpu(xp):  # one fused kernel, no mask
            cuda.kernel("relu_backward")(dy, y, dx)
            return
        if not slope:
            spans = self.CHUNK if ctx.algo == "chunked" else self._size
            active = ctx.scratch((min(spans, self._size),), np.bool_)
            y, dy, dx = y.reshape(-1), dy.reshape(-1), dx.reshape(-1)
            for a in range(0, self._size, spans):
                b = min(a + spans, self._size)
                parallel.elementwise(_relu_backward, (y[a:b], dy[a:b], dx[a:b], active[:b - a]), xp)
            return
        factor = xp.greater(y, 0, out=ctx.scratch(y.shape, y.dtype))  # 1 active, 0 not
        factor *= 1.0 - slope
        factor += slope
        xp.multiply(dy, factor, out=dx)

    def _backward_from_bits(self, ctx, bits, dy, dx):
        """The backward from the direct form ``bits``: span by span, the top's stand-in
        unpacked (1.0 where it was > 0) and the default's kernel run on it, so the same bits as
        from the top itself; on a GPU one kernel reads the bits."""
        xp = ctx.xp
        if cuda.on_gpu(xp):
            cuda.kernel("relu_backward_bits")(dy, bits, dx)
            return
        n = self._size
        span = min(n, self.CHUNK if ctx.algo == "chunked" else _fitting(ctx.workspace.nbytes, self._span_room))
        stand_in = ctx.scratch((span,), self.dtype)
        active = ctx.scratch((span,), np.bool_)
        plane = ctx.scratch((packed_bytes(span),), np.uint8)
        for a in range(0, n, span):
            b = min(a + span, n)
            codecs.unpack_bits(xp, bits[a // 8:packed_bytes(b)], stand_in[:b - a], plane)
            parallel.elementwise(_relu_backward, (stand_in[:b - a], dy[a:b], dx[a:b], active[:b - a]), xp)


def _relu_backward(y, dy, dx, active):
    """``dx = dy`` where ``y > 0``, else 0 (``dy * False``: -0.0 for a negative ``dy``)."""
    np.multiply(dy, np.greater(y, 0, out=active), out=dx)


def _fitting(nbytes, room):
    """The largest multiple of 8 values whose ``room(values)`` is at most ``nbytes``."""
    lo, hi = 8, max(8, nbytes)  # room(v) >= v
    while lo < hi:
        mid = (lo + hi + 8) // 16 * 8
        lo, hi = (mid, hi) if room(mid) <= nbytes else (lo, mid - 8)
    return lo


@register
class Dropout(Layer):
    """Training: ``y = x * mask / (1 - p)`` with each unit dropped with probability ``p``;
    testing: ``y = x``. The mask is drawn from the step's seed, in the forward and again in the
    backward, so nothing is kept between them and a recomputed forward draws the same mask.
    ``enabled`` overrides the phase: None drops in training only (Caffe's), True in testing
    too, False never (``load_net(dropout=...)`` sets it)."""

    KEYS = {"dropout_ratio": Key("float", 0.5, doc="probability p of dropping a unit, 0 <= p < 1")}
    INPLACE = True
    CHEAP = True
    enabled = None

    def setup(self, bottom_shapes):
        p = self.cfg["dropout_ratio"]
        if not 0.0 <= p < 1.0:
            self.fail(f"dropout_ratio must be in [0, 1), got {p}")
        return [tuple(bottom_shapes[0])]

    def backward_reads(self):
        return (), ()

    def algorithms(self, phase):
        return [Algo("default", workspace_bytes((self.bottom_shapes[0], self.dtype)))]

    def draws(self, train):
        return bool(self.cfg["dropout_ratio"]) and (train if self.enabled is None else self.enabled)

    def _mask(self, ctx, shape):
        """The scaled mask of this step: 1/(1-p) for kept units, 0 for dropped ones."""
        xp, p = ctx.xp, self.cfg["dropout_ratio"]
        mask = ctx.uniform(ctx.scratch(shape, self.dtype))
        xp.greater_equal(mask, p, out=mask)  # compared in place: 1.0 keep, 0.0 drop
        mask *= 1.0 / (1.0 - p)
        return mask

    def _apply(self, ctx, src, dst):
        xp = ctx.xp
        if (ctx.train if self.enabled is None else self.enabled) and self.cfg["dropout_ratio"]:
            xp.multiply(src, self._mask(ctx, src.shape), out=dst)
        elif not xp.may_share_memory(dst, src):  # in place: nothing to do
            xp.copyto(dst, src)

    def forward(self, ctx, bottoms, tops, params):
        self._apply(ctx, bottoms[0], tops[0])

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        if bottom_grads[0] is not None:
            self._apply(ctx, top_grads[0], bottom_grads[0])
