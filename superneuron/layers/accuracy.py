"""Accuracy: the fraction of labels whose class is among the top-k scores (softmax.py's labels)."""

import numpy as np

from .base import Algo, Key, workspace_bytes
from .registry import register
from .softmax import _gather, _ScoresAndLabels


@register
class Accuracy(_ScoresAndLabels):
    """The fraction of labels that count whose class is among the ``top_k`` highest scores:
    as Caffe, a label is right when fewer than ``top_k`` classes score strictly higher."""

    KEYS = {
        "top_k": Key("int", 1),
        "axis": Key("int", 1, doc="the axis of the classes: 2 for (N, T, V) scores of a sequence"),
        "ignore_label": Key("int", -1, doc="a label left out (negatives always are)"),
    }
    TOPS = (1, 2)  # Caffe's optional second top: each class's accuracy (0 for a class without labels)
    # a label outside the classes (SegNet's void class 11 of 11, written without ignore_label)
    # is left out, as if ignored, where Caffe reads past the scores
    OUT_OF_RANGE_LEFT_OUT = True
    BACKWARD = False
    CHEAP = True

    def setup(self, bottom_shapes):
        tops = super().setup(bottom_shapes)
        if not 1 <= self.cfg["top_k"] <= self.ncl[1]:
            self.fail(f"top_k must be between 1 and the {self.ncl[1]} classes, got {self.cfg['top_k']}")
        return tops + [(self.ncl[1],)] * (len(self.tops) - 1)

    def backward_reads(self):
        return (), ()

    def algorithms(self, phase):
        n, c, l = self.ncl
        per_class = [((n, l), np.int64), ((c,), self.dtype)] if len(self.tops) == 2 else []
        return [Algo("default", workspace_bytes(*self._label_room(), ((n, l), self.dtype),
                                                (self.ncl, np.bool_), *per_class))]

    def forward(self, ctx, bottoms, tops, params):
        xp, (n, _, l) = ctx.xp, self.ncl
        x = bottoms[0].reshape(self.ncl)
        positions, valid = self._labels(ctx, bottoms[1])
        if len(tops) == 2:  # each label's class, before positions are reused below
            classes = ctx.scratch((n, l), np.int64)
            xp.floor_divide(positions, l, out=classes)  # positions: (i * c + class) * l + j
            xp.remainder(classes, self.ncl[1], out=classes)
        truth = _gather(xp, x.reshape(-1), positions, ctx.scratch((n, l), self.dtype))
        higher = xp.greater(x, truth[:, None, :], out=ctx.scratch(self.ncl, np.bool_))
        above = xp.sum(higher, axis=1, out=positions)  # positions are no longer needed
        right = xp.less(above, self.cfg["top_k"], out=truth)
        right *= valid
        tops[0][...] = right.sum() / xp.maximum(valid.sum(), 1.0)
        if len(tops) == 2:
            self._per_class(ctx, classes, valid, right, tops[1])

    def _per_class(self, ctx, classes, valid, right, out):
        """``out[k]``: the fraction of class k's labels (that count) scored right; 0 without any
        (an ignored label adds 0 to class 0)."""
        xp = ctx.xp
        counts = ctx.scratch((self.ncl[1],), self.dtype)
        counts.fill(0)
        out.fill(0)
        xp.add.at(counts, classes.reshape(-1), valid.reshape(-1))
        xp.add.at(out, classes.reshape(-1), right.reshape(-1))
        out /= xp.maximum(counts, 1.0)
