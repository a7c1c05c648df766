"""ReLU and Dropout: elementwise layers that may run in place and are cheap to recompute.

Neither backward reads its bottom, so both may overwrite it: ReLU's backward finds the active
units from its top (``y > 0`` exactly where ``x > 0`` when the slope is not negative), and
Dropout's backward draws its mask again from the step's seed (the same numbers on recompute).
"""

import numpy as np

from . import cuda_kernels as cuda
from . import parallel, register
from .base import Algo, Key, Layer, workspace_bytes
from .codecs import Encoding

# Elements per row of :func:`_relu`'s zero row (64 KiB of float32, made once)
ROW = 1 << 14


def _relu(x, y):
    """``y = max(x, 0)`` on the CPU, flat ``x`` and ``y`` taken as rows against a row of zeros:
    NumPy's maximum runs about twice as fast over two contiguous operands as against the
    scalar 0 (see :func:`~.parallel.constant`); the same values either way."""
    if x.ndim != 1:
        np.maximum(x, 0, out=y)
        return
    zero, body = parallel.constant(0, ROW, x.dtype), x.size - x.size % ROW
    if body:
        np.maximum(x[:body].reshape(-1, ROW), zero, out=y[:body].reshape(-1, ROW))
    if body < x.size:
        np.maximum(x[body:], zero[:x.size - body], out=y[body:])


@register
class ReLU(Layer):
    """``y = max(x, 0)``, or ``x`` where positive and ``negative_slope * x`` elsewhere (leaky)."""

    KEYS = {"negative_slope": Key("float", 0.0, doc="slope for x < 0 (leaky ReLU); must be >= 0")}
    INPLACE = True
    CHEAP = True

    def setup(self, bottom_shapes):
        if self.cfg["negative_slope"] < 0:
            # y < 0 would no longer mean x < 0, and the backward could not work from the top
            self.fail(f"negative_slope must be >= 0, got {self.cfg['negative_slope']}")
        return [tuple(bottom_shapes[0])]

    def backward_reads(self):
        return (), (0,)

    def encodings(self):
        # the backward reads only where the top is > 0 (Gist's binarization: 1 bit a value)
        return [Encoding("sign", tops=(0,))]

    def algorithms(self, phase):
        shape, slope = self.bottom_shapes[0], self.cfg["negative_slope"]
        if phase == "forward":
            # leaky: slope * x beside x, so that the top may overwrite the bottom
            return [Algo("default", workspace_bytes((shape, self.dtype)) if slope else 0)]
        # a mask of the active units: 1 byte each, or a factor per unit when leaky
        return [Algo("default", workspace_bytes((shape, self.dtype if slope else np.bool_)))]

    def forward(self, ctx, bottoms, tops, params):
        xp, slope = ctx.xp, self.cfg["negative_slope"]
        x, y = bottoms[0], tops[0]
        if not slope and cuda.on_gpu(xp):
            cuda.kernel("relu")(x, y)
            return
        if not slope:
            parallel.elementwise(_relu if xp is np else lambda xs, ys: xp.maximum(xs, 0, out=ys), (x, y), xp)
            return
        scaled = xp.multiply(x, slope, out=ctx.scratch(x.shape, x.dtype))
        # max(x, s*x) picks x where x > 0 when s < 1; min does when s > 1
        (xp.maximum if slope <= 1 else xp.minimum)(x, scaled, out=y)

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is None:
            return
        xp, slope = ctx.xp, self.cfg["negative_slope"]
        y, dy = tops[0], top_grads[0]
        if not slope and cuda.on_gpu(xp):  # one fused kernel, no mask
            cuda.kernel("relu_backward")(dy, y, dx)
            return
        if not slope:
            def block(ys, dys, dxs, active):
                xp.multiply(dys, xp.greater(ys, 0, out=active), out=dxs)
            parallel.elementwise(block, (y, dy, dx, ctx.scratch(y.shape, np.bool_)), xp)
            return
        factor = xp.greater(y, 0, out=ctx.scratch(y.shape, y.dtype))  # 1 active, 0 not
        factor *= 1.0 - slope
        factor += slope
        xp.multiply(dy, factor, out=dx)


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
