"""Stock Caffe layers beyond the classifier's: Bias, MVN, Reduction, Tile, Crop and
BatchReindex (the elementwise ones are in caffe_neuron.py).

Each follows Caffe's definition (caffe/src/caffe/layers/*_layer.cpp) and keys (the fields of its
``*_param`` block). Scratch memory comes from the step's workspace as the other layers take it.
"""

import math

import numpy as np

from .base import Algo, Cost, Key, Layer, ParamSpec, workspace_bytes
from .join import shape_str
from .registry import register


def _axis(layer, shape, axis, key="axis"):
    if not -len(shape) <= axis < len(shape):
        layer.fail(f"{key} {axis} is out of range for the {len(shape)}-D bottom {shape_str(shape)}")
    return axis % len(shape)


def _span(layer, shape, axis, num_axes, key="num_axes"):
    """``(outer, middle, inner)`` sizes of ``shape`` around dims ``axis .. axis + num_axes``
    (``num_axes`` -1: to the end)."""
    end = len(shape) if num_axes == -1 else axis + num_axes
    if num_axes < -1 or end > len(shape):
        layer.fail(f"{key} {num_axes} from axis {axis} is out of range for the bottom {shape_str(shape)}")
    return (math.prod(shape[:axis]), math.prod(shape[axis:end]), math.prod(shape[end:])), tuple(shape[axis:end])


@register
class Bias(Layer):
    """``y = x + b``, ``b`` broadcast over the dims of ``x`` outside ``axis .. axis + num_axes``:
    a learned parameter (one bottom) or the second bottom (whose shape is those dims). The
    backward reads nothing, so it may run in place."""

    KEYS = {"axis": Key("int", 1), "num_axes": Key("int", 1, doc="-1: every dim from axis on"),
            "filler": Key("filler", {"type": "constant", "value": 0.0})}
    BOTTOMS = (1, 2)
    INPLACE = True
    CHEAP = True

    def setup(self, bottom_shapes):
        shape = tuple(bottom_shapes[0])
        axis = _axis(self, shape, self.cfg["axis"]) if shape else 0
        if len(bottom_shapes) == 2:
            bias = tuple(bottom_shapes[1])
            if shape[axis:axis + len(bias)] != bias:
                self.fail(f"the bias {shape_str(bias)} does not match the bottom {shape_str(shape)} "
                          f"from axis {axis}")
            self.span, self.bias_shape = _span(self, shape, axis, len(bias))
        else:
            self.span, self.bias_shape = _span(self, shape, axis, self.cfg["num_axes"])
        return [shape]

    def param_specs(self):
        if len(self.bottoms) == 2:
            return []
        return [ParamSpec("bias", self.bias_shape or (1,), self.cfg["filler"])]

    def backward_reads(self):
        return (), ()

    def forward(self, ctx, bottoms, tops, params):
        b = bottoms[1] if len(bottoms) == 2 else params["bias"]
        ctx.xp.add(bottoms[0].reshape(self.span), b.reshape(1, -1, 1), out=tops[0].reshape(self.span))

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dy = top_grads[0]
        db = bottom_grads[1] if len(self.bottoms) == 2 else param_grads.get("bias")
        if db is not None:  # before dx: dx may be dy itself, and is the same values anyway
            ctx.xp.sum(dy.reshape(self.span), axis=(0, 2), out=db.reshape(-1))
        dx = bottom_grads[0]
        if dx is not None and not ctx.xp.may_share_memory(dx, dy):
            ctx.xp.copyto(dx, dy)


