"""Caffe's other neuron layers: Sigmoid, TanH, ELU, PReLU, Power, AbsVal and BNLL.

Each maps every element on its own and keeps the shape. Sigmoid and TanH find their
derivative from the top alone, and ELU does too when ``alpha >= 0`` (then ``y <= 0`` exactly
where ``x <= 0``, and ``dy/dx = y + alpha`` there), so they may run in place. Power's backward
reads nothing when its output is affine or constant, and then it may run in place as well.
PReLU, AbsVal and BNLL need their bottom in the backward: never in place.

Kernels write through ``out=`` into the arrays they are handed; where an expression needs a
second value per element beside the one being written (the top may be the bottom, the bottom
gradient the top gradient), it goes in a scratch array from the step's workspace.
"""

import math

import numpy as np

from .base import Algo, Cost, Key, Layer, ParamSpec, workspace_bytes
from .norm import _ncl
from .registry import register


class _Neuron(Layer):
    """An elementwise layer: one bottom, one top of its shape, cheap to recompute.

    ``TOUCHES`` and ``FLOPS`` are per element, forward and backward: the array elements its
    kernels read and write (every pass through a scratch array counts, so this is several
    times the default elementwise estimate for the layers that chain ufuncs) and rough flops
    (a transcendental function counted as 10)."""

    CHEAP = True
    TOUCHES = (2, 3)
    FLOPS = (1, 2)

    def setup(self, bottom_shapes):
        return [tuple(bottom_shapes[0])]

    def cost(self):
        n = int(np.prod(self.bottom_shapes[0], dtype=np.int64))
        item = self.dtype.itemsize
        (tf, tb), (ff, fb) = self.TOUCHES, self.FLOPS
        return Cost(ff * n, fb * n, tf * n * item, tb * n * item)

    def _scratch_algos(self, forward, backward, phase):
        """One algorithm whose workspace holds the scratch arrays (dtypes) of ``phase``."""
        dtypes = forward if phase == "forward" else backward
        return [Algo("default", workspace_bytes(*[(self.bottom_shapes[0], d) for d in dtypes]))]


def _sigmoid(xp, x, out):
    """``out = 1 / (1 + exp(-x))`` as ``exp(-log(1 + exp(-x)))``: ``logaddexp`` never
    overflows, so no warning and no loss of precision for large ``|x|``; ``out`` may be ``x``."""
    xp.negative(x, out=out)
    xp.logaddexp(out, 0, out=out)
    xp.negative(out, out=out)
    xp.exp(out, out=out)


@register
class Sigmoid(_Neuron):
    """``y = 1 / (1 + exp(-x))``; the backward uses ``dy/dx = y (1 - y)``, from the top alone."""

    INPLACE = True
    TOUCHES = (8, 7)
    FLOPS = (30, 3)

    def backward_reads(self):
        return (), (0,)

    def algorithms(self, phase):
        return self._scratch_algos([], [self.dtype], phase)  # y (1 - y) beside dy

    def forward(self, ctx, bottoms, tops, params):
        _sigmoid(ctx.xp, bottoms[0], tops[0])

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        if bottom_grads[0] is None:
            return
        xp, y = ctx.xp, tops[0]
        factor = xp.subtract(1, y, out=ctx.scratch(y.shape, y.dtype))
        factor *= y
        xp.multiply(top_grads[0], factor, out=bottom_grads[0])


@register
class TanH(_Neuron):
    """``y = tanh(x)``; the backward uses ``dy/dx = 1 - y^2``, from the top alone."""

    INPLACE = True
    TOUCHES = (2, 7)
    FLOPS = (10, 3)

    def backward_reads(self):
        return (), (0,)

    def algorithms(self, phase):
        return self._scratch_algos([], [self.dtype], phase)  # 1 - y^2 beside dy

    def forward(self, ctx, bottoms, tops, params):
        ctx.xp.tanh(bottoms[0], out=tops[0])

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        if bottom_grads[0] is None:
            return
        xp, y = ctx.xp, tops[0]
        factor = xp.multiply(y, y, out=ctx.scratch(y.shape, y.dtype))
        xp.subtract(1, factor, out=factor)
        xp.multiply(top_grads[0], factor, out=bottom_grads[0])


