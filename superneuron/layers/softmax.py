"""Softmax and SoftmaxWithLoss, and the scores-and-labels base the classifier heads share.

Scores are ``(N, C)`` or ``(N, C, H, W)`` with the classes on axis 1; labels are ``(N,)`` or
``(N, H, W)``, floats holding class indices. A negative label (the padding of the last, partial
test batch is -1) or one equal to ``ignore_label`` is left out of the loss and the accuracy.
Both write a 0-d top. The kernels view scores as ``(N, C, L)``, the spatial dims flattened.
"""

import numpy as np

from .base import Algo, Cost, Key, Layer, workspace_bytes
from .join import shape_str
from .loss import normalization_in_force
from .norm import _ncl, axis_setup
from .registry import register


def _softmax(xp, x, y, room):
    """``y = softmax(x)`` over axis 1 of (N, C, L) arrays (``y`` may be ``x``), using ``room``,
    an (N, 1, L) scratch, for the maximum and the sum."""
    xp.max(x, axis=1, keepdims=True, out=room)
    xp.subtract(x, room, out=y)  # shifted so that exp cannot overflow
    xp.exp(y, out=y)
    xp.sum(y, axis=1, keepdims=True, out=room)
    y /= room


def _gather(xp, flat, positions, out):
    """``out = flat[positions]`` for positions known to be in range, without a hidden copy:
    NumPy buffers ``out`` in its default bounds-checking mode; CuPy has no mode and no buffer."""
    if xp is np:
        return np.take(flat, positions, out=out, mode="clip")
    return xp.take(flat, positions, out=out)



@register
class Softmax(Layer):
    """``y = exp(x) / sum(exp(x))`` along ``axis``. Its backward reads only the top."""

    KEYS = {"axis": Key("int", 1, doc="the axis of the classes (negative counts from the end)"),
            "causal": Key("bool", False, doc="attention's mask: over (..., queries, keys) with axis -1, "
                                             "key j > query i gets probability 0")}
    INPLACE = True
    CHEAP = True

    def setup(self, bottom_shapes):
        tops = axis_setup(self, bottom_shapes)
        shape = tuple(bottom_shapes[0])
        if self.cfg["causal"] and (len(shape) < 2 or self.cfg["axis"] % len(shape) != len(shape) - 1):
            self.fail(f"causal needs the last axis (axis: -1) of a bottom of (..., queries, keys), "
                      f"got axis {self.cfg['axis']} of {shape_str(shape)}")
        return tops

    def backward_reads(self):
        return (), (0,)

    def _mask_shape(self):
        return tuple(self.bottom_shapes[0][-2:])

    def algorithms(self, phase):
        n, _, l = self.ncl
        mask = [(self._mask_shape(), np.bool_)] if self.cfg["causal"] and phase == "forward" else []
        return [Algo("default", workspace_bytes(((n, 1, l), self.dtype), *mask))]

    def forward(self, ctx, bottoms, tops, params):
        n, _, l = self.ncl
        room = ctx.scratch((n, 1, l), self.dtype)
        x = bottoms[0]
        if self.cfg["causal"]:  # masked scores to -inf: exp gives them 0, the backward 0 too
            q, k = self._mask_shape()
            mask = ctx.scratch((q, k), np.bool_)
            ctx.xp.greater(ctx.xp.arange(k)[None, :], ctx.xp.arange(q)[:, None] + (k - q), out=mask)
            if not ctx.xp.may_share_memory(tops[0], x):
                ctx.xp.copyto(tops[0], x)
            ctx.xp.copyto(tops[0], -np.inf, where=mask)
            x = tops[0]
        _softmax(ctx.xp, x.reshape(self.ncl), tops[0].reshape(self.ncl), room)

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        # dx = y * (dy - sum(dy * y over the axis)); dx may be dy itself
        if bottom_grads[0] is None:
            return
        xp, (n, _, l) = ctx.xp, self.ncl
        y, dy = tops[0].reshape(self.ncl), top_grads[0].reshape(self.ncl)
        dx = bottom_grads[0].reshape(self.ncl)
        dot = ctx.scratch((n, 1, l), self.dtype)
        # the N*L dot products over the axis as one batched matmul: no (N, C, L) product formed
        yt, dyt = y.transpose(0, 2, 1), dy.transpose(0, 2, 1)
        xp.matmul(dyt[:, :, None, :], yt[:, :, :, None], out=dot.reshape(n, l, 1, 1))
        xp.subtract(dy, dot, out=dx)
        dx *= y


