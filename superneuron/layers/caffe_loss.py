"""Caffe's other losses: ContrastiveLoss, HingeLoss, InfogainLoss and MultinomialLogisticLoss.

Each writes a 0-d top and follows Caffe's definition (caffe/src/caffe/layers/*_loss_layer.cpp);
labels are floats holding class indices (or similarity flags), matched by count per sample.
Scores are viewed as ``(N, D)``: the batch first, every other dim flattened (Caffe's ``dim``).
"""

import math

import numpy as np

from .base import Algo, Cost, Key, Layer, workspace_bytes
from .join import shape_str
from .registry import register

LOG_THRESHOLD = 1e-20  # Caffe's kLOG_THRESHOLD: probabilities are clamped to it before the log


class _Loss(Layer):
    """Scores ``(N, ...)`` and labels ``(N,)`` (one per sample) in, a 0-d loss out."""

    BOTTOMS = (2, 2)
    LABEL_BOTTOMS = (1,)
    LOSS = True
    CHEAP = True

    def setup(self, bottom_shapes):
        scores, labels = (tuple(s) for s in bottom_shapes[:2])
        if not scores or math.prod(labels) != scores[0]:
            self.fail(f"labels {shape_str(labels)} must hold one value per sample of the scores "
                      f"{shape_str(scores)}")
        self.nd = (scores[0], math.prod(scores[1:]))
        return [()]

    def backward_reads(self):
        return tuple(range(len(self.bottoms))), ()

    def cost(self):
        e, item = math.prod(self.nd), self.dtype.itemsize
        return Cost(4.0 * e, 4.0 * e, 2.0 * e * item, 3.0 * e * item)

    def _label_room(self):
        return [((self.nd[0],), np.int64), ((self.nd[0],), np.int64)]

    def _positions(self, ctx, labels):
        """Flat indices of each sample's labelled score in the (N, D) scores; LayerError for a
        label outside [0, D)."""
        xp, (n, d) = ctx.xp, self.nd
        idx, base = (ctx.scratch(s, t) for s, t in self._label_room())
        xp.copyto(idx, labels.reshape(n), casting="unsafe")
        low, high = int(idx.min()), int(idx.max())  # a sync on the GPU, as reading the loss is
        if low < 0 or high >= d:
            self.fail(f"label {low if low < 0 else high} is out of range for {d} classes")
        base[...] = d
        xp.cumsum(base, out=base)  # d, 2d, ...: an arange without an allocation
        base -= d
        idx += base
        return idx


@register
class MultinomialLogisticLoss(_Loss):
    """``-sum(log(max(p[label], 1e-20))) / N`` of probabilities ``p`` (a Softmax's output): the
    gradient is ``-1 / max(p[label], 1e-20) / N`` at each label, 0 elsewhere."""

    def algorithms(self, phase):
        return [Algo("default", workspace_bytes(*self._label_room(), ((self.nd[0],), self.dtype)))]

    def _picked(self, ctx, bottoms):
        xp = ctx.xp
        where = self._positions(ctx, bottoms[1])
        picked = ctx.scratch((self.nd[0],), self.dtype)
        xp.take(bottoms[0].reshape(-1), where, out=picked)
        xp.maximum(picked, LOG_THRESHOLD, out=picked)
        return where, picked

    def forward(self, ctx, bottoms, tops, params):
        _, picked = self._picked(ctx, bottoms)
        ctx.xp.log(picked, out=picked)
        tops[0][...] = -picked.sum() / self.nd[0]

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is None:
            return
        where, picked = self._picked(ctx, bottoms)
        ctx.xp.divide(-top_grads[0] / self.nd[0], picked, out=picked)
        dx.fill(0)
        ctx.xp.put(dx.reshape(-1), where, picked)


