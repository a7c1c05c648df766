"""EuclideanLoss and SigmoidCrossEntropyLoss: the losses that are not softmax's (softmax.py)."""

import numpy as np

from .base import Algo, Cost, Key, Layer, workspace_bytes
from .join import shape_str
from .registry import register


@register
class EuclideanLoss(Layer):
    """``sum((a - b)^2) / (2N)``, N the batch (the first dim of ``a``), for two bottoms of the
    same batch and count (Caffe compares counts per sample, so (N, 6) and (N, 2, 3) pair up).
    Both bottoms get a gradient, as in Caffe: ``±(a - b) / N``."""

    BOTTOMS = (2, 2)
    LOSS = True
    CHEAP = True

    def setup(self, bottom_shapes):
        a, b = (tuple(s) for s in bottom_shapes)
        if not a or not b:
            self.fail(f"bottoms must have a batch dim, got {shape_str(a)} and {shape_str(b)}")
        if int(np.prod(a[1:])) != int(np.prod(b[1:])):
            self.fail(f"bottoms {shape_str(a)} and {shape_str(b)} differ in count per sample")
        if a[0] != b[0]:
            self.fail(f"bottoms {shape_str(a)} and {shape_str(b)} differ in batch size")
        return [()]

    def backward_reads(self):
        return (0, 1), ()

    def algorithms(self, phase):
        if phase == "forward":
            return [Algo("default", workspace_bytes((self.bottom_shapes[0], self.dtype)))]
        return [Algo("default", 0)]

    def cost(self):
        e, item = int(np.prod(self.bottom_shapes[0])), self.dtype.itemsize
        return Cost(3.0 * e, 3.0 * e, 2.0 * e * item, 4.0 * e * item)

    def forward(self, ctx, bottoms, tops, params):
        a = bottoms[0]
        diff = ctx.scratch(a.shape, self.dtype)
        ctx.xp.subtract(a, bottoms[1].reshape(a.shape), out=diff)
        flat = diff.reshape(-1)
        tops[0][...] = ctx.xp.vdot(flat, flat) / (2.0 * a.shape[0])

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        xp, (a, b), (da, db) = ctx.xp, bottoms, bottom_grads
        scale = top_grads[0] / a.shape[0]
        if da is not None:
            xp.subtract(a, b.reshape(a.shape), out=da)
            da *= scale
        if db is not None:
            if da is not None:
                xp.negative(da, out=db.reshape(da.shape))
            else:
                xp.subtract(b, a.reshape(b.shape), out=db)
                db *= scale


@register
class SigmoidCrossEntropyLoss(Layer):
    """The cross-entropy of sigmoid(scores) against targets of the same count, in Caffe's stable
    form ``max(x, 0) - x t + log(1 + exp(-|x|))``, summed and divided by the ``normalization``
    (default BATCH_SIZE: the first dim of the scores; FULL: the count; VALID: the targets that
    count; NONE: 1). Targets whose integer part equals ``ignore_label`` are left out. Only the
    scores get a gradient: ``(sigmoid(x) - t) / normalizer``."""

    KEYS = {
        "normalization": Key("str", None, choices=("FULL", "VALID", "BATCH_SIZE", "NONE"),
                             doc="what the summed loss is divided by; default BATCH_SIZE"),
        "normalize": Key("bool", None, doc="Caffe's older switch: true is VALID, false BATCH_SIZE"),
        "ignore_label": Key("int", None, doc="a target value left out of the loss"),
    }
    BOTTOMS = (2, 2)
    LABEL_BOTTOMS = (1,)
    LOSS = True
    CHEAP = True

    def setup(self, bottom_shapes):
        scores, targets = (tuple(s) for s in bottom_shapes)
        if not scores:
            self.fail("scores must have a batch dim, got a 0-D bottom")
        count, have = int(np.prod(scores)), int(np.prod(targets))
        if count != have:
            self.fail(f"targets {shape_str(targets)} hold {have} values, but scores "
                      f"{shape_str(scores)} have {count}: they must have the same count")
        return [()]

    @property
    def mode(self):
        """The normalization in force: ``normalization``, else ``normalize``'s, else BATCH_SIZE."""
        return normalization_in_force(self.cfg, "BATCH_SIZE")

    def backward_reads(self):
        return (0, 1), ()

    def _room(self):
        """Workspace for the ignored targets: their integer parts and the mask."""
        if self.cfg["ignore_label"] is None:
            return []
        shape = self.bottom_shapes[0]
        return [(shape, self.dtype), (shape, np.bool_)]

    def algorithms(self, phase):
        extra = [(self.bottom_shapes[0], self.dtype)] * (2 if phase == "forward" else 0)
        return [Algo("default", workspace_bytes(*self._room(), *extra))]

    def cost(self):
        e, item = int(np.prod(self.bottom_shapes[0])), self.dtype.itemsize
        return Cost(8.0 * e, 6.0 * e, 2.0 * e * item, 3.0 * e * item)

    def _ignored(self, ctx, targets):
        """A mask of the targets left out (None without ``ignore_label``): Caffe compares the
        target cast to an integer, which truncates."""
        if self.cfg["ignore_label"] is None:
            return None
        whole, mask = (ctx.scratch(s, d) for s, d in self._room())
        ctx.xp.trunc(targets, out=whole)
        return ctx.xp.equal(whole, self.cfg["ignore_label"], out=mask)

    def _normalizer(self, xp, ignored):
        count, mode = int(np.prod(self.bottom_shapes[0])), self.mode
        if mode == "VALID" and ignored is not None:
            return xp.maximum(count - xp.count_nonzero(ignored), 1.0)  # on the device: no sync
        n = {"FULL": count, "VALID": count, "BATCH_SIZE": self.bottom_shapes[0][0], "NONE": 1}[mode]
        return float(max(n, 1))

    def forward(self, ctx, bottoms, tops, params):
        xp, x = ctx.xp, bottoms[0]
        t = bottoms[1].reshape(x.shape)
        ignored = self._ignored(ctx, t)
        e, f = ctx.scratch(x.shape, self.dtype), ctx.scratch(x.shape, self.dtype)
        xp.abs(x, out=e)
        xp.negative(e, out=e)
        xp.exp(e, out=e)
        xp.log1p(e, out=e)  # log(1 + exp(-|x|)): exp never overflows
        xp.multiply(x, t, out=f)
        e -= f
        xp.maximum(x, 0, out=f)
        e += f
        if ignored is not None:
            xp.copyto(e, 0, where=ignored)
        tops[0][...] = e.sum() / self._normalizer(xp, ignored)

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is None:
            return
        xp, x = ctx.xp, bottoms[0]
        t = bottoms[1].reshape(x.shape)
        ignored = self._ignored(ctx, t)
        xp.multiply(x, 0.5, out=dx)  # sigmoid(x) = (1 + tanh(x / 2)) / 2: exp never overflows
        xp.tanh(dx, out=dx)
        dx *= 0.5
        dx += 0.5
        dx -= t
        if ignored is not None:
            xp.copyto(dx, 0, where=ignored)
        dx *= top_grads[0] / self._normalizer(xp, ignored)


def normalization_in_force(cfg, default):
    """Caffe's rule for a loss's normalizer: ``normalization`` when given, else the older
    ``normalize`` (true: VALID, false: BATCH_SIZE), else ``default``."""
    if cfg.get("normalization") is not None:
        return cfg["normalization"]
    if cfg.get("normalize") is not None:
        return "VALID" if cfg["normalize"] else "BATCH_SIZE"
    return default
