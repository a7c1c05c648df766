"""Flatten, Reshape, Slice, Silence and ArgMax: layers that reshape a tensor, cut it into parts,
consume it, or pick its largest values.

Flatten and Reshape change only the shape, so their top is a view of their bottom: it takes no
memory of its own and the forward does nothing, and the bottom's gradient is likewise a view
of the top's (Caffe shares data and diff the same way). The graph marks both as aliases
(``ALIAS_TOPS``, ``ALIAS_GRADS``); the arena gives a tensor its root's offset and its own
shape. Slice copies: its parts lie at offsets inside the bottom, and an alias shares its
root's offset.
"""

import math

import numpy as np

from .base import Algo, Cost, Key, Layer, workspace_bytes
from .join import shape_str
from .norm import _ncl
from .registry import register


def _axis(layer, shape, axis, key="axis"):
    """``axis`` of ``shape`` counted from 0, or a LayerError naming ``key``."""
    if not -len(shape) <= axis < len(shape):
        layer.fail(f"{key} {axis} is out of range for the {len(shape)}-D bottom {shape_str(shape)}")
    return axis % len(shape)


class _View(Layer):
    """A top holding the bottom's values, in order, in another shape: a view of the bottom."""

    ALIAS_TOPS = True
    ALIAS_GRADS = True
    CHEAP = True

    def backward_reads(self):
        return (), ()

    def cost(self):
        return Cost()  # nothing is computed or moved

    def forward(self, ctx, bottoms, tops, params):
        # The runtime makes the top a view of the bottom and skips this; elsewhere (tests, the
        # Python API) the top may be an array of its own.
        if not ctx.xp.may_share_memory(tops[0], bottoms[0]):
            ctx.xp.copyto(tops[0], bottoms[0].reshape(tops[0].shape))

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is not None and not ctx.xp.may_share_memory(dx, top_grads[0]):
            ctx.xp.copyto(dx, top_grads[0].reshape(dx.shape))


@register
class Flatten(_View):
    """Dims ``axis`` to ``end_axis`` (both included) merged into one: (N, C, H, W) → (N, C·H·W)
    by default."""

    KEYS = {
        "axis": Key("int", 1, doc="first dim merged (negative counts from the end)"),
        "end_axis": Key("int", -1, doc="last dim merged (negative counts from the end)"),
    }

    def setup(self, bottom_shapes):
        shape = tuple(bottom_shapes[0])
        start = _axis(self, shape, self.cfg["axis"])
        end = _axis(self, shape, self.cfg["end_axis"], "end_axis")
        if end < start - 1:  # Caffe's count(start, end + 1); end = start - 1 inserts a dim of 1
            self.fail(f"end_axis {self.cfg['end_axis']} comes before axis {self.cfg['axis']} "
                      f"in the bottom {shape_str(shape)}")
        return [shape[:start] + (math.prod(shape[start:end + 1]),) + shape[end + 1:]]


@register
class Reshape(_View):
    """The bottom's dims ``axis`` to ``axis + num_axes`` replaced by ``shape``, where a 0 copies
    the bottom's dim at that place and one -1 is inferred from the count (Caffe's rules)."""

    KEYS = {
        "shape": Key("ints", (), doc="the new dims: 0 copies the bottom's, -1 is inferred"),
        "axis": Key("int", 0, doc="first dim replaced (negative counts from the end, -1 after the last)"),
        "num_axes": Key("int", -1, doc="how many dims are replaced; -1: all from axis on"),
    }

    def setup(self, bottom_shapes):
        shape, dims = tuple(bottom_shapes[0]), self.cfg["shape"]
        axis, num_axes, nd = self.cfg["axis"], self.cfg["num_axes"], len(bottom_shapes[0])
        if any(d < -1 for d in dims):
            self.fail(f"shape {list(dims)}: a dim is positive, 0 (copy the bottom's) or -1 (inferred)")
        if dims.count(-1) > 1:
            self.fail(f"shape {list(dims)}: at most one dim may be -1")
        start = axis if axis >= 0 else nd + axis + 1  # -1 is after the last dim
        if not 0 <= start <= nd:
            self.fail(f"axis {axis} is out of range for the {nd}-D bottom {shape_str(shape)}")
        if num_axes < -1:
            self.fail(f"num_axes must be >= 0, or -1 for all, got {num_axes}")
        end = nd if num_axes == -1 else start + num_axes
        if end > nd:
            self.fail(f"axis + num_axes = {end} is out of range for the {nd}-D bottom {shape_str(shape)}")
        top = list(shape[:start]) + list(dims) + list(shape[end:])
        for i, d in enumerate(dims):
            if d == 0:
                if start + i >= nd:
                    self.fail(f"shape {list(dims)}: dim {i} is 0, but the bottom {shape_str(shape)} "
                              f"has no dim {start + i} to copy")
                top[start + i] = shape[start + i]
        count = math.prod(shape)
        if -1 in dims:
            i = start + dims.index(-1)
            known = math.prod(d for j, d in enumerate(top) if j != i)
            if count % known:
                self.fail(f"shape {list(dims)}: the bottom {shape_str(shape)} has {count} values, "
                          f"not a multiple of the other dims' {known}")
            top[i] = count // known
        if math.prod(top) != count:
            self.fail(f"shape {list(dims)} gives {shape_str(top)} of {math.prod(top)} values, but the "
                      f"bottom {shape_str(shape)} has {count}")
        return [tuple(top)]


