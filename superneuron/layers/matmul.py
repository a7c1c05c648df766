"""MatMul and Permute: the batched product and the axis reordering that attention is built of.

``MatMul`` multiplies two bottoms as stacks of matrices, ``A (..., M, K) @ B (..., K, N)``,
with ``transpose_a`` / ``transpose_b`` taking either's last two dims the other way round (so
``Q K^T`` is ``transpose_b: true``). The stack dims must match: no silent broadcasting.
Its backward reads both bottoms.

``Permute`` (the ``order`` of SSD's Caffe layer) writes its bottom with its dims reordered:
``order: [0, 2, 1, 3]`` turns (N, T, H, d) into (N, H, T, d). The top is a copy (a view
would not be contiguous), and the backward copies the gradient back the other way.
"""

import math

from .base import Cost, Key, Layer
from .join import shape_str
from .registry import register


@register
class MatMul(Layer):
    """``top = op(A) @ op(B)`` over stacks of matrices, ``op`` a transpose where asked."""

    KEYS = {
        "transpose_a": Key("bool", False, doc="use A's last two dims swapped"),
        "transpose_b": Key("bool", False, doc="use B's last two dims swapped"),
    }
    BOTTOMS = (2, 2)

    def setup(self, bottom_shapes):
        a, b = (tuple(s) for s in bottom_shapes)
        if len(a) < 2 or len(b) < 2:
            self.fail(f"bottoms must be matrices or stacks of them, got {shape_str(a)} and {shape_str(b)}")
        if a[:-2] != b[:-2]:
            self.fail(f"bottoms {shape_str(a)} and {shape_str(b)} differ in their stack dims {a[:-2]} "
                      f"and {b[:-2]}")
        m, k = (a[-1], a[-2]) if self.cfg["transpose_a"] else (a[-2], a[-1])
        k2, n = (b[-1], b[-2]) if self.cfg["transpose_b"] else (b[-2], b[-1])
        if k != k2:
            self.fail(f"op(A) of {shape_str(a)} has {k} columns but op(B) of {shape_str(b)} has {k2} rows")
        self.stack, self.mkn = math.prod(a[:-2]), (m, k, n)
        return [a[:-2] + (m, n)]

    def cost(self):
        (m, k, n), item = self.mkn, self.dtype.itemsize
        flops = 2.0 * self.stack * m * k * n
        moved = float(self.stack * (m * k + k * n + m * n) * item)
        return Cost(flops, 2 * flops, moved, 2 * moved)

    def _ops(self, a, b):
        return (a.swapaxes(-1, -2) if self.cfg["transpose_a"] else a,
                b.swapaxes(-1, -2) if self.cfg["transpose_b"] else b)

    def forward(self, ctx, bottoms, tops, params):
        a, b = self._ops(*bottoms)
        ctx.xp.matmul(a, b, out=tops[0])

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        xp, dy = ctx.xp, top_grads[0]
        a, b = self._ops(*bottoms)
        da, db = bottom_grads
        if da is not None:  # d op(A) = dY op(B)^T; dA is its transpose under transpose_a
            if self.cfg["transpose_a"]:
                xp.matmul(b, dy.swapaxes(-1, -2), out=da)
            else:
                xp.matmul(dy, b.swapaxes(-1, -2), out=da)
        if db is not None:  # d op(B) = op(A)^T dY
            if self.cfg["transpose_b"]:
                xp.matmul(dy.swapaxes(-1, -2), a, out=db)
            else:
                xp.matmul(a.swapaxes(-1, -2), dy, out=db)


@register
class Permute(Layer):
    """The bottom with its dims in ``order`` (top dim i is bottom dim order[i])."""

    KEYS = {"order": Key("ints", doc="a permutation of the bottom's dims, e.g. [0, 2, 1, 3]")}
    CHEAP = True

    def setup(self, bottom_shapes):
        shape, order = tuple(bottom_shapes[0]), tuple(self.cfg["order"])
        if sorted(order) != list(range(len(shape))):
            self.fail(f"order {list(order)} is not a permutation of the {len(shape)} dims of the "
                      f"bottom {shape_str(shape)}")
        self.order = order
        self.inverse = tuple(order.index(i) for i in range(len(order)))
        return [tuple(shape[i] for i in order)]

    def backward_reads(self):
        return (), ()

    def cost(self):
        n = math.prod(self.bottom_shapes[0]) * self.dtype.itemsize
        return Cost(0.0, 0.0, 2.0 * n, 2.0 * n)

    def forward(self, ctx, bottoms, tops, params):
        ctx.xp.copyto(tops[0], bottoms[0].transpose(self.order))

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        if bottom_grads[0] is not None:
            ctx.xp.copyto(bottom_grads[0], top_grads[0].transpose(self.inverse))