@register
class MVN(Layer):
    """Mean-variance normalization: each sample's values per channel (or across the channels)
    less their mean, divided by ``std + eps`` when ``normalize_variance``. Caffe's backward
    ``(dy - mean(dy) - y * mean(dy * y)) / (std + eps)``; it reads the bottom to find the std
    again (without ``normalize_variance`` it reads nothing and runs in place)."""

    KEYS = {"normalize_variance": Key("bool", True), "across_channels": Key("bool", False),
            "eps": Key("float", 1e-9)}
    CHEAP = True

    def __init__(self, name, bottoms, tops, cfg, dtype=np.float32):
        super().__init__(name, bottoms, tops, cfg, dtype)
        self.INPLACE = not cfg["normalize_variance"]

    def setup(self, bottom_shapes):
        shape = tuple(bottom_shapes[0])
        if len(shape) < 2:
            self.fail(f"needs a bottom of at least 2 dims (N, C, ...), got {shape_str(shape)}")
        first = 1 if self.cfg["across_channels"] else 2
        self.rows = (math.prod(shape[:first]), math.prod(shape[first:]))
        return [shape]

    def backward_reads(self):
        return ((0,), ()) if self.cfg["normalize_variance"] else ((), ())

    def algorithms(self, phase):
        rows = ((self.rows[0], 1), self.dtype)
        full = (self.rows, self.dtype)
        if not self.cfg["normalize_variance"]:
            return [Algo("default", workspace_bytes(rows))]
        if phase == "forward":
            return [Algo("default", workspace_bytes(rows, rows, full))]
        return [Algo("default", workspace_bytes(full, rows, rows, full))]

    def _normalise(self, ctx, x, y):
        """``y = (x - mean) / (std + eps)`` (or ``x - mean``); returns ``(std + eps, room,
        square)``: the (rows, 1) divisor, and a (rows, 1) and a full scratch now free."""
        xp = ctx.xp
        mean = ctx.scratch((self.rows[0], 1), self.dtype)
        xp.mean(x, axis=1, keepdims=True, out=mean)
        xp.subtract(x, mean, out=y)
        if not self.cfg["normalize_variance"]:
            return None, mean, None
        std = ctx.scratch((self.rows[0], 1), self.dtype)
        square = xp.multiply(y, y, out=ctx.scratch(self.rows, self.dtype))
        xp.mean(square, axis=1, keepdims=True, out=std)
        xp.sqrt(std, out=std)
        std += self.cfg["eps"]
        y /= std
        return std, mean, square

    def forward(self, ctx, bottoms, tops, params):
        self._normalise(ctx, bottoms[0].reshape(self.rows), tops[0].reshape(self.rows))

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is None:
            return
        xp, dy, dx = ctx.xp, top_grads[0].reshape(self.rows), dx.reshape(self.rows)
        if not self.cfg["normalize_variance"]:
            mean = ctx.scratch((self.rows[0], 1), self.dtype)
            xp.mean(dy, axis=1, keepdims=True, out=mean)
            xp.subtract(dy, mean, out=dx)  # dx may be dy: the mean is taken first
            return
        y = ctx.scratch(self.rows, self.dtype)
        std, mean, product = self._normalise(ctx, bottoms[0].reshape(self.rows), y)
        xp.multiply(dy, y, out=product)
        xp.mean(product, axis=1, keepdims=True, out=mean)
        xp.multiply(y, mean, out=product)   # y * mean(dy * y)
        xp.mean(dy, axis=1, keepdims=True, out=mean)
        xp.subtract(dy, mean, out=dx)
        dx -= product
        dx /= std


@register
class Reduction(Layer):
    """The bottom's dims from ``axis`` on reduced to one number by ``operation`` (SUM, ASUM:
    the sum of absolute values, SUMSQ: of squares, MEAN), times ``coeff``: the top has the
    dims before ``axis`` (0-d for axis 0)."""

    KEYS = {"operation": Key("str", "SUM", choices=("SUM", "ASUM", "SUMSQ", "MEAN")),
            "axis": Key("int", 0), "coeff": Key("float", 1.0)}
    CHEAP = True

    def setup(self, bottom_shapes):
        shape = tuple(bottom_shapes[0])
        axis = _axis(self, shape, self.cfg["axis"]) if shape else 0
        self.rows = (math.prod(shape[:axis]), math.prod(shape[axis:]))
        return [shape[:axis]]

    def backward_reads(self):
        return ((0,), ()) if self.cfg["operation"] in ("ASUM", "SUMSQ") else ((), ())

    def algorithms(self, phase):
        if phase == "forward" and self.cfg["operation"] in ("ASUM", "SUMSQ"):
            return [Algo("default", workspace_bytes((self.rows, self.dtype)))]
        return [Algo("default", 0)]

    def forward(self, ctx, bottoms, tops, params):
        xp, x, op = ctx.xp, bottoms[0].reshape(self.rows), self.cfg["operation"]
        y = tops[0].reshape(self.rows[0])
        if op in ("ASUM", "SUMSQ"):
            work = ctx.scratch(self.rows, self.dtype)
            xp.abs(x, out=work) if op == "ASUM" else xp.multiply(x, x, out=work)
            x = work
        xp.sum(x, axis=1, out=y)
        y *= self.cfg["coeff"] / (self.rows[1] if op == "MEAN" else 1)

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is None:
            return
        xp, op, dx = ctx.xp, self.cfg["operation"], dx.reshape(self.rows)
        dy = top_grads[0].reshape(self.rows[0], 1)
        scale = self.cfg["coeff"] / (self.rows[1] if op == "MEAN" else 1) * (2 if op == "SUMSQ" else 1)
        if op == "ASUM":
            xp.sign(bottoms[0].reshape(self.rows), out=dx)
        elif op == "SUMSQ":
            xp.copyto(dx, bottoms[0].reshape(self.rows))
        else:
            dx.fill(1)
        dx *= dy
        dx *= scale


