"""LayerNorm and GELU: the normalisation and the activation of a transformer block.

LayerNorm normalises each sample over its dims from ``axis`` on (the last by default):
``y = (x - mean) / sqrt(var + eps) * weight + bias`` with the affine parameters of the
normalised shape (``elementwise_affine``). Unlike BatchNorm it keeps no statistics between
passes: its backward reads the bottom and recomputes the mean and the deviation of each row,
a few floats a row, so nothing but the bottom lives from the forward to the backward.

GELU is ``x * Phi(x)``, Phi the normal distribution function (``approximate: none``), or
its tanh approximation (``approximate: tanh``), as torch.nn.functional.gelu. Its backward
reads the bottom.
"""

import math

import numpy as np

from .base import Algo, Cost, Key, Layer, ParamSpec, workspace_bytes
from .fillers import parse_filler
from .join import shape_str
from .neuron import _Neuron
from .registry import register


@register
class LayerNorm(Layer):
    """Normalisation over the dims from ``axis`` on, each sample and position on its own."""

    KEYS = {
        "axis": Key("int", -1, doc="the first normalised dim (negative counts from the end)"),
        "eps": Key("float", 1e-5),
        "elementwise_affine": Key("bool", True, doc="learned weight and bias of the normalised shape"),
        "weight_filler": Key("filler", parse_filler({"type": "constant", "value": 1.0})),
        "bias_filler": Key("filler", parse_filler("constant")),
    }
    CHEAP = True  # a few passes over memory, as BatchNorm: recomputed rather than kept

    def setup(self, bottom_shapes):
        shape, axis = tuple(bottom_shapes[0]), self.cfg["axis"]
        if not -len(shape) <= axis < len(shape):
            self.fail(f"axis {axis} is out of range for the {len(shape)}-D bottom {shape_str(shape)}")
        if self.cfg["eps"] <= 0:
            self.fail(f"eps must be > 0, got {self.cfg['eps']}")
        axis %= len(shape)
        self.normalised = shape[axis:]
        self.rows, self.width = math.prod(shape[:axis]), math.prod(shape[axis:])
        return [shape]

    def param_specs(self):
        if not self.cfg["elementwise_affine"]:
            return []
        return [ParamSpec("weight", self.normalised, self.cfg["weight_filler"]),
                ParamSpec("bias", self.normalised, self.cfg["bias_filler"])]

    def backward_reads(self):
        return (0,), ()

    def grad_inplace(self):
        return [(0, 0)]  # the top gradient is read once, into the bottom gradient, element by element

    def algorithms(self, phase):
        stats = ((self.rows, 1), self.dtype)
        if phase == "forward":
            return [Algo("default", workspace_bytes(stats, stats))]
        return [Algo("default", workspace_bytes(stats, stats, ((self.rows, self.width), self.dtype), stats, stats))]

    def cost(self):
        n, item = self.rows * self.width, self.dtype.itemsize
        return Cost(8.0 * n, 12.0 * n, 3.0 * n * item, 6.0 * n * item)

    def _row_dot(self, xp, a, b, out):
        """``out`` (rows, 1) = the mean over each row of ``a * b``: one dot product per row."""
        xp.matmul(a[:, None, :], b[:, :, None], out=out.reshape(self.rows, 1, 1))
        out /= self.width
        return out

    def _normalise(self, ctx, x, out):
        """``out = (x - mean) * rstd`` per row; returns rstd (rows, 1) from the workspace."""
        xp = ctx.xp
        mean, rstd = ctx.scratch((self.rows, 1), self.dtype), ctx.scratch((self.rows, 1), self.dtype)
        xp.mean(x, axis=1, keepdims=True, out=mean)
        xp.subtract(x, mean, out=out)
        self._row_dot(xp, out, out, rstd)  # the variance, with no squared copy
        rstd += self.cfg["eps"]
        xp.sqrt(rstd, out=rstd)
        xp.reciprocal(rstd, out=rstd)
        out *= rstd
        return rstd

    def forward(self, ctx, bottoms, tops, params):
        x = bottoms[0].reshape(self.rows, self.width)
        y = tops[0].reshape(self.rows, self.width)
        self._normalise(ctx, x, y)
        if self.cfg["elementwise_affine"]:
            y *= params["weight"].reshape(-1)
            y += params["bias"].reshape(-1)

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        # with g = dy * weight: dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)), per row
        xp = ctx.xp
        x = bottoms[0].reshape(self.rows, self.width)
        dy = top_grads[0].reshape(self.rows, self.width)
        x_hat = ctx.scratch((self.rows, self.width), self.dtype)
        rstd = self._normalise(ctx, x, x_hat)
        if self.cfg["elementwise_affine"]:
            xp.sum(dy, axis=0, out=param_grads["bias"].reshape(-1))
            dw = param_grads["weight"].reshape(-1)
            if xp is np:  # the column sums of dy * x_hat with no product array
                np.einsum("rw,rw->w", dy, x_hat, out=dw)
            else:  # CuPy's einsum takes no out
                xp.sum(dy * x_hat, axis=0, out=dw)
        if bottom_grads[0] is None:
            return
        g = bottom_grads[0].reshape(self.rows, self.width)
        if self.cfg["elementwise_affine"]:
            xp.multiply(dy, params["weight"].reshape(-1), out=g)
        elif not xp.may_share_memory(g, dy):
            xp.copyto(g, dy)
        mean_g = ctx.scratch((self.rows, 1), self.dtype)
        xp.mean(g, axis=1, keepdims=True, out=mean_g)
        dot = self._row_dot(xp, g, x_hat, ctx.scratch((self.rows, 1), self.dtype))
        g -= mean_g
        x_hat *= dot
        g -= x_hat
        g *= rstd