@register
class HingeLoss(_Loss):
    """Caffe's one-versus-all hinge loss: ``t = max(0, 1 - s x)`` with ``s`` +1 at the label and
    -1 elsewhere, summed (``norm: L1``) or squared and summed (L2), divided by N."""

    KEYS = {"norm": Key("str", "L1", choices=("L1", "L2"))}

    def algorithms(self, phase):
        return [Algo("default", workspace_bytes(*self._label_room(), (self.nd, self.dtype),
                                                ((self.nd[0],), self.dtype)))]

    def _margins(self, ctx, bottoms):
        """``(t, positions, room)``: the (N, D) margins ``max(0, 1 + x)``, ``max(0, 1 - x)`` at
        the labels, and an (N,) scratch."""
        xp = ctx.xp
        where = self._positions(ctx, bottoms[1])
        t = ctx.scratch(self.nd, self.dtype)
        xp.copyto(t, bottoms[0].reshape(self.nd))
        flat, picked = t.reshape(-1), ctx.scratch((self.nd[0],), self.dtype)
        xp.take(flat, where, out=picked)
        picked *= -1
        xp.put(flat, where, picked)
        t += 1
        xp.maximum(t, 0, out=t)
        return t, where, picked

    def forward(self, ctx, bottoms, tops, params):
        t, _, _ = self._margins(ctx, bottoms)
        if self.cfg["norm"] == "L2":
            t *= t
        tops[0][...] = t.sum() / self.nd[0]

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is None:
            return
        xp = ctx.xp
        t, where, picked = self._margins(ctx, bottoms)
        if self.cfg["norm"] == "L2":
            t *= 2
        else:
            xp.sign(t, out=t)
        flat = t.reshape(-1)
        xp.take(flat, where, out=picked)
        picked *= -1
        xp.put(flat, where, picked)
        xp.multiply(t, top_grads[0] / self.nd[0], out=dx.reshape(self.nd))


@register
class ContrastiveLoss(Layer):
    """Hadsell et al.'s loss of feature pairs ``a``, ``b`` (N, C) with a similarity flag ``y``
    (N,): ``sum(y d^2 + (1 - y) max(margin - d, 0)^2) / 2N``, ``d = |a - b|``
    (``legacy_version``: ``max(margin - d^2, 0)``). Both features get a gradient. Caffe divides
    by ``d + 1e-4`` in the dissimilar pairs' gradient; this one is the exact derivative."""

    KEYS = {"margin": Key("float", 1.0), "legacy_version": Key("bool", False)}
    BOTTOMS = (3, 3)
    LABEL_BOTTOMS = (2,)
    LOSS = True
    CHEAP = True

    def setup(self, bottom_shapes):
        a, b, y = (tuple(s) for s in bottom_shapes)
        if a != b or not a or math.prod(y) != a[0]:
            self.fail(f"expected two features of one shape and one flag per pair, got {shape_str(a)}, "
                      f"{shape_str(b)} and {shape_str(y)}")
        self.nd = (a[0], math.prod(a[1:]))
        return [()]

    def backward_reads(self):
        return (0, 1, 2), ()

    def algorithms(self, phase):
        n = self.nd[0]
        return [Algo("default", workspace_bytes((self.nd, self.dtype), *[((n, 1), self.dtype)] * 3))]

    def _terms(self, ctx, bottoms):
        """``(diff, d^2, similar, hinge)``: a - b, its squared length per pair, the flags, and
        the dissimilar pairs' ``margin - d`` (or ``margin - d^2``) floored at 0."""
        xp, n = ctx.xp, self.nd[0]
        diff = ctx.scratch(self.nd, self.dtype)
        xp.subtract(bottoms[0].reshape(self.nd), bottoms[1].reshape(self.nd), out=diff)
        d2, similar, hinge = (ctx.scratch((n, 1), self.dtype) for _ in range(3))
        xp.matmul(diff[:, None, :], diff[:, :, None], out=d2.reshape(n, 1, 1))
        xp.copyto(similar, bottoms[2].reshape(n, 1), casting="unsafe")
        if self.cfg["legacy_version"]:
            xp.subtract(self.cfg["margin"], d2, out=hinge)
        else:
            xp.sqrt(d2, out=hinge)
            xp.subtract(self.cfg["margin"], hinge, out=hinge)
        xp.maximum(hinge, 0, out=hinge)
        return diff, d2, similar, hinge

    def forward(self, ctx, bottoms, tops, params):
        _, d2, similar, hinge = self._terms(ctx, bottoms)
        if not self.cfg["legacy_version"]:
            hinge *= hinge
        hinge *= 1 - similar
        d2 *= similar
        tops[0][...] = (d2.sum() + hinge.sum()) / (2.0 * self.nd[0])

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        xp = ctx.xp
        diff, d2, similar, hinge = self._terms(ctx, bottoms)
        # d loss / d a = (y - (1 - y) h / d) (a - b) / N; legacy: (y - (1 - y) [h > 0]) (a - b) / N
        if self.cfg["legacy_version"]:
            xp.greater(hinge, 0, out=hinge)
        else:
            xp.sqrt(d2, out=d2)
            xp.maximum(d2, np.finfo(self.dtype).tiny, out=d2)  # h / d; where d is 0, h d'/d is 0 too
            hinge /= d2
        hinge *= 1 - similar
        xp.subtract(similar, hinge, out=hinge)
        hinge *= top_grads[0] / self.nd[0]
        diff *= hinge
        for dx, sign in zip(bottom_grads[:2], (1, -1)):
            if dx is not None:
                xp.multiply(diff, sign, out=dx.reshape(self.nd))


