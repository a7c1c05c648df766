"""Eltwise, Concat and Split: layers that join several tensors into one, or fan one out.

The graph inserts a Split wherever a tensor feeds several layers (as Caffe does), and a network
file may write one too. Its tops are views of its bottom, so its forward costs nothing, and its
backward is the one place where the gradients of the readers are summed.
"""

import numpy as np

from . import cuda_kernels as cuda
from . import parallel
from .base import Algo, Cost, Key, Layer, workspace_bytes
from .registry import register


def _add_relu(a, b, out):
    """``out = max(a + b, 0)`` over one flat slice, parallel.CACHE_BYTES at a time: the sum
    still in cache for the ReLU."""
    step = parallel.CACHE_BYTES // out.itemsize
    for s in range(0, out.size, step):
        chunk = out[s:s + step]
        np.add(a[s:s + step], b[s:s + step], out=chunk)
        parallel.max_zero(chunk, chunk)


def shape_str(shape):
    """``(8,256,56,56)``: a shape as error messages write it."""
    return "(" + ",".join(str(d) for d in shape) + ")"


@register
class Eltwise(Layer):
    """Elementwise ``SUM`` (optionally weighted by ``coeff``), ``PROD`` or ``MAX`` of bottoms of
    one shape. ``MAX`` sends each gradient to the first bottom holding the maximum.

    Not in place: a PROD or MAX backward reads its bottoms (a SUM backward reads nothing and
    could be, but ``INPLACE`` is declared per class). A SUM's gradients may be: one bottom's
    gradient may take the top gradient's memory (it is written last)."""

    KEYS = {
        "operation": Key("str", "SUM", choices=("SUM", "PROD", "MAX")),
        "coeff": Key("floats", (), doc="one weight per bottom (SUM only); default all 1"),
    }
    BOTTOMS = (2, None)
    CHEAP = True

    def setup(self, bottom_shapes):
        shapes = [tuple(s) for s in bottom_shapes]
        for s in shapes[1:]:
            if s != shapes[0]:
                self.fail(f"bottoms {shape_str(shapes[0])} and {shape_str(s)} differ")
        op, coeff = self.cfg["operation"], self.cfg["coeff"]
        if coeff and op != "SUM":
            self.fail(f"coeff is only allowed with operation SUM, not {op}")
        if coeff and len(coeff) != len(shapes):
            self.fail(f"{len(coeff)} coeff value(s) for {len(shapes)} bottoms")
        return [shapes[0]]

    def _coeffs(self):
        return self.cfg["coeff"] or (1.0,) * len(self.bottom_shapes)

    def _one_pass(self):
        """A plain sum of two bottoms: one pass over memory (ResNet's shortcut)."""
        return self.cfg["operation"] == "SUM" and len(self.bottom_shapes) == 2 and self._coeffs() == (1.0, 1.0)

    def fuses_relu(self):
        return self._one_pass()

    def grad_inplace(self):
        return [(i, 0) for i in range(len(self.bottoms))] if self.cfg["operation"] == "SUM" else []

    def backward_reads(self):
        op = self.cfg["operation"]
        if op == "SUM":
            return (), ()
        return tuple(range(len(self.bottoms))), ((0,) if op == "MAX" else ())

    def algorithms(self, phase):
        shape, op = self.bottom_shapes[0], self.cfg["operation"]
        if phase == "forward" and op == "SUM" and any(c not in (1.0, -1.0) for c in self._coeffs()[1:]):
            return [Algo("default", workspace_bytes((shape, self.dtype)))]  # coeff * x
        if phase == "backward" and op == "MAX":
            return [Algo("default", workspace_bytes((shape, np.bool_), (shape, np.bool_)))]
        return [Algo("default", 0)]

    def cost(self):
        n, k = int(np.prod(self.bottom_shapes[0])), len(self.bottom_shapes)
        item = self.dtype.itemsize
        return Cost(float(n * k), float(n * k * k), float((k + 1) * n * item), float(2 * (k + 1) * n * item))

    def forward(self, ctx, bottoms, tops, params):
        xp, op, y = ctx.xp, self.cfg["operation"], tops[0]
        if op == "PROD":
            xp.multiply(bottoms[0], bottoms[1], out=y)
            for x in bottoms[2:]:
                y *= x
        elif op == "MAX":
            xp.maximum(bottoms[0], bottoms[1], out=y)
            for x in bottoms[2:]:
                xp.maximum(y, x, out=y)
        elif self._one_pass():  # ResNet's shortcut (and the ReLU after it, with ctx.relu)
            if ctx.relu and cuda.on_gpu(xp):
                cuda.kernel("add_relu")(bottoms[0], bottoms[1], y)
            elif ctx.relu:
                parallel.elementwise(_add_relu, (bottoms[0], bottoms[1], y), xp)
            else:
                parallel.elementwise(lambda a, b, out: xp.add(a, b, out=out), (bottoms[0], bottoms[1], y), xp)
        else:
            coeffs = self._coeffs()
            xp.multiply(bottoms[0], coeffs[0], out=y)
            tmp = None
            for c, x in zip(coeffs[1:], bottoms[1:], strict=True):
                if c == 1.0:
                    y += x
                elif c == -1.0:
                    y -= x
                else:
                    tmp = ctx.scratch(x.shape, self.dtype) if tmp is None else tmp
                    y += xp.multiply(x, c, out=tmp)

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        xp, op, dy = ctx.xp, self.cfg["operation"], top_grads[0]
        if op == "SUM":
            pairs = list(zip(self._coeffs(), bottom_grads, strict=True))
            pairs.sort(key=lambda p: p[1] is not None and xp.may_share_memory(p[1], dy))  # dy's own last
            for c, dx in pairs:
                if dx is None or (c == 1.0 and xp.may_share_memory(dx, dy)):
                    continue  # a gradient that is dy's memory already holds dy
                if c == 1.0:
                    parallel.elementwise(lambda d, out: xp.copyto(out, d), (dy, dx), xp)
                else:
                    xp.multiply(dy, c, out=dx)
        elif op == "PROD":
            for i, dx in enumerate(bottom_grads):
                if dx is None:
                    continue
                others = [x for j, x in enumerate(bottoms) if j != i]
                xp.multiply(dy, others[0], out=dx)
                for x in others[1:]:
                    dx *= x
        else:
            taken = ctx.scratch(dy.shape, np.bool_)  # some earlier bottom already had the max
            hit = ctx.scratch(dy.shape, np.bool_)
            taken[...] = False
            for x, dx in zip(bottoms, bottom_grads, strict=True):
                xp.equal(x, tops[0], out=hit)
                xp.greater(hit, taken, out=hit)  # hit and not taken
                if dx is not None:
                    xp.multiply(dy, hit, out=dx)
                xp.logical_or(taken, hit, out=taken)


