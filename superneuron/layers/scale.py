"""Scale: ``y = x * weight (+ bias)`` per index of one axis (Caffe's affine map after a
BatchNorm, which may write it in its own pass: BatchNorm.fuses_scale). Its kernels view the
bottom as ``(N, C, L)`` as BatchNorm's do, and take their per-channel sums the same way
(norm.py)."""

import numpy as np

from . import cuda_kernels as cuda
from . import parallel
from .base import Algo, Cost, Key, Layer, ParamSpec, workspace_bytes
from .norm import _channel_dot, _channel_sum, axis_setup
from .registry import register


@register
class Scale(Layer):
    """``y = x * weight (+ bias)``, one weight (and bias) per index of ``axis``, broadcast over
    the other dims. Its backward reads its bottom (for the weight gradient): its top is not in
    place (unless the net file writes it so and nothing else reads the bottom), its gradient
    may be."""

    KEYS = {
        "axis": Key("int", 1, doc="the axis the weight runs along (negative counts from the end)"),
        "bias_term": Key("bool", False),
        "filler": Key("filler", {"type": "constant", "value": 1}, doc="initial weight"),
        "bias_filler": Key("filler", "constant", doc="initial bias"),
    }
    CHEAP = True

    def setup(self, bottom_shapes):
        return axis_setup(self, bottom_shapes)

    def param_specs(self):
        c = (self.ncl[1],)
        specs = [ParamSpec("weight", c, self.cfg["filler"])]
        if self.cfg["bias_term"]:
            specs.append(ParamSpec("bias", c, self.cfg["bias_filler"]))
        return specs

    def backward_reads(self):
        return (0,), ()

    def grad_inplace(self):
        return [(0, 0)]  # dx = dy * weight, each channel's dy read (for the sums) before its dx

    def cost(self):
        """Passes over the map as the GPU's kernels make them: the forward reads x and writes
        y; the backward reads dy and x for the parameters' sums, then dy again for dx, which it
        writes (four passes, where an elementwise layer's backward makes three)."""
        n, item = float(np.prod(self.ncl)), self.dtype.itemsize
        return Cost(n, 2 * n, 2 * n * item, 4 * n * item)

    def algorithms(self, phase):
        if phase == "forward":
            return [Algo("default", 0)]
        return [Algo("default", workspace_bytes((self.ncl[:2], self.dtype)))]

    def fuses_relu(self):
        return True

    def forward(self, ctx, bottoms, tops, params):
        xp, relu = ctx.xp, ctx.relu
        y = tops[0].reshape(self.ncl)
        if cuda.on_gpu(xp):
            n, c, l = self.ncl
            then = "_relu" if relu else ""
            if self.cfg["bias_term"]:
                cuda.kernel("scale_bias" + then)(bottoms[0].reshape(self.ncl), params["weight"], params["bias"],
                                                 l, c, y)
            else:
                cuda.kernel("scale" + then)(bottoms[0].reshape(self.ncl), params["weight"], l, c, y)
            return
        x, (n, c, l) = bottoms[0].reshape(self.ncl), self.ncl
        parallel.run(lambda a, b: self.forward_channels(xp, x, y, params, relu, a, b), c, n * l, xp)

    def forward_channels(self, xp, x, y, params, relu, a, b):
        """The host forward of channels ``a`` to ``b`` of ``x`` into ``y`` (both (N, C, L)), then
        its ReLU where ``relu``: samples CACHE_BYTES at a time, each in cache for it. One block
        of :meth:`forward`'s, and what a BatchNorm's forward runs on the channels it has just
        normalised (ctx.scale)."""
        n, _, l = self.ncl
        weight, bias = params["weight"], params.get("bias")
        row = (b - a) * l
        step = max(1, parallel.CACHE_BYTES // (row * self.dtype.itemsize)) if relu else n
        zero = parallel.constant(0, row, self.dtype) if relu else None
        for s in range(0, n, step):
            ys = xp.multiply(x[s:s + step, a:b], weight[a:b, None], out=y[s:s + step, a:b])
            if bias is not None:
                ys += bias[a:b, None]
            if relu:
                rows = ys.view()
                rows.shape = (len(ys), row)  # a view of each sample's channels, never a copy (it raises)
                xp.maximum(rows, zero, out=rows)

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        xp = ctx.xp
        dy, x = top_grads[0].reshape(self.ncl), bottoms[0].reshape(self.ncl)
        n, c, l = self.ncl
        splits = cuda.splits_for(self.ncl, n * c * self.dtype.itemsize) if cuda.on_gpu(xp) else 0
        if splits:  # both parameter gradients in one pass, dx in another
            words = ctx.scratch((2 * (splits + 1) * c,), np.float64)
            sums = cuda.channel_sums(dy, x, "av * bv", "av", self.ncl, words, splits)
            xp.copyto(param_grads["weight"], sums[0], casting="same_kind")
            if self.cfg["bias_term"]:
                xp.copyto(param_grads["bias"], sums[1], casting="same_kind")
            if bottom_grads[0] is not None:
                cuda.kernel("scale")(dy, params["weight"], l, c, bottom_grads[0].reshape(self.ncl))
            return
        room, weight = ctx.scratch((n * c,), self.dtype), params["weight"]
        dw, db = param_grads["weight"], param_grads.get("bias")
        dx = None if bottom_grads[0] is None else bottom_grads[0].reshape(self.ncl)

        def block(a, b):  # channels a..b; dy and x read before dx (which may be dy) is written
            dys = dy[:, a:b]
            _channel_dot(xp, dys, x[:, a:b], room[a * n:b * n], out=dw[a:b])
            if db is not None:
                _channel_sum(xp, dys, room[a * n:b * n], out=db[a:b])
            if dx is not None:
                xp.multiply(dys, weight[a:b, None], out=dx[:, a:b])
        parallel.run(block, c, n * l, xp)