class _ScoresAndLabels(Layer):
    """Scores ``(N, C, ...)`` and labels in, a 0-d top out. As in Caffe, labels are matched by
    count, not shape: one label per sample and position, so (N,), (N, 1, 1) and (N, 1) all
    serve (N, C) scores, and (N, H, W) or (N, 1, H, W) serve (N, C, H, W) ones."""

    BOTTOMS = (2, 2)
    LABEL_BOTTOMS = (1,)
    OUT_OF_RANGE_LEFT_OUT = False  # True: a label >= the class count counts as ignored, not an error

    def setup(self, bottom_shapes):
        scores, labels = (tuple(s) for s in bottom_shapes)
        if len(scores) < 2:
            self.fail(f"scores must be (N, C) or (N, C, H, W), got {shape_str(scores)}")
        axis = self.cfg["axis"]
        if not -len(scores) <= axis < len(scores):
            self.fail(f"axis {axis} is out of range for the {len(scores)}-D scores {shape_str(scores)}")
        self.ncl = _ncl(scores, axis % len(scores))
        n, _, l = self.ncl
        count = int(np.prod(labels, dtype=np.int64))
        if count != n * l:
            per = "sample" if l == 1 else "sample and position"
            self.fail(f"labels {shape_str(labels)} hold {count} values, but scores "
                      f"{shape_str(scores)} need {n * l} (one per {per})")
        return [()]

    def cost(self):
        e, item = int(np.prod(self.ncl)), self.dtype.itemsize
        return Cost(4.0 * e, 4.0 * e, float(e * item), float(2 * e * item))

    def _label_room(self):
        """Workspace for :meth:`_labels`: positions, a mask and the weights, one of each per label."""
        n, _, l = self.ncl
        return [((n, l), np.int64), ((n, l), np.bool_), ((n, l), self.dtype)]

    def check_labels(self, labels):
        """Check the labels fed on the host (NumPy), where they are loaded, so that the forward
        need not read them back from the device: a label at or above the class count fails
        as :meth:`_labels` would (negative and ignored labels do not count). False when
        ``labels`` is not of the layer's size (the Input layer says so, when it loads them)."""
        n, c, l = self.ncl
        if np.size(labels) != n * l:
            return False
        idx = np.asarray(labels).reshape(n, l).astype(np.int64)  # as copyto's unsafe cast
        ok = idx >= 0
        if self.cfg["ignore_label"] >= 0:
            ok &= idx != self.cfg["ignore_label"]
        if self.OUT_OF_RANGE_LEFT_OUT:
            return True
        top = int((idx * ok).max())
        if top >= c:
            self.fail(f"label {top} is out of range for {c} classes")
        return True

    def _labels(self, ctx, labels):
        """``(positions, valid)``: for each label, the flat index of its class's score in the
        (N, C, L) scores (class 0 where ignored), and 1.0 where it counts, 0.0 where not."""
        xp, (n, c, l) = ctx.xp, self.ncl
        idx, ok, valid = (ctx.scratch(shape, dtype) for shape, dtype in self._label_room())
        xp.copyto(idx, labels.reshape(n, l), casting="unsafe")  # float class numbers → ints
        xp.greater_equal(idx, 0, out=ok)
        if self.cfg["ignore_label"] >= 0:
            xp.not_equal(idx, self.cfg["ignore_label"], out=valid)
            xp.logical_and(ok, valid, out=ok)
        if self.OUT_OF_RANGE_LEFT_OUT:
            xp.less(idx, c, out=valid)
            xp.logical_and(ok, valid, out=ok)
        idx *= ok
        if not ctx.labels_checked and not self.OUT_OF_RANGE_LEFT_OUT:  # a computed label: read back
            top = int(ctx.host_value(idx.max(), f"{self}'s labels' range"))
            if top >= c:
                self.fail(f"label {top} is out of range for {c} classes")
        xp.copyto(valid, ok)
        idx += (xp.arange(n) * c)[:, None]
        idx *= l
        idx += xp.arange(l)
        return idx, valid



