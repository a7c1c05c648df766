"""BatchNorm: normalisation over the channel axis (axis 1), and the per-channel helpers it
shares with Scale (scale.py); LRN is in lrn.py.

As in Caffe, BatchNorm only normalises (``x_hat = (x - mean) / sqrt(var + eps)``) and the
learned per-channel affine map is a separate Scale layer after it. Every kernel views its
bottom as ``(N, C, L)``: the dims before the channel axis, the channels, and the dims after it
flattened, so one code path serves ``(N, C)`` and ``(N, C, H, W)`` bottoms.

Per-channel sums of a product (``sum over N, L of a * b``) are taken as N*C small dot products
by one batched ``matmul`` into an (N, C) scratch, so no bottom-sized product is formed; on the
CPU plain per-channel sums are taken the same way, against a row of ones, which runs about
three times as fast as NumPy's ``sum(axis=(0, 2))`` (see :func:`_channel_sum`).
"""

import collections

import numpy as np

from . import cuda_kernels as cuda
from . import parallel
from .base import Algo, Cost, Key, Layer, ParamSpec, workspace_bytes
from .fillers import parse_filler
from .join import shape_str
from .registry import register

ScaleAfter = collections.namedtuple("ScaleAfter", "layer params top")
ScaleAfter.__doc__ = """What a BatchNorm's forward writes beside its own top (``ctx.scale``,
Layer.fuses_scale): the Scale ``layer`` over it, that Scale's ``params`` and its ``top``."""


def _ncl(shape, axis=1):
    """``(N, C, L)``: the sizes before, at and after ``axis``."""
    return (int(np.prod(shape[:axis], dtype=np.int64)), int(shape[axis]),
            int(np.prod(shape[axis + 1:], dtype=np.int64)))


def axis_setup(layer, bottom_shapes):
    """Setup of a shape-keeping layer along ``cfg['axis']``: checks the axis, sets
    ``layer.ncl`` and returns the top shapes (the bottom's)."""
    shape, axis = tuple(bottom_shapes[0]), layer.cfg["axis"]
    if not -len(shape) <= axis < len(shape):
        layer.fail(f"axis {axis} is out of range for the {len(shape)}-D bottom {shape_str(shape)}")
    layer.ncl = _ncl(shape, axis % len(shape))
    return [shape]


def _channel_dot(xp, a, b, scratch, out=None):
    """``sum(a * b)`` over axes 0 and 2 of two (N, C, L) arrays, through an N*C scratch."""
    n, c, _ = a.shape
    scratch = scratch.reshape(n, c)
    xp.matmul(a[:, :, None, :], b[:, :, :, None], out=scratch.reshape(n, c, 1, 1))
    return scratch.sum(axis=0, out=out)


def _channel_sum(xp, a, scratch, out=None):
    """``sum(a)`` over axes 0 and 2 of an (N, C, L) array: on the CPU N*C dot products with a
    row of ones through an N*C scratch (each a dot product of its own, so the bits do not
    depend on how the channels are split over threads), elsewhere NumPy's sum."""
    if xp is not np:
        return a.sum(axis=(0, 2), out=out)
    n, c, l = a.shape
    scratch = scratch.reshape(n, c)
    np.matmul(a[:, :, None, :], parallel.constant(1, l, a.dtype)[:, None], out=scratch.reshape(n, c, 1, 1))
    return scratch.sum(axis=0, out=out)