@register
class InfogainLoss(_Loss):
    """Caffe's generalisation of SoftmaxWithLoss by an infogain matrix ``H`` (C, C), the third
    bottom: ``-sum_k H[label, k] log softmax(x)_k`` per sample, divided by N (the loss over
    ``(N, C)`` scores). With ``H`` the identity it is SoftmaxWithLoss. The gradient is
    ``softmax(x) * sum_k H[label, k] - H[label]``, divided by N; ``H`` gets none."""

    KEYS = {"source": Key("str", "", doc="a .binaryproto of H: not read here (give H as a third bottom)"),
            "axis": Key("int", 1, doc="the axis of the classes (1 only here)")}
    BOTTOMS = (2, 3)
    LABEL_BOTTOMS = (1, 2)

    def setup(self, bottom_shapes):
        top = super().setup(bottom_shapes)
        if self.cfg["source"] or len(bottom_shapes) < 3:
            self.fail("H is read from a third bottom here; a 'source' .binaryproto is not read "
                      "(load it and feed it, e.g. from an Input or DummyData layer)")
        if self.cfg["axis"] != 1:
            self.fail(f"axis {self.cfg['axis']}: only axis 1 (scores (N, C)) is supported")
        c = self.nd[1]
        if tuple(bottom_shapes[2])[-2:] != (c, c) or math.prod(bottom_shapes[2]) != c * c:
            self.fail(f"H must be {c}x{c} for {c} classes, got {shape_str(tuple(bottom_shapes[2]))}")
        return top

    def algorithms(self, phase):
        n, c = self.nd
        return [Algo("default", workspace_bytes(*self._label_room(), (self.nd, self.dtype), (self.nd, self.dtype),
                                                ((n, 1), self.dtype), ((n,), np.int64)))]

    def _parts(self, ctx, bottoms):
        """``(log softmax (N, C), H's rows of the labels (N, C))``."""
        xp, (n, c) = ctx.xp, self.nd
        self._positions(ctx, bottoms[1])  # the range check
        logp, rows = ctx.scratch(self.nd, self.dtype), ctx.scratch(self.nd, self.dtype)
        room, labels = ctx.scratch((n, 1), self.dtype), ctx.scratch((n,), np.int64)
        x = bottoms[0].reshape(self.nd)
        xp.max(x, axis=1, keepdims=True, out=room)
        xp.subtract(x, room, out=logp)
        xp.exp(logp, out=rows)
        xp.sum(rows, axis=1, keepdims=True, out=room)
        xp.log(room, out=room)
        logp -= room
        xp.copyto(labels, bottoms[1].reshape(n), casting="unsafe")
        xp.take(bottoms[2].reshape(c, c), labels, axis=0, out=rows)
        return logp, rows

    def forward(self, ctx, bottoms, tops, params):
        logp, rows = self._parts(ctx, bottoms)
        logp *= rows
        tops[0][...] = -logp.sum() / self.nd[0]

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is None:
            return
        xp, n = ctx.xp, self.nd[0]
        logp, rows = self._parts(ctx, bottoms)
        dx = dx.reshape(self.nd)
        xp.exp(logp, out=dx)
        total = logp[:, :1]  # logp is spent once its exp is in dx: a column of it holds the sums
        xp.sum(rows, axis=1, keepdims=True, out=total)
        dx *= total
        dx -= rows
        dx *= top_grads[0] / n
