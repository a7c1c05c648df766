"""InnerProduct (Caffe's fully connected layer): ``top = x W^T + b`` over flattened features.

The bottom's dims from ``axis`` onward are flattened into K features, the dims before it kept:
bottom (N, C, H, W) with ``axis: 1`` gives top (N, num_output). The weight is
(num_output, K), as in Caffe. Every product is one GEMM written into the array it belongs to,
so no algorithm needs workspace.
"""

import numpy as np

from . import parallel
from .base import Cost, Key, Layer, ParamSpec
from .fillers import parse_filler
from .registry import register


@register
class InnerProduct(Layer):
    """Fully connected layer over the dims from ``axis`` onward."""

    KEYS = {
        "num_output": Key("int", doc="output features"),
        "bias_term": Key("bool", True),
        "weight_filler": Key("filler", parse_filler("msra")),
        "bias_filler": Key("filler", parse_filler("constant")),
        "axis": Key("int", 1, doc="first dim flattened into the features (negative counts from the end)"),
    }

    def setup(self, bottom_shapes):
        shape = tuple(bottom_shapes[0])
        axis, n_out = self.cfg["axis"], self.cfg["num_output"]
        if n_out < 1:
            self.fail(f"num_output must be >= 1, got {n_out}")
        if not -len(shape) <= axis < len(shape):
            self.fail(f"axis {axis} is out of range for the {len(shape)}-D bottom {shape}")
        axis %= len(shape)
        self.rows = int(np.prod(shape[:axis], dtype=np.int64))
        self.features = int(np.prod(shape[axis:], dtype=np.int64))
        self.bottom_shapes, self.top_shapes = [shape], [shape[:axis] + (n_out,)]
        return list(self.top_shapes)

    def param_specs(self):
        n_out = self.cfg["num_output"]
        specs = [ParamSpec("weight", (n_out, self.features), self.cfg["weight_filler"],
                           fan_in=self.features, fan_out=n_out)]
        if self.cfg["bias_term"]:
            specs.append(ParamSpec("bias", (n_out,), self.cfg["bias_filler"], fan_in=1, fan_out=1))
        return specs

    def backward_reads(self):
        return (0,), ()

    def cost(self):
        m, k, n = self.rows, self.features, self.cfg["num_output"]
        item = self.dtype.itemsize
        flops = 2.0 * m * k * n
        return Cost(flops, 2 * flops, float((m * k + k * n + m * n) * item),
                    float((2 * m * k + 2 * k * n + m * n) * item))

    def forward(self, ctx, bottoms, tops, params):
        xp, n_out = ctx.xp, self.cfg["num_output"]
        y = tops[0].reshape(self.rows, n_out)
        parallel.matmul(xp, bottoms[0].reshape(self.rows, self.features), params["weight"].T, y)
        if self.cfg["bias_term"]:
            xp.add(y, params["bias"], out=y)

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        xp, n_out = ctx.xp, self.cfg["num_output"]
        dy = top_grads[0].reshape(self.rows, n_out)
        parallel.matmul(xp, dy.T, bottoms[0].reshape(self.rows, self.features), param_grads["weight"])
        if self.cfg["bias_term"]:
            xp.sum(dy, axis=0, out=param_grads["bias"])
        if bottom_grads[0] is not None:
            parallel.matmul(xp, dy, params["weight"], bottom_grads[0].reshape(self.rows, self.features))