@register
class BatchNorm(Layer):
    """Normalise each channel by its batch statistics (training) or by running statistics
    (``use_global_stats``, and always outside training); no scale or shift (see Scale).

    The running statistics are Caffe's three blobs: ``mean`` and ``variance`` hold decayed
    sums, ``sum <- f * sum + batch`` (unbiased batch variance), and ``scale_factor`` holds
    ``s <- f * s + 1``; at use they are divided by ``s``, which makes them an unbiased moving
    average from the first iteration (a plain ``f * running + (1 - f) * batch`` from 0 and 1
    stays mostly its initial value for thousands of iterations). They are updated once per
    iteration: a recomputed forward (``ctx.recompute``) leaves them alone.
    The backward reads only the top (x_hat) and the per-channel ``saved_invstd`` that the
    forward keeps, so the layer may run in place. The forward keeps the batch's mean too
    (``saved_mean``, scratch that snapshots leave out): a recomputation (``ctx.recompute``)
    normalises with the two in one pass over its bottom, where the forward takes two (the
    sums, then x_hat), and without the all-reduces of synchronised statistics: the same
    operations on the same values, so the same bits.

    Data-parallel training keeps each rank's statistics (as Caffe); with ``ctx.ranks`` (sn-train
    --sync-bn) the statistics and the backward's two sums are those of the global batch, summed
    over the ranks (:meth:`_forward_synced`): two all-reduces in the forward, one in the
    backward, made here, inside the layer (README: why they are not steps of the plan)."""

    KEYS = {
        "use_global_stats": Key("bool", False, doc="normalise with the running statistics even "
                                "in training (they are always used outside training)"),
        "moving_average_fraction": Key("float", 0.999, doc="f in sum = f*sum + batch, s = f*s + 1"),
        "eps": Key("float", 1e-5, doc="added to the variance"),
    }
    INPLACE = True
    CHEAP = True
    CHUNK_BYTES = 8 << 20  # the backward's ``chunked``: the most bytes of its temporary (whole channels)
    CHUNKED_SPEED = 0.95   # its relative speed: more, smaller calls (the cost model's weighing)

    def setup(self, bottom_shapes):
        shape = tuple(bottom_shapes[0])
        if len(shape) < 2:
            self.fail(f"needs a bottom of at least 2 dims (N, C, ...), got {shape_str(shape)}")
        f, eps = self.cfg["moving_average_fraction"], self.cfg["eps"]
        if not 0.0 <= f <= 1.0:
            self.fail(f"moving_average_fraction must be in [0, 1], got {f}")
        if eps <= 0:
            self.fail(f"eps must be > 0, got {eps}")
        self.ncl = _ncl(shape)
        return [shape]

    def param_specs(self):
        c, zero = (self.ncl[1],), parse_filler({"type": "constant", "value": 0})
        # Caffe's blobs in Caffe's order (all zero at start), then the backward's own state
        return [ParamSpec("mean", c, zero, learnable=False),
                ParamSpec("variance", c, zero, learnable=False),
                ParamSpec("scale_factor", (1,), zero, learnable=False),
                ParamSpec("saved_invstd", c, parse_filler({"type": "constant", "value": 1}),
                          learnable=False),
                ParamSpec("saved_mean", c, zero, learnable=False, kept=False)]

    def running_stats(self, xp, params):
        """``(mean, variance)``: the running sums divided by the scale factor (0 before any
        update, as Caffe)."""
        s = params["scale_factor"]
        factor = xp.where(s == 0, 0.0, 1.0 / xp.where(s == 0, 1.0, s)).astype(self.dtype)
        return params["mean"] * factor, params["variance"] * factor

    def backward_reads(self):
        return (), (0,)

    def cost(self):
        """Passes over the map as the GPU's kernels make them: the training forward reads x
        twice (the sums, then x_hat) and writes x_hat; a recomputation, from the saved
        statistics, reads it once; the backward reads dy and x_hat for its sums, then both
        again for dx."""
        n, item = float(np.prod(self.ncl)), self.dtype.itemsize
        reads = 1 if self.cfg["use_global_stats"] else 2
        return Cost(n, 2 * n, (reads + 1) * n * item, 5 * n * item, rec_flops=n, rec_bytes=2 * n * item)

    def algorithms(self, phase):
        if self.cfg["use_global_stats"]:
            return [Algo("default", 0)]
        if phase == "forward":  # the per-sample variance terms
            return [Algo("default", workspace_bytes((self.ncl[:2], self.dtype)))]
        # the backward: a bottom-sized product, since the bottom gradient may be the top
        # gradient itself; ``chunked``: a few channels' at a time (the same bits: every sum is
        # a channel's own), or the GPU's partial sums, whichever is more
        n, c, l = self.ncl
        algos = [Algo("default", workspace_bytes((self.ncl, self.dtype)))]
        if self._chunk() < c:
            room = max(workspace_bytes(((n, self._chunk(), l), self.dtype)), cuda.sums_bytes(self.ncl))
            algos.append(Algo("chunked", room, self.CHUNKED_SPEED))
        return algos

    def _chunk(self):
        """The channels the backward's ``chunked`` takes at a time (one at least)."""
        n, c, l = self.ncl
        return min(c, max(1, self.CHUNK_BYTES // max(1, n * l * self.dtype.itemsize)))

    def _global(self, ctx):
        return self.cfg["use_global_stats"] or not ctx.train

    def fuses_scale(self, scale):
        """In training with batch statistics, over a Scale that sees the same (N, C, L): the
        CPU's and the GPU's forwards write the Scale's top channel by channel from the values
        normalised in hand (one pass on the GPU: x read, x_hat and the Scale's top written).
        Synchronised BatchNorm (ranks) and a GPU batch too small for the per-channel sums run
        the Scale's forward after their own (the same bits, a pass more); a recomputation
        writes it in its one pass on every path."""
        return not self.cfg["use_global_stats"] and scale.ncl == self.ncl

    def forward(self, ctx, bottoms, tops, params):
        xp, eps = ctx.xp, self.cfg["eps"]
        x, y = bottoms[0].reshape(self.ncl), tops[0].reshape(self.ncl)
        if self._global(ctx):
            mean, var = self.running_stats(xp, params)
            invstd = 1.0 / xp.sqrt(var + eps)
            xp.subtract(x, mean[:, None], out=y)
            y *= invstd[:, None]
            return
        if ctx.recompute:
            self._normalize(ctx, x, y, params)
            return
        n, c, l = self.ncl
        m = n * l
        if ctx.ranks is not None:
            mean, var, m = self._forward_synced(ctx, x, y, params)
            self._scale_after(ctx, y)
        elif cuda.on_gpu(xp) and self._forward_fused(ctx, x, y, params):
            return
        elif xp is np:  # channels split over the cores
            mean, var = params["saved_mean"], np.empty(c, self.dtype)
            self._forward_cpu(ctx, x, y, mean, var, params["saved_invstd"])
        else:
            mean = params["saved_mean"]
            mean[...] = x.mean(axis=(0, 2))
            xp.subtract(x, mean[:, None], out=y)
            var = _channel_dot(xp, y, y, ctx.scratch((n, c), self.dtype)) / m  # biased
            invstd = params["saved_invstd"]
            xp.sqrt(var + eps, out=invstd)
            xp.reciprocal(invstd, out=invstd)
            y *= invstd[:, None]
            self._scale_after(ctx, y)
        self._update_scale_factor(params)
        f = self.cfg["moving_average_fraction"]
        for running, batch in ((params["mean"], mean), (params["variance"], var * (m / max(m - 1, 1)))):
            running *= f
            running += batch

    def _normalize(self, ctx, x, y, params):
        """x_hat from the mean and invstd this iteration's forward saved, in one pass over
        ``x`` (a recomputation; the GPU's forward too, once its statistics are in), with the
        Scale of ``ctx.scale`` written in the same pass: the forward's operations in its
        order, so its bits."""
        xp, after, relu = ctx.xp, ctx.scale, ctx.relu
        mean, invstd = params["saved_mean"], params["saved_invstd"]
        if cuda.on_gpu(xp):
            _, c, l = self.ncl
            if after is None:
                cuda.kernel("bn_normalize")(x, mean, invstd, l, c, y)
                return
            w, z = after.params["weight"], after.top.reshape(self.ncl)
            if "bias" in after.params:
                cuda.kernel("bn_normalize_scale_bias")(x, mean, invstd, w, after.params["bias"], l, c,
                                                       np.int32(relu), y, z)
            else:
                cuda.kernel("bn_normalize_scale")(x, mean, invstd, w, l, c, np.int32(relu), y, z)
            return
        z = None if after is None else after.top.reshape(self.ncl)

        def block(a, b):
            ys = y[:, a:b]
            xp.subtract(x[:, a:b], mean[a:b, None], out=ys)
            ys *= invstd[a:b, None]
            if z is not None:
                after.layer.forward_channels(xp, y, z, after.params, relu, a, b)
        parallel.run(block, self.ncl[1], self.ncl[0] * self.ncl[2], xp)

    def _forward_synced(self, ctx, x, y, params):
        """The training forward of synchronised BatchNorm: the mean, then the biased variance,
        of the global batch (each a sum over the ranks); ``(mean, var, samples per channel)``."""
        xp, (n, c, l) = ctx.xp, self.ncl
        m = n * l * ctx.ranks.size
        mean = params["saved_mean"]
        mean[...] = ctx.sum_ranks(x.sum(axis=(0, 2))) / m
        xp.subtract(x, mean[:, None], out=y)
        var = ctx.sum_ranks(_channel_dot(xp, y, y, ctx.scratch((n * c,), self.dtype))) / m
        invstd = params["saved_invstd"]
        invstd[...] = 1.0 / xp.sqrt(var + self.cfg["eps"])
        y *= invstd[:, None]
        return mean, var.astype(self.dtype), m

    def _scale_after(self, ctx, y):
        """The Scale of ``ctx.scale`` (if any) over ``y``, this layer's top, as its own forward
        (with its ReLU where ``ctx.relu``): a pass of its own."""
        after = ctx.scale
        if after is not None:
            after.layer.forward(ctx, [y.reshape(after.layer.bottom_shapes[0])], [after.top], after.params)

    def _forward_cpu(self, ctx, x, y, mean, var, invstd):
        """The CPU training forward, its channels split over the cores (N*C scratch elements
        from ``ctx``); with ``ctx.scale``, each block writes that Scale's top from its channels
        once normalised (then its ReLU, with ``ctx.relu``)."""
        n, c, l = self.ncl
        eps, m = self.cfg["eps"], n * l
        room, after, relu = ctx.scratch((n * c,), self.dtype), ctx.scale, ctx.relu
        z = None if after is None else after.top.reshape(self.ncl)

        def block(a, b):
            xs, ys = x[:, a:b], y[:, a:b]
            _channel_sum(np, xs, room[a * n:b * n], out=mean[a:b])
            mean[a:b] /= m
            np.subtract(xs, mean[a:b, None], out=ys)
            v = _channel_dot(np, ys, ys, room[a * n:b * n], out=var[a:b])
            v /= m  # biased
            np.sqrt(v + eps, out=invstd[a:b])
            np.reciprocal(invstd[a:b], out=invstd[a:b])
            ys *= invstd[a:b, None]
            if z is not None:
                after.layer.forward_channels(np, y, z, after.params, relu, a, b)
        parallel.run(block, c, n * l)

    def _update_scale_factor(self, params):
        s = params["scale_factor"]
        s *= self.cfg["moving_average_fraction"]
        s += 1.0

    def _forward_fused(self, ctx, x, y, params):
        """The training forward in three kernels on the GPU (sums of x and x^2 in one pass);
        False where the scratch is too small for the partial sums (tiny batches)."""
        n, c, l = self.ncl
        splits = cuda.splits_for(self.ncl, n * c * self.dtype.itemsize)
        if not splits:
            return False
        words = ctx.scratch((2 * (splits + 1) * c,), np.float64)
        sums = cuda.channel_sums(x, None, "av", "av * av", self.ncl, words, splits)
        cuda.kernel("bn_stats")(sums, float(n * l), self.cfg["eps"], self.cfg["moving_average_fraction"], c,
                                params["saved_mean"], params["saved_invstd"], params["mean"], params["variance"])
        self._normalize(ctx, x, y, params)  # and the Scale's top (then its ReLU) in the same pass
        self._update_scale_factor(params)
        return True

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        if bottom_grads[0] is None:
            return
        xp = ctx.xp
        dy, dx = top_grads[0].reshape(self.ncl), bottom_grads[0].reshape(self.ncl)
        if self._global(ctx):
            var = self.running_stats(xp, params)[1]
            xp.multiply(dy, 1.0 / xp.sqrt(var[:, None] + self.cfg["eps"]), out=dx)
            return
        n, c, l = self.ncl
        k = c if ctx.algo != "chunked" else self._chunk()  # channels at a time
        if ctx.ranks is not None:  # the global batch's sums
            x_hat, invstd = tops[0].reshape(self.ncl), params["saved_invstd"]
            m = n * l * ctx.ranks.size
            tmp = ctx.scratch((n, k, l), self.dtype)
            dyx = [xp.multiply(dy[:, a:a + k], x_hat[:, a:a + k], out=tmp[:, :min(k, c - a)]).sum(axis=(0, 2))
                   for a in range(0, c, k)]
            sums = xp.concatenate([dy.sum(axis=(0, 2))] + dyx)
            sums = ctx.sum_ranks(sums) / m  # both in one all-reduce: latency is what it costs
            mean_dy, mean_dyx = sums[:c].astype(self.dtype), sums[c:].astype(self.dtype)
            for a in range(0, c, k):
                b, t = min(a + k, c), tmp[:, :min(k, c - a)]
                xp.multiply(x_hat[:, a:b], mean_dyx[a:b, None], out=t)
                xp.subtract(dy[:, a:b], t, out=dx[:, a:b])
                dx[:, a:b] -= mean_dy[a:b, None]
                dx[:, a:b] *= invstd[a:b, None]
            return
        splits = cuda.splits_for(self.ncl, ctx.workspace.nbytes) if cuda.on_gpu(xp) else 0
        if splits:  # one pass for both sums, one for dx
            words = ctx.scratch((2 * (splits + 1) * c,), np.float64)
            x_hat = tops[0].reshape(self.ncl)
            sums = cuda.channel_sums(dy, x_hat, "av", "av * bv", self.ncl, words, splits)
            cuda.kernel("bn_backward")(dy, x_hat, sums, params["saved_invstd"], float(n * l), l, c, dx)
            return
        # dx = invstd * (dy - mean(dy) - x_hat * mean(dy * x_hat)); dx may be dy itself
        x_hat, invstd, m = tops[0].reshape(self.ncl), params["saved_invstd"], n * l
        tmp = ctx.scratch((n, k, l), self.dtype)
        for first in range(0, c, k):  # a chunk of channels, split over the cores
            def block(a, b, first=first):  # both sums through t's first column, then t
                t = tmp[:, a:b]
                a, b = first + a, first + b  # the channels
                dys, dxs, xh = dy[:, a:b], dx[:, a:b], x_hat[:, a:b]
                mean_dy = _channel_sum(xp, dys, t[:, :, :1]) / m
                mean_dyx = _channel_dot(xp, dys, xh, t[:, :, :1]) / m
                xp.multiply(xh, mean_dyx[:, None], out=t)
                xp.subtract(dys, t, out=dxs)
                dxs -= mean_dy[:, None]
                dxs *= invstd[a:b, None]
            parallel.run(block, min(k, c - first), n * l, xp)