@register
class Tile(Layer):
    """The bottom repeated ``tiles`` times along ``axis`` (Caffe's: the whole block of dims from
    ``axis`` on, one copy after another). The backward sums the copies; it reads nothing."""

    KEYS = {"axis": Key("int", 1), "tiles": Key("int")}
    CHEAP = True

    def setup(self, bottom_shapes):
        shape, tiles = tuple(bottom_shapes[0]), self.cfg["tiles"]
        if tiles < 1:
            self.fail(f"tiles must be at least 1, got {tiles}")
        axis = _axis(self, shape, self.cfg["axis"])
        self.block = (math.prod(shape[:axis]), 1, math.prod(shape[axis:]))
        return [shape[:axis] + (shape[axis] * tiles,) + shape[axis + 1:]]

    def backward_reads(self):
        return (), ()

    def cost(self):
        n = math.prod(self.top_shapes[0])
        return Cost(0.0, float(n), 2.0 * n * self.dtype.itemsize, 2.0 * n * self.dtype.itemsize)

    def forward(self, ctx, bottoms, tops, params):
        outer, _, inner = self.block
        y = tops[0].reshape(outer, self.cfg["tiles"], inner)
        ctx.xp.copyto(y, bottoms[0].reshape(self.block))

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is not None:
            outer, _, inner = self.block
            ctx.xp.sum(top_grads[0].reshape(outer, self.cfg["tiles"], inner), axis=1, out=dx.reshape(outer, inner))


@register
class Crop(Layer):
    """The first bottom cut to the second's dims from ``axis`` on, starting at ``offset`` (none:
    0; one: every cropped dim; else one per cropped dim), as FCN crops its upsampled scores to
    the image. The second bottom gives only its shape: it gets no gradient."""

    KEYS = {"axis": Key("int", 2), "offset": Key("ints", ())}
    BOTTOMS = (2, 2)
    LABEL_BOTTOMS = (1,)
    CHEAP = True

    def setup(self, bottom_shapes):
        shape, ref = (tuple(s) for s in bottom_shapes)
        if len(shape) != len(ref):
            self.fail(f"bottoms {shape_str(shape)} and {shape_str(ref)} differ in their number of dims")
        axis = _axis(self, shape, self.cfg["axis"])
        offsets = self.cfg["offset"]
        cropped = len(shape) - axis
        if len(offsets) not in (0, 1, cropped):
            self.fail(f"{len(offsets)} offsets for {cropped} cropped dims: give none, one, or one per dim")
        offsets = (0,) * cropped if not offsets else offsets * cropped if len(offsets) == 1 else offsets
        top = list(shape)
        self.part = [slice(None)] * axis
        for i, off in enumerate(offsets):
            d = axis + i
            if off < 0 or off + ref[d] > shape[d]:
                self.fail(f"offset {off} and size {ref[d]} on dim {d} do not fit the bottom {shape_str(shape)}")
            top[d] = ref[d]
            self.part.append(slice(off, off + ref[d]))
        self.part = tuple(self.part)
        return [tuple(top)]

    def backward_reads(self):
        return (), ()

    def cost(self):
        n = math.prod(self.top_shapes[0])
        whole = math.prod(self.bottom_shapes[0])
        return Cost(0.0, 0.0, 2.0 * n * self.dtype.itemsize, (whole + 2.0 * n) * self.dtype.itemsize)

    def forward(self, ctx, bottoms, tops, params):
        ctx.xp.copyto(tops[0], bottoms[0][self.part])

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is not None:
            dx.fill(0)
            ctx.xp.copyto(dx[self.part], top_grads[0])


@register
class BatchReindex(Layer):
    """``y = x[permut]``: the samples of the first bottom in the order the second lists (their
    indices as numbers; one may come twice or not at all). The backward adds each top sample's
    gradient to the sample it came from; it reads the indices."""

    BOTTOMS = (2, 2)
    LABEL_BOTTOMS = (1,)
    CHEAP = True

    def setup(self, bottom_shapes):
        shape, order = (tuple(s) for s in bottom_shapes)
        if len(order) != 1 or not shape:
            self.fail(f"the indices must be 1-D and the data have a batch dim, got {shape_str(order)} "
                      f"and {shape_str(shape)}")
        return [order + shape[1:]]

    def backward_reads(self):
        return (1,), ()

    def algorithms(self, phase):
        return [Algo("default", workspace_bytes((self.bottom_shapes[1], np.int64)))]

    def _indices(self, ctx, order):
        idx = ctx.scratch(order.shape, np.int64)
        ctx.xp.copyto(idx, order, casting="unsafe")
        n = self.bottom_shapes[0][0]
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
            self.fail(f"an index is outside [0, {n}): {int(idx.min())} .. {int(idx.max())}")
        return idx

    def forward(self, ctx, bottoms, tops, params):
        idx = self._indices(ctx, bottoms[1])
        if ctx.xp is np:  # checked above: no bounds-checking buffer (NumPy's default makes one)
            np.take(bottoms[0], idx, axis=0, out=tops[0], mode="clip")
        else:
            ctx.xp.take(bottoms[0], idx, axis=0, out=tops[0])

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is None:
            return
        dx.fill(0)
        ctx.xp.add.at(dx, self._indices(ctx, bottoms[1]), top_grads[0])