@register
class Concat(Layer):
    """Bottoms joined along ``axis``; their shapes must agree on every other axis."""

    KEYS = {"axis": Key("int", 1, doc="the axis to join along (negative counts from the end)")}
    BOTTOMS = (1, None)
    CHEAP = True

    def setup(self, bottom_shapes):
        shapes = [tuple(s) for s in bottom_shapes]
        first, axis = shapes[0], self.cfg["axis"]
        if not -len(first) <= axis < len(first):
            self.fail(f"axis {axis} is out of range for the {len(first)}-D bottom {shape_str(first)}")
        axis %= len(first)
        for s in shapes[1:]:
            if len(s) != len(first) or s[:axis] + s[axis + 1:] != first[:axis] + first[axis + 1:]:
                self.fail(f"bottoms {shape_str(first)} and {shape_str(s)} differ outside axis {axis}")
        self.axis = axis
        return [first[:axis] + (sum(s[axis] for s in shapes),) + first[axis + 1:]]

    def backward_reads(self):
        return (), ()

    def cost(self):
        n = int(np.prod(self.top_shapes[0]))
        return Cost(0.0, 0.0, 2.0 * n * self.dtype.itemsize, 2.0 * n * self.dtype.itemsize)

    def _slices(self):
        """The index of each bottom's part of the top."""
        start = 0
        for s in self.bottom_shapes:
            yield (slice(None),) * self.axis + (slice(start, start + s[self.axis]),)
            start += s[self.axis]

    def forward(self, ctx, bottoms, tops, params):
        for x, part in zip(bottoms, self._slices(), strict=True):
            ctx.xp.copyto(tops[0][part], x)

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        for dx, part in zip(bottom_grads, self._slices(), strict=True):
            if dx is not None:
                ctx.xp.copyto(dx, top_grads[0][part])


@register
class Split(Layer):
    """One bottom read by several layers (inserted by the graph, or written in a network file as
    in Caffe): each top is a view of the bottom, and the bottom's gradient is the sum of the
    tops' gradients."""

    BOTTOMS = (1, 1)
    TOPS = (1, None)
    ALIAS_TOPS = True
    CHEAP = True

    def setup(self, bottom_shapes):
        return [tuple(bottom_shapes[0])] * len(self.tops)

    def backward_reads(self):
        return (), ()

    def grad_inplace(self):
        # The sum starts as gradient 0 + gradient 1 (the first two given): either may be its
        # memory; a later one would be overwritten before it is added.
        return [(0, 0), (0, 1)]

    def cost(self):
        n, k = int(np.prod(self.bottom_shapes[0])), len(self.top_shapes)
        return Cost(0.0, float(n * (k - 1)), 0.0, float((k + 1) * n * self.dtype.itemsize))

    def forward(self, ctx, bottoms, tops, params):
        # The runtime makes the tops views of the bottom and skips this; elsewhere (tests, the
        # Python API) the tops may be arrays of their own.
        for y in tops:
            if not ctx.xp.may_share_memory(y, bottoms[0]):
                ctx.xp.copyto(y, bottoms[0])

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        xp, dx = ctx.xp, bottom_grads[0]
        if dx is None:
            return
        grads = [g for g in top_grads if g is not None]
        if not grads:
            dx[...] = 0
        elif len(grads) == 1:
            if not xp.may_share_memory(dx, grads[0]):
                xp.copyto(dx, grads[0])
        else:
            def block(dxs, *gs):
                xp.add(gs[0], gs[1], out=dxs)
                for g in gs[2:]:
                    dxs += g
            parallel.elementwise(block, (dx, *grads), xp)