@register
class ELU(_Neuron):
    """``y = x`` where ``x > 0``, ``alpha (exp(x) - 1)`` elsewhere.

    The backward uses Caffe's ``dy/dx = 1`` where ``x > 0``, ``y + alpha`` elsewhere. With
    ``alpha >= 0`` the sign of ``x`` can be read from ``y``, so the layer runs in place and its
    backward reads only the top; with ``alpha < 0`` it reads the bottom too and may not."""

    KEYS = {"alpha": Key("float", 1.0, doc="scale of the negative part; >= 0 to run in place")}
    TOUCHES = (11, 10)
    FLOPS = (13, 4)

    def __init__(self, name, bottoms, tops, cfg, dtype=np.float32):
        super().__init__(name, bottoms, tops, cfg, dtype)
        self.INPLACE = cfg["alpha"] >= 0  # the graph asks before setup

    def backward_reads(self):
        return ((), (0,)) if self.INPLACE else ((0,), (0,))

    def algorithms(self, phase):
        # forward: alpha (exp(min(x, 0)) - 1) beside max(x, 0); backward: y + alpha and x > 0
        return self._scratch_algos([self.dtype], [self.dtype, np.bool_], phase)

    def forward(self, ctx, bottoms, tops, params):
        xp, x, y = ctx.xp, bottoms[0], tops[0]
        negative = xp.minimum(x, 0, out=ctx.scratch(x.shape, x.dtype))
        xp.expm1(negative, out=negative)  # expm1: exact near 0 where exp(x) - 1 cancels
        negative *= self.cfg["alpha"]
        xp.maximum(x, 0, out=y)
        y += negative  # x + 0 where x > 0, 0 + alpha (exp(x) - 1) elsewhere: both exact

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        if bottom_grads[0] is None:
            return
        xp, y = ctx.xp, tops[0]
        factor = xp.add(y, self.cfg["alpha"], out=ctx.scratch(y.shape, y.dtype))
        positive = xp.greater(y if self.INPLACE else bottoms[0], 0, out=ctx.scratch(y.shape, np.bool_))
        xp.copyto(factor, 1, where=positive)
        xp.multiply(top_grads[0], factor, out=bottom_grads[0])


@register
class PReLU(_Neuron):
    """``y = x`` where ``x > 0``, ``weight * x`` elsewhere, with a learned ``weight`` per channel
    (axis 1) or one for all (``channel_shared``). Its backward reads its bottom."""

    KEYS = {
        "filler": Key("filler", {"type": "constant", "value": 0.25}, doc="initial weight"),
        "channel_shared": Key("bool", False, doc="one weight for all channels"),
    }
    TOUCHES = (7, 12)
    FLOPS = (3, 6)

    def setup(self, bottom_shapes):
        shape = tuple(bottom_shapes[0])
        if len(shape) < 2:
            self.fail(f"needs a bottom of at least 2 dims (N, C, ...), got {len(shape)}-D {shape}")
        self.ncl = _ncl(shape)
        return [shape]

    def param_specs(self):
        channels = 1 if self.cfg["channel_shared"] else self.ncl[1]
        return [ParamSpec("weight", (channels,), self.cfg["filler"])]

    def backward_reads(self):
        return (0,), ()

    def algorithms(self, phase):
        return self._scratch_algos([self.dtype], [self.dtype], phase)  # weight * min(x, 0)

    def forward(self, ctx, bottoms, tops, params):
        xp = ctx.xp
        x, y = bottoms[0].reshape(self.ncl), tops[0].reshape(self.ncl)
        negative = xp.minimum(x, 0, out=ctx.scratch(self.ncl, x.dtype))
        negative *= params["weight"][:, None]  # (C, 1) or (1, 1): broadcast over N and L
        xp.maximum(x, 0, out=y)
        y += negative

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        xp = ctx.xp
        x, dy = bottoms[0].reshape(self.ncl), top_grads[0].reshape(self.ncl)
        scratch = ctx.scratch(self.ncl, x.dtype)
        # d/dweight: the sum of dy * min(x, 0) over all but the weight's axis
        xp.minimum(x, 0, out=scratch)
        scratch *= dy
        dw = param_grads["weight"]
        if self.cfg["channel_shared"]:
            xp.sum(scratch.reshape(1, -1), axis=1, out=dw)
        else:
            xp.sum(scratch, axis=(0, 2), out=dw)
        if bottom_grads[0] is None:
            return
        # Caffe's factor (x > 0) + weight * (x <= 0), summed from two exact halves
        dx = bottom_grads[0].reshape(self.ncl)
        xp.greater(x, 0, out=dx)
        xp.less_equal(x, 0, out=scratch)
        scratch *= params["weight"][:, None]
        dx += scratch
        dx *= dy