@register
class Slice(Layer):
    """The bottom cut along ``axis`` into one part per top: at the ``slice_point`` indices, or
    into equal parts without them. Each top is a copy of its part."""

    KEYS = {
        "axis": Key("int", 1, doc="the axis to cut along (negative counts from the end)"),
        "slice_dim": Key("int", None, doc="Caffe's older name of axis (not negative); wins over axis"),
        "slice_point": Key("ints", (), doc="where each top but the first starts; default: equal parts"),
    }
    TOPS = (1, None)
    CHEAP = True

    def setup(self, bottom_shapes):
        shape, n = tuple(bottom_shapes[0]), len(self.tops)
        if self.cfg["slice_dim"] is not None:
            axis = self.cfg["slice_dim"]
            if not 0 <= axis < len(shape):
                self.fail(f"slice_dim {axis} is out of range for the {len(shape)}-D bottom {shape_str(shape)}")
        else:
            axis = _axis(self, shape, self.cfg["axis"])
        size, points = shape[axis], self.cfg["slice_point"]
        if points:
            if len(points) != n - 1:
                self.fail(f"{len(points)} slice_point(s) for {n} tops: give {n - 1}")
            bounds = (0, *points, size)
            if any(b <= a for a, b in zip(bounds, bounds[1:])):
                self.fail(f"slice_point {list(points)} must rise strictly, above 0 and below {size} "
                          f"(axis {axis} of the bottom {shape_str(shape)})")
        else:
            if size % n:
                self.fail(f"axis {axis} of the bottom {shape_str(shape)} has {size} entries: "
                          f"{n} tops do not cut it in equal parts (give slice_point)")
            bounds = tuple(range(0, size + 1, size // n))
        self.parts = [(slice(None),) * axis + (slice(a, b),) for a, b in zip(bounds, bounds[1:])]
        return [shape[:axis] + (b - a,) + shape[axis + 1:] for a, b in zip(bounds, bounds[1:])]

    def backward_reads(self):
        return (), ()

    def cost(self):
        n = int(np.prod(self.bottom_shapes[0]))
        return Cost(0.0, 0.0, 2.0 * n * self.dtype.itemsize, 2.0 * n * self.dtype.itemsize)

    def forward(self, ctx, bottoms, tops, params):
        for y, part in zip(tops, self.parts):
            ctx.xp.copyto(y, bottoms[0][part])

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is None:
            return
        for dy, part in zip(top_grads, self.parts):
            if dy is None:
                dx[part] = 0  # a part nothing reads adds nothing to the loss
            else:
                ctx.xp.copyto(dx[part], dy)


@register
class Silence(Layer):
    """Consumes its bottoms and writes nothing, so that tops nothing reads are not outputs.
    Its backward gives zero gradients (Caffe's); in a graph it never runs, since with no tops
    it leads to no loss, which gives its bottoms no gradient from it: zero, as in Caffe."""

    BOTTOMS = (1, None)
    TOPS = (0, 0)
    ALIAS_TOPS = True  # no tops to write, so the forward does nothing and reads nothing
    CHEAP = True

    def setup(self, bottom_shapes):
        return []

    def backward_reads(self):
        return (), ()

    def cost(self):
        return Cost()

    def forward(self, ctx, bottoms, tops, params):
        pass

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        for dx in bottom_grads:
            if dx is not None:
                dx[...] = 0


@register
class ArgMax(Layer):
    """The indices (as numbers) of the ``top_k`` largest values, largest first: along ``axis``
    (top: the bottom with ``top_k`` on that axis, the values instead of the indices with
    ``out_max_val``), or without it over each sample's values (top (N, 1, top_k), or
    (N, 2, top_k) with the values after the indices under ``out_max_val``, padded with 1s to
    the bottom's dims). Equal values go to the higher index first, as in Caffe."""

    KEYS = {
        "out_max_val": Key("bool", False, doc="give the values (with the indices without axis)"),
        "top_k": Key("int", 1, doc="how many of the largest values"),
        "axis": Key("int", None, doc="the axis to search along; default: each sample's values"),
    }
    BACKWARD = False

    def setup(self, bottom_shapes):
        shape, k, axis = tuple(bottom_shapes[0]), self.cfg["top_k"], self.cfg["axis"]
        if k < 1:
            self.fail(f"top_k must be at least 1, got {k}")
        if axis is None:
            if not shape:
                self.fail("the bottom must have a batch dim, got a 0-D bottom")
            self.ncl = (shape[0], math.prod(shape[1:]), 1)
            if k > self.ncl[1]:
                self.fail(f"top_k {k} is more than the {self.ncl[1]} values of each sample "
                          f"of the bottom {shape_str(shape)}")
            top = [shape[0], 2 if self.cfg["out_max_val"] else 1, k] + [1] * (len(shape) - 3)
            return [tuple(top)]
        axis = _axis(self, shape, axis)
        self.ncl = _ncl(shape, axis)
        if k > shape[axis]:
            self.fail(f"top_k {k} is more than the {shape[axis]} values along axis {axis} of the "
                      f"bottom {shape_str(shape)}")
        return [shape[:axis] + (k,) + shape[axis + 1:]]

    def backward_reads(self):
        return (), ()

    def _room(self):
        n, c, l = self.ncl
        return [((n, l, c), self.dtype), ((n, l, c), np.bool_), ((n, l, c), np.bool_),
                ((n, l, 1), self.dtype), ((n, l, 1), np.int64), ((c,), np.int64)]

    def algorithms(self, phase):
        return [Algo("default", workspace_bytes(*self._room()))]

    def cost(self):
        e, k = math.prod(self.ncl), self.cfg["top_k"]
        return Cost(6.0 * e * k, 0.0, 3.0 * e * k * self.dtype.itemsize, 0.0)

    def forward(self, ctx, bottoms, tops, params):
        xp, (n, c, l), k, axis = ctx.xp, self.ncl, self.cfg["top_k"], self.cfg["axis"]
        work, hit, taken, best, where, classes = (ctx.scratch(s, d) for s, d in self._room())
        # The values searched lie last and in reverse: reductions then run over contiguous
        # rows (NumPy copies any other layout first), and argmax's first of equal values is
        # the one at the highest index, which Caffe's sort puts first.
        xp.copyto(work, bottoms[0].reshape(n, c, l).transpose(0, 2, 1)[:, :, ::-1])
        if axis is None:  # (N, 2, k): the indices, then the values
            y = tops[0].reshape(n, -1, k)
            outs = [(y[:, 0, :], where), (y[:, 1, :], best)] if self.cfg["out_max_val"] else [(y[:, 0, :], where)]
        else:
            y = tops[0].reshape(n, k, l)
            outs = [(y, best if self.cfg["out_max_val"] else where)]
        taken[...] = False
        classes[...] = 1
        xp.cumsum(classes, out=classes)  # 1, 2, ..., c: an arange without an allocation
        classes -= 1
        for j in range(k):  # the largest left, k times: no sort, no temporaries
            xp.max(work, axis=2, keepdims=True, out=best)
            xp.equal(work, best, out=hit)
            xp.greater(hit, taken, out=hit)  # the largest, not taken before (-inf may tie)
            xp.argmax(hit, axis=2, keepdims=True, out=where)
            xp.equal(classes, where, out=hit)
            xp.logical_or(taken, hit, out=taken)
            xp.copyto(work, -np.inf, where=hit)
            xp.subtract(c - 1, where, out=where)  # the index in the bottom's order
            for out, value in outs:  # (N, l) into slot j: y[:, j, :] with axis, y[:, row, j] without
                dst = out[:, j, :] if axis is not None else out[:, j:j + 1]
                xp.copyto(dst, value[:, :, 0], casting="unsafe")
