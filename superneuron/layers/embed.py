"""Embed and Parameter: learned tables and blobs, the inputs of a transformer.

``Embed`` is Caffe's: each bottom value is a token id in ``[0, input_dim)`` (a float, as Caffe
feeds labels) and its top row is that row of a learned ``(input_dim, num_output)`` table, plus
a bias. The ids get no gradient; the table's gradient is the top gradient added into the rows
of the ids that were looked up. With a second bottom, that bottom is the table (no weight of its
own): a ``Parameter`` top that a head reads too ties the input and output embeddings, as GPT-2
does, the table's gradient the sum of both uses (the graph's Split adds them).

``Parameter`` is Caffe's layer that hands a learned blob of a given ``shape`` to the net
(position embeddings, a class token). Caffe broadcasts such a blob over a batch with a Tile
layer after it; here an optional bottom does that in the same layer: with a bottom of batch N,
the top is ``(N, *shape)``, the blob repeated, and its gradient the sum over the batch.
The bottom is read for its batch size only (no gradient flows to it).
"""

import math

import numpy as np

from .base import Algo, Cost, Key, Layer, ParamSpec, workspace_bytes
from .fillers import parse_filler
from .join import shape_str
from .registry import register


@register
class Embed(Layer):
    """``top[..., :] = weight[id] + bias`` for each id of the bottom: (N, T) ids → (N, T, num_output)."""

    KEYS = {
        "num_output": Key("int", doc="the width of each embedding"),
        "input_dim": Key("int", doc="how many ids there are (the vocabulary)"),
        "bias_term": Key("bool", True),
        "weight_filler": Key("filler", parse_filler({"type": "gaussian", "std": 0.02})),
        "bias_filler": Key("filler", parse_filler("constant")),
    }
    BOTTOMS = (1, 2)
    LABEL_BOTTOMS = (0,)  # ids: never differentiated

    def setup(self, bottom_shapes):
        shape = tuple(bottom_shapes[0])
        for key in ("num_output", "input_dim"):
            if self.cfg[key] < 1:
                self.fail(f"{key} must be >= 1, got {self.cfg[key]}")
        table = (self.cfg["input_dim"], self.cfg["num_output"])
        if len(bottom_shapes) == 2 and tuple(bottom_shapes[1]) != table:
            self.fail(f"the table (bottom 2) must be input_dim x num_output {shape_str(table)}, "
                      f"got {shape_str(bottom_shapes[1])}")
        self.count = math.prod(shape)
        return [shape + (self.cfg["num_output"],)]

    def param_specs(self):
        d, v = self.cfg["num_output"], self.cfg["input_dim"]
        specs = [] if len(self.bottoms) == 2 else [ParamSpec("weight", (v, d), self.cfg["weight_filler"],
                                                             fan_in=v, fan_out=d)]
        if self.cfg["bias_term"]:
            specs.append(ParamSpec("bias", (d,), self.cfg["bias_filler"]))
        return specs

    def backward_reads(self):
        return (0,), ()

    def algorithms(self, phase):
        return [Algo("default", workspace_bytes(((self.count,), np.int64), ((self.count,), np.bool_)))]

    def cost(self):
        n, item = self.count * self.cfg["num_output"], self.dtype.itemsize
        return Cost(float(n), float(n), 2.0 * n * item, 3.0 * n * item)

    def _ids(self, ctx, ids):
        """The ids as integers in a scratch vector; a LayerError for one out of range."""
        xp = ctx.xp
        idx = ctx.scratch((self.count,), np.int64)
        xp.copyto(idx, ids.reshape(-1), casting="unsafe")
        bad = ctx.scratch((self.count,), np.bool_)
        xp.less(idx, 0, out=bad)
        if bool(bad.any()) or int(idx.max()) >= self.cfg["input_dim"]:
            self.fail(f"an id is out of range [0, {self.cfg['input_dim']}) "
                      f"(min {int(idx.min())}, max {int(idx.max())})")
        return idx

    def forward(self, ctx, bottoms, tops, params):
        xp = ctx.xp
        y = tops[0].reshape(self.count, -1)
        table = bottoms[1] if len(bottoms) == 2 else params["weight"]
        xp.take(table, self._ids(ctx, bottoms[0]), axis=0, out=y)
        if self.cfg["bias_term"]:
            y += params["bias"]

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        xp = ctx.xp
        dy = top_grads[0].reshape(self.count, -1)
        dw = bottom_grads[1] if len(bottom_grads) == 2 else param_grads["weight"]
        if dw is not None:
            dw[...] = 0
            xp.add.at(dw, self._ids(ctx, bottoms[0]), dy)
        if self.cfg["bias_term"]:
            xp.sum(dy, axis=0, out=param_grads["bias"])


@register
class Parameter(Layer):
    """A learned blob of ``shape`` as the top; with a bottom, repeated over its batch (dim 0)."""

    KEYS = {
        "shape": Key("ints", doc="the blob's dims, e.g. [128, 64] for 128 positions of width 64"),
        "filler": Key("filler", parse_filler({"type": "gaussian", "std": 0.02})),
    }
    BOTTOMS = (0, 1)
    LABEL_BOTTOMS = (0,)  # read for its batch size only

    def setup(self, bottom_shapes):
        shape = tuple(self.cfg["shape"])
        if not shape or any(d < 1 for d in shape):
            self.fail(f"shape must be a list of positive dims, got {list(shape)}")
        if bottom_shapes:
            if not bottom_shapes[0]:
                self.fail(f"the bottom {shape_str(bottom_shapes[0])} has no batch dim to repeat over")
            self.batch = bottom_shapes[0][0]
            return [(self.batch,) + shape]
        self.batch = None
        return [shape]

    def param_specs(self):
        shape = tuple(self.cfg["shape"])
        return [ParamSpec("weight", shape, self.cfg["filler"], fan_in=shape[-1], fan_out=shape[-1])]

    def backward_reads(self):
        return (), ()

    def cost(self):
        n, item = math.prod(self.top_shapes[0]), self.dtype.itemsize
        return Cost(0.0, float(n), float(n * item), float(n * item))

    def forward(self, ctx, bottoms, tops, params):
        w = params["weight"]
        ctx.xp.copyto(tops[0], w if self.batch is None else w[None])

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dy = top_grads[0]
        if self.batch is None:
            ctx.xp.copyto(param_grads["weight"], dy)
        else:
            ctx.xp.sum(dy, axis=0, out=param_grads["weight"])