def _erf(xp, x, out):
    """``out = erf(x)`` (SciPy's on the CPU, CuPy's on a GPU)."""
    if xp is np:
        from scipy.special import erf
    else:
        from cupyx.scipy.special import erf
    return erf(x, out=out)


_TANH_C = math.sqrt(2.0 / math.pi)


@register
class GELU(_Neuron):
    """``x * Phi(x)`` (``approximate: none``) or ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""

    KEYS = {"approximate": Key("str", "none", choices=("none", "tanh"), doc="none (erf) or tanh")}
    TOUCHES = (6, 10)
    FLOPS = (20, 30)
    # ``chunked``: the same elementwise passes over CHUNK elements at a time, so that its scratch
    # is that of a chunk rather than of the whole bottom (two or three arrays of it in the
    # backward): the same numbers to the bit, in more, smaller calls. 8 Mi elements (32 MiB of
    # float32): a pass over a chunk takes far longer on a GPU than launching it (GPT-2 small's
    # MLP, 8 x 1024 x 3072, is four chunks: 96 MiB of scratch in the backward instead of 288)
    CHUNK = 1 << 23
    CHUNKED_SPEED = 0.95

    def backward_reads(self):
        return (0,), ()

    def grad_inplace(self):
        return [(0, 0)]  # each piece of dy is read, into dx, after every other read of the piece

    def grad_over_bottom(self):
        return [0]  # each piece of x is read whole before that piece of dx is written

    def _backward_scratch(self):
        """The backward's scratch arrays: Phi(x), the derivative's other factor, and with the
        tanh form 1 - Phi(x)."""
        return 3 if self.cfg["approximate"] == "tanh" else 2

    def algorithms(self, phase):
        scratch = [self.dtype] * (1 if phase == "forward" else self._backward_scratch())
        count = math.prod(self.bottom_shapes[0])
        algos = [Algo("default", workspace_bytes(*[(self.bottom_shapes[0], d) for d in scratch]))]
        if count > self.CHUNK:
            algos.append(Algo("chunked", workspace_bytes(*[((self.CHUNK,), d) for d in scratch]),
                              self.CHUNKED_SPEED))
        return algos

    def _pieces(self, ctx, *arrays):
        """The pieces of ``arrays`` (same size, contiguous, flattened) that a pass takes at a
        time: CHUNK elements under ``chunked``, the whole under ``default``."""
        flat = [a.reshape(-1) for a in arrays]
        count = flat[0].size
        step = self.CHUNK if ctx.algo == "chunked" else count
        for a in range(0, count, step):
            yield [f[a:a + step] for f in flat]

    def forward(self, ctx, bottoms, tops, params):
        xp = ctx.xp
        whole = ctx.algo != "chunked"
        scratch = ctx.scratch(bottoms[0].shape if whole else (self.CHUNK,), self.dtype).reshape(-1)
        for x, y in self._pieces(ctx, bottoms[0], tops[0]):
            phi = self._phi(ctx, x, scratch[:x.size])
            xp.multiply(x, phi, out=y)

    def _phi(self, ctx, x, out):
        """``Phi(x)`` or its tanh form ``0.5 (1 + tanh(u))`` into ``out``."""
        xp = ctx.xp
        if self.cfg["approximate"] == "tanh":
            xp.multiply(x, x, out=out)
            out *= 0.044715
            out += 1.0
            out *= x
            out *= _TANH_C
            xp.tanh(out, out=out)
        else:
            xp.multiply(x, 1.0 / math.sqrt(2.0), out=out)
            _erf(xp, out, out)
        out += 1.0
        out *= 0.5
        return out

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is None:
            return
        shape = bottoms[0].shape if ctx.algo != "chunked" else (self.CHUNK,)
        room = [ctx.scratch(shape, self.dtype).reshape(-1) for _ in range(self._backward_scratch())]
        for x, dy, piece in self._pieces(ctx, bottoms[0], top_grads[0], dx):
            self._backward_piece(ctx, x, dy, piece, *(r[:x.size] for r in room))

    def _backward_piece(self, ctx, x, dy, dx, a, b, c=None):
        """dx = dy * GELU'(x) over one piece (dx may be dy's or x's memory: both are read
        before it is written), ``a``, ``b`` and ``c`` its scratch."""
        xp = ctx.xp
        phi = self._phi(ctx, x, a)
        if self.cfg["approximate"] == "tanh":
            # d/dx = phi + 0.5 x (1 - t^2) c (1 + 3 k x^2), t = 2 phi - 1, so 1 - t^2 = 4 phi (1 - phi)
            xp.multiply(x, x, out=b)
            b *= 3 * 0.044715
            b += 1.0
            b *= 0.5 * _TANH_C
            b *= x
            xp.subtract(1.0, phi, out=c)
            b *= c
            b *= phi
            b *= 4.0
        else:
            # d/dx = Phi(x) + x * pdf(x), pdf(x) = exp(-x^2 / 2) / sqrt(2 pi)
            xp.multiply(x, x, out=b)
            b *= -0.5
            xp.exp(b, out=b)
            b *= x
            b *= 1.0 / math.sqrt(2.0 * math.pi)
        b += phi
        xp.multiply(dy, b, out=dx)