@register
class Power(_Neuron):
    """``y = (shift + scale * x) ^ power``.

    As in Caffe, ``power == 0`` or ``scale == 0`` gives the constant ``1`` or ``shift ^ power``
    with a zero gradient. The backward computes ``dy/dx = power * scale * (shift + scale * x) ^
    (power - 1)`` from the bottom (Caffe divides the top by ``shift + scale * x``, which gives
    0/0 where that is 0). When the output is constant or affine (``power == 1``) the backward
    reads nothing, and then the layer may run in place."""

    KEYS = {
        "power": Key("float", 1.0),
        "scale": Key("float", 1.0),
        "shift": Key("float", 0.0),
    }
    TOUCHES = (6, 9)
    FLOPS = (12, 14)

    def __init__(self, name, bottoms, tops, cfg, dtype=np.float32):
        super().__init__(name, bottoms, tops, cfg, dtype)
        self.constant = cfg["power"] == 0 or cfg["scale"] == 0
        self.INPLACE = self.constant or cfg["power"] == 1  # the graph asks before setup

    def setup(self, bottom_shapes):
        power, shift = self.cfg["power"], self.cfg["shift"]
        if self.constant and power != 0:
            try:
                value = math.pow(shift, power)
            except (ValueError, ZeroDivisionError, OverflowError):
                value = math.nan
            if not math.isfinite(value):
                self.fail(f"scale 0 makes the output the constant shift^power = {shift}^{power}, "
                          f"which is not a finite real number")
        return super().setup(bottom_shapes)

    def backward_reads(self):
        return ((), ()) if self.INPLACE else ((0,), ())

    def forward(self, ctx, bottoms, tops, params):
        xp, x, y = ctx.xp, bottoms[0], tops[0]
        power, scale, shift = self.cfg["power"], self.cfg["scale"], self.cfg["shift"]
        if self.constant:
            y.fill(1.0 if power == 0 else math.pow(shift, power))
            return
        xp.multiply(x, scale, out=y)
        if shift:
            y += shift
        if power != 1:
            xp.power(y, power, out=y)

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is None:
            return
        xp, dy = ctx.xp, top_grads[0]
        power, scale, shift = self.cfg["power"], self.cfg["scale"], self.cfg["shift"]
        if self.constant:
            dx.fill(0)
            return
        if power == 1:
            xp.multiply(dy, scale, out=dx)
            return
        xp.multiply(bottoms[0], scale, out=dx)
        if shift:
            dx += shift
        if power != 2:
            xp.power(dx, power - 1, out=dx)
        dx *= power * scale
        dx *= dy


@register
class AbsVal(_Neuron):
    """``y = |x|``; the backward uses ``sign(x)`` (0 at 0, as Caffe), so it reads its bottom."""

    TOUCHES = (2, 5)

    def backward_reads(self):
        return (0,), ()

    def forward(self, ctx, bottoms, tops, params):
        ctx.xp.abs(bottoms[0], out=tops[0])

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is not None:
            ctx.xp.sign(bottoms[0], out=dx)
            dx *= top_grads[0]


@register
class BNLL(_Neuron):
    """``y = log(1 + exp(x))`` (softplus), computed as ``max(x, 0) + log(1 + exp(-|x|))`` so that
    it never overflows; the backward uses ``dy/dx = 1 / (1 + exp(-x))`` from the bottom."""

    TOUCHES = (2, 11)
    FLOPS = (20, 30)

    def backward_reads(self):
        return (0,), ()

    def forward(self, ctx, bottoms, tops, params):
        ctx.xp.logaddexp(bottoms[0], 0, out=tops[0])  # log(exp(x) + exp(0)), computed stably

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is not None:
            _sigmoid(ctx.xp, bottoms[0], dx)
            dx *= top_grads[0]
