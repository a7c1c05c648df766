"""Stock Caffe's elementwise layers beyond neuron.py's: Exp, Log, Threshold, Clip and Swish.

Each follows Caffe's definition (caffe/src/caffe/layers/*_layer.cpp) and keys. Exp finds its
derivative from its top (so it may run in place), Log, Clip and Swish from their bottom;
Threshold has none (Caffe's aborts), so its backward gives zeros and reads nothing.
"""

import math

import numpy as np

from .base import Key
from .neuron import _Neuron, _sigmoid
from .registry import register


@register
class Exp(_Neuron):
    """``y = base ^ (shift + scale * x)`` (``base`` -1: e). The backward uses ``dy/dx = y *
    scale * ln(base)``, from the top alone: it may run in place."""

    KEYS = {"base": Key("float", -1.0, doc="the base; -1 for e"),
            "scale": Key("float", 1.0), "shift": Key("float", 0.0)}
    INPLACE = True
    FLOPS = (11, 2)

    def setup(self, bottom_shapes):
        base = self.cfg["base"]
        if base != -1 and base <= 0:
            self.fail(f"base must be positive (or -1 for e), got {base}")
        log_base = 1.0 if base == -1 else math.log(base)
        self.inner = log_base * self.cfg["scale"]
        self.outer = 1.0 if self.cfg["shift"] == 0 else math.exp(log_base * self.cfg["shift"])
        return super().setup(bottom_shapes)

    def backward_reads(self):
        return (), (0,)

    def forward(self, ctx, bottoms, tops, params):
        xp, y = ctx.xp, tops[0]
        xp.multiply(bottoms[0], self.inner, out=y)
        xp.exp(y, out=y)
        if self.outer != 1.0:
            y *= self.outer

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is not None:
            ctx.xp.multiply(top_grads[0], tops[0], out=dx)
            dx *= self.inner


@register
class Log(_Neuron):
    """``y = log_base(shift + scale * x)`` (``base`` -1: natural). Its backward reads its bottom."""

    KEYS = {"base": Key("float", -1.0, doc="the base; -1 for e"),
            "scale": Key("float", 1.0), "shift": Key("float", 0.0)}
    FLOPS = (12, 3)

    def setup(self, bottom_shapes):
        base = self.cfg["base"]
        if base != -1 and (base <= 0 or base == 1):
            self.fail(f"base must be positive and not 1 (or -1 for e), got {base}")
        self.base_scale = 1.0 if base == -1 else 1.0 / math.log(base)
        return super().setup(bottom_shapes)

    def backward_reads(self):
        return (0,), ()

    def forward(self, ctx, bottoms, tops, params):
        xp, y = ctx.xp, tops[0]
        xp.multiply(bottoms[0], self.cfg["scale"], out=y)
        y += self.cfg["shift"]
        xp.log(y, out=y)
        if self.base_scale != 1.0:
            y *= self.base_scale

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is None:
            return
        xp = ctx.xp
        xp.multiply(bottoms[0], self.cfg["scale"], out=dx)
        dx += self.cfg["shift"]
        xp.divide(top_grads[0], dx, out=dx)
        dx *= self.cfg["scale"] * self.base_scale


@register
class Threshold(_Neuron):
    """``y = 1`` where ``x > threshold``, else 0. Caffe has no backward for it; its derivative is
    zero almost everywhere, which is what this one gives. It reads nothing, so runs in place."""

    KEYS = {"threshold": Key("float", 0.0)}
    INPLACE = True

    def backward_reads(self):
        return (), ()

    def forward(self, ctx, bottoms, tops, params):
        ctx.xp.greater(bottoms[0], self.cfg["threshold"], out=tops[0])

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        if bottom_grads[0] is not None:
            bottom_grads[0].fill(0)


@register
class Clip(_Neuron):
    """``y = min(max(x, min), max)``; the gradient passes where ``min <= x <= max`` (Caffe's)."""

    KEYS = {"min": Key("float"), "max": Key("float")}

    def setup(self, bottom_shapes):
        if self.cfg["min"] > self.cfg["max"]:
            self.fail(f"min {self.cfg['min']} is more than max {self.cfg['max']}")
        return super().setup(bottom_shapes)

    def backward_reads(self):
        return (0,), ()

    def algorithms(self, phase):
        return self._scratch_algos([], [np.bool_], phase)

    def forward(self, ctx, bottoms, tops, params):
        ctx.xp.clip(bottoms[0], self.cfg["min"], self.cfg["max"], out=tops[0])

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is None:
            return
        xp, x = ctx.xp, bottoms[0]
        outside = xp.less(x, self.cfg["min"], out=ctx.scratch(x.shape, np.bool_))
        xp.copyto(dx, top_grads[0])
        xp.copyto(dx, 0, where=outside)
        xp.copyto(dx, 0, where=xp.greater(x, self.cfg["max"], out=outside))


@register
class Swish(_Neuron):
    """``y = x * sigmoid(beta * x)``; the backward, Caffe's ``dy * (beta * y + s * (1 - beta * y))``
    with ``s = sigmoid(beta * x)``, reads its bottom and its top."""

    KEYS = {"beta": Key("float", 1.0)}
    TOUCHES = (9, 12)
    FLOPS = (32, 8)

    def backward_reads(self):
        return (0,), (0,)

    def algorithms(self, phase):
        return self._scratch_algos([self.dtype], [self.dtype, self.dtype], phase)

    def forward(self, ctx, bottoms, tops, params):
        xp, x = ctx.xp, bottoms[0]
        s = xp.multiply(x, self.cfg["beta"], out=ctx.scratch(x.shape, x.dtype))
        _sigmoid(xp, s, s)
        xp.multiply(x, s, out=tops[0])

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is None:
            return
        xp, x, y, beta = ctx.xp, bottoms[0], tops[0], self.cfg["beta"]
        s = xp.multiply(x, beta, out=ctx.scratch(x.shape, x.dtype))
        _sigmoid(xp, s, s)
        by = xp.multiply(y, beta, out=ctx.scratch(x.shape, x.dtype))
        xp.subtract(1.0, by, out=dx)
        dx *= s
        dx += by
        dx *= top_grads[0]