@register
class SoftmaxWithLoss(_ScoresAndLabels):
    """The mean cross-entropy of softmax(scores) against the labels: ``-log p[label]``, averaged
    over the labels that count (``normalize``) or divided by N (``normalize: false``)."""

    KEYS = {
        "axis": Key("int", 1, doc="the axis of the classes: 2 for (N, T, V) scores of a sequence"),
        "ignore_label": Key("int", -1, doc="a label left out of the loss (negatives always are)"),
        "normalize": Key("bool", True, doc="Caffe's older switch: true divides by the labels that "
                         "count (VALID), false by N (BATCH_SIZE)"),
        "normalization": Key("str", None, choices=("FULL", "VALID", "BATCH_SIZE", "NONE"),
                             doc="what the summed loss is divided by: every label (FULL, ignored "
                             "ones too), those that count (VALID), N (BATCH_SIZE) or 1 (NONE); "
                             "wins over normalize"),
        "weight_by_label_freqs": Key("bool", False, doc="SegNet's fork: each label's term weighted "
                                     "by its class's class_weighting (the count it is divided by unweighted)"),
        "class_weighting": Key("floats", (), doc="SegNet's fork: one weight per class"),
    }
    LOSS = True
    CHEAP = True

    def setup(self, bottom_shapes):
        tops = super().setup(bottom_shapes)
        weights = self.cfg["class_weighting"]
        if self.cfg["weight_by_label_freqs"] and len(weights) != self.ncl[1]:
            self.fail(f"weight_by_label_freqs needs one class_weighting per class: {len(weights)} "
                      f"given for {self.ncl[1]} classes")
        self.class_table = np.asarray(weights, dtype=self.dtype)  # on the device once (Layer.constant)
        return tops

    def _weighted(self):
        return self.cfg["weight_by_label_freqs"]

    def _class_weights(self, ctx, positions, valid):
        """``valid`` times each label's class weight (SegNet's weight_by_label_freqs), as a new
        scratch array; ``valid`` itself without weighting."""
        if not self._weighted():
            return valid
        xp, (n, c, l) = ctx.xp, self.ncl
        table = self.constant(xp, "class_weighting", self.class_table)
        classes, weights = ctx.scratch((n, l), np.int64), ctx.scratch((n, l), self.dtype)
        xp.floor_divide(positions, l, out=classes)  # positions: (i * c + class) * l + j
        xp.remainder(classes, c, out=classes)
        xp.take(table, classes, out=weights)
        weights *= valid
        return weights

    @property
    def mode(self):
        """The normalization in force: ``normalization``, else ``normalize``'s (Caffe's rule)."""
        return normalization_in_force(self.cfg, "VALID")

    def backward_reads(self):
        return (0, 1), ()

    def algorithms(self, phase):
        n, c, l = self.ncl
        room = ((n, 1, l), self.dtype)
        weights = [((n, l), np.int64), ((n, l), self.dtype)] if self._weighted() else []
        if phase == "forward":
            return [Algo("default", workspace_bytes(*self._label_room(), (self.ncl, self.dtype), room, room,
                                                    *weights))]
        return [Algo("default", workspace_bytes(*self._label_room(), room, *weights))]

    def _denominator(self, xp, valid):
        mode = self.mode
        if mode == "VALID":
            return xp.maximum(valid.sum(), 1.0)  # stays on the device: no sync
        n, _, l = self.ncl
        return float({"FULL": max(n * l, 1), "BATCH_SIZE": n, "NONE": 1}[mode])

    def forward(self, ctx, bottoms, tops, params):
        xp, (n, _, l) = ctx.xp, self.ncl
        x = bottoms[0].reshape(self.ncl)
        positions, valid = self._labels(ctx, bottoms[1])
        e = ctx.scratch(self.ncl, self.dtype)
        peak, lse = ctx.scratch((n, 1, l), self.dtype), ctx.scratch((n, 1, l), self.dtype)
        xp.max(x, axis=1, keepdims=True, out=peak)
        xp.subtract(x, peak, out=e)
        xp.exp(e, out=e)
        xp.sum(e, axis=1, keepdims=True, out=lse)
        xp.log(lse, out=lse)
        lse += peak  # log sum exp(x), computed without overflow
        nll = lse.reshape(n, l)
        nll -= _gather(xp, x.reshape(-1), positions, peak.reshape(n, l))  # -log p[label]
        nll *= self._class_weights(ctx, positions, valid)
        tops[0][...] = nll.sum() / self._denominator(xp, valid)

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        # dx = weight * (softmax(x) - onehot(label)) / count, 0 where the label is ignored
        dx = bottom_grads[0]
        if dx is None:
            return
        xp, (n, _, l) = ctx.xp, self.ncl
        positions, valid = self._labels(ctx, bottoms[1])
        dx, room = dx.reshape(self.ncl), ctx.scratch((n, 1, l), self.dtype)
        _softmax(xp, bottoms[0].reshape(self.ncl), dx, room)
        flat, picked = dx.reshape(-1), room.reshape(n, l)
        _gather(xp, flat, positions, picked)
        picked -= 1.0
        xp.put(flat, positions, picked)  # positions are distinct: one per (sample, pixel)
        scale = top_grads[0] / self._denominator(xp, valid)
        weights = self._class_weights(ctx, positions, valid)
        weights *= scale
        dx *= weights[:, None, :]
