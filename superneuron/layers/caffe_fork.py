"""Layers of Caffe's forks that model-zoo files use: Interp (DeepLab, PSPNet), Normalize (SSD)
and Upsample (SegNet, ENet: unpooling by a max pooling's mask).

Each follows its fork's definition and keys: ``interp_param``, ``norm_param``,
``upsample_param`` (caffe.proto marks them "fork").
"""

import math

import numpy as np

from .base import Algo, Cost, Key, Layer, ParamSpec, workspace_bytes
from .join import shape_str
from .registry import register


def _interp_matrix(n_in, n_out, dtype):
    """The (n_out, n_in) weights of 1-D linear interpolation with the corners aligned
    (DeepLab's ``caffe_gpu_interp2``: ``ratio = (n_in - 1) / (n_out - 1)``)."""
    m = np.zeros((n_out, n_in), dtype=np.float64)
    ratio = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    for o in range(n_out):
        pos = ratio * o
        i = min(int(pos), n_in - 1)
        frac = pos - i
        step = 1 if i < n_in - 1 else 0
        m[o, i] += 1 - frac
        m[o, i + step] += frac
    return m.astype(dtype)


@register
class Interp(Layer):
    """Bilinear resizing with the corners aligned (DeepLab's, as PSPNet uses it): to
    ``height`` x ``width``, by ``zoom_factor`` (``(h - 1) * zoom + 1``), by ``shrink_factor``
    (``(h - 1) / shrink + 1``), or to the size of a second bottom; ``pad_beg``/``pad_end``
    (0 or negative) crop the input first. Separable: two small matrix products per map; the
    backward applies their transposes and reads nothing."""

    KEYS = {"height": Key("int", 0), "width": Key("int", 0), "zoom_factor": Key("int", 1),
            "shrink_factor": Key("int", 1), "pad_beg": Key("int", 0), "pad_end": Key("int", 0)}
    BOTTOMS = (1, 2)
    LABEL_BOTTOMS = (1,)
    CHEAP = True

    def setup(self, bottom_shapes):
        shape = tuple(bottom_shapes[0])
        if len(shape) != 4:
            self.fail(f"expects a 4-D bottom (N, C, H, W), got {shape_str(shape)}")
        cfg = self.cfg
        if cfg["pad_beg"] > 0 or cfg["pad_end"] > 0:
            self.fail("pad_beg and pad_end crop the input: they must be 0 or negative")
        n, c, h, w = shape
        self.crop = (-cfg["pad_beg"], h + cfg["pad_end"], -cfg["pad_beg"], w + cfg["pad_end"])
        h_in, w_in = h + cfg["pad_beg"] + cfg["pad_end"], w + cfg["pad_beg"] + cfg["pad_end"]
        if h_in < 1 or w_in < 1:
            self.fail(f"pad_beg and pad_end leave nothing of the {h}x{w} input")
        if len(bottom_shapes) == 2:
            out = tuple(bottom_shapes[1])[2:4]
        elif cfg["height"] or cfg["width"]:
            out = (cfg["height"], cfg["width"])
        elif cfg["zoom_factor"] != 1 or cfg["shrink_factor"] != 1:
            if cfg["zoom_factor"] < 1 or cfg["shrink_factor"] < 1:
                self.fail("zoom_factor and shrink_factor must be at least 1")
            out = tuple((d - 1) // cfg["shrink_factor"] + 1 for d in (h_in, w_in))
            out = tuple(d + (d - 1) * (cfg["zoom_factor"] - 1) for d in out)
        else:
            self.fail("give height and width, zoom_factor, shrink_factor, or a second bottom")
        if len(out) != 2 or min(out) < 1:
            self.fail(f"the output size {out} must be two positive dims")
        self.inner = (n * c, h_in, w_in)
        self.rows = _interp_matrix(h_in, out[0], self.dtype)
        self.cols = _interp_matrix(w_in, out[1], self.dtype)
        return [(n, c) + tuple(out)]

    def backward_reads(self):
        return (), ()

    def algorithms(self, phase):
        nc, h_in, _ = self.inner
        return [Algo("default", workspace_bytes(((nc, h_in, self.cols.shape[0]), self.dtype)))]

    def cost(self):
        nc, h, w = self.inner
        ho, wo = self.rows.shape[0], self.cols.shape[0]
        flops = 2.0 * nc * (h * w * wo + h * wo * ho)
        n = nc * (h * w + ho * wo) * self.dtype.itemsize
        return Cost(flops, flops, float(n), float(n))

    def forward(self, ctx, bottoms, tops, params):
        xp = ctx.xp
        t, b, l, r = self.crop
        x = bottoms[0][:, :, t:b, l:r].reshape(self.inner)
        mid = ctx.scratch((self.inner[0], self.inner[1], self.cols.shape[0]), self.dtype)
        rows, cols = self.constant(xp, "rows", self.rows), self.constant(xp, "cols", self.cols)
        xp.matmul(x, cols.T, out=mid)
        xp.matmul(rows, mid, out=tops[0].reshape(self.inner[0], *self.rows.shape[:1], -1))

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is None:
            return
        xp = ctx.xp
        t, b, l, r = self.crop
        dy = top_grads[0].reshape(self.inner[0], self.rows.shape[0], self.cols.shape[0])
        mid = ctx.scratch((self.inner[0], self.inner[1], self.cols.shape[0]), self.dtype)
        xp.matmul(self.constant(xp, "rows", self.rows).T, dy, out=mid)
        if (t, b, l, r) != (0, dx.shape[2], 0, dx.shape[3]):
            dx.fill(0)
        inside = dx[:, :, t:b, l:r]
        if inside.flags.c_contiguous:
            xp.matmul(mid, self.constant(xp, "cols", self.cols), out=inside.reshape(self.inner))
        else:  # cropped: one map at a time into the strided view
            c = inside.shape[1]
            for i, m in enumerate(mid):
                xp.matmul(m, self.constant(xp, "cols", self.cols), out=inside[i // c, i % c])


@register
class Normalize(Layer):
    """SSD's L2 normalisation: ``y = x / sqrt(sum x^2 + eps) * scale``, the sum over each
    sample's C x H x W (``across_spatial``) or over the channels at each pixel, ``scale``
    learned per channel (or one, ``channel_shared``). Its backward reads its bottom."""

    KEYS = {"across_spatial": Key("bool", True), "channel_shared": Key("bool", True),
            "eps": Key("float", 1e-10), "scale_filler": Key("filler", {"type": "constant", "value": 1.0})}

    def setup(self, bottom_shapes):
        shape = tuple(bottom_shapes[0])
        if len(shape) < 2:
            self.fail(f"needs a bottom of at least 2 dims (N, C, ...), got {shape_str(shape)}")
        self.ncl = (shape[0], shape[1], math.prod(shape[2:]))
        return [shape]

    def param_specs(self):
        return [ParamSpec("scale", (1 if self.cfg["channel_shared"] else self.ncl[1],), self.cfg["scale_filler"])]

    def backward_reads(self):
        return (0,), ()

    def _norm_shape(self):
        n, _, l = self.ncl
        return (n, 1, 1) if self.cfg["across_spatial"] else (n, 1, l)

    def algorithms(self, phase):
        norm, full = (self._norm_shape(), self.dtype), (self.ncl, self.dtype)
        if phase == "forward":
            return [Algo("default", workspace_bytes(norm, full))]
        return [Algo("default", workspace_bytes(norm, full, full, norm))]

    def _norm(self, ctx, x):
        """``(sqrt(sum x^2 + eps), x^2 room)``, the sum as the mode says."""
        xp = ctx.xp
        norm, square = ctx.scratch(self._norm_shape(), self.dtype), ctx.scratch(self.ncl, self.dtype)
        xp.multiply(x, x, out=square)
        axes = (1, 2) if self.cfg["across_spatial"] else (1,)
        xp.sum(square, axis=axes, keepdims=True, out=norm)
        norm += self.cfg["eps"]
        xp.sqrt(norm, out=norm)
        return norm, square

    def forward(self, ctx, bottoms, tops, params):
        x, y = bottoms[0].reshape(self.ncl), tops[0].reshape(self.ncl)
        norm, _ = self._norm(ctx, x)
        ctx.xp.divide(x, norm, out=y)
        y *= params["scale"].reshape(1, -1, 1)

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        xp = ctx.xp
        x, dy = bottoms[0].reshape(self.ncl), top_grads[0].reshape(self.ncl)
        norm, room = self._norm(ctx, x)
        xhat = ctx.scratch(self.ncl, self.dtype)
        xp.divide(x, norm, out=xhat)
        ds = param_grads.get("scale")
        if ds is not None:
            xp.multiply(dy, xhat, out=room)
            if self.cfg["channel_shared"]:
                xp.sum(room.reshape(1, -1), axis=1, out=ds)
            else:
                xp.sum(room, axis=(0, 2), out=ds)
        dx = bottom_grads[0]
        if dx is None:
            return
        # with g = dy * scale: dx = (g - xhat * sum(g * xhat)) / norm, the sum as the norm's
        dx = dx.reshape(self.ncl)
        xp.multiply(dy, params["scale"].reshape(1, -1, 1), out=dx)
        xp.multiply(dx, xhat, out=room)
        sums = ctx.scratch(self._norm_shape(), self.dtype)
        xp.sum(room, axis=(1, 2) if self.cfg["across_spatial"] else (1,), keepdims=True, out=sums)
        xhat *= sums
        dx -= xhat
        dx /= norm


@register
class Upsample(Layer):
    """SegNet's unpooling: each value of the first bottom written at the place its max
    pooling's mask (the second bottom: a MAX Pooling's second top) says, in a map ``scale``
    times larger (or ``upsample_h`` x ``upsample_w``), zeros elsewhere. The backward gathers
    the gradient from those places; it reads the mask."""

    KEYS = {"scale": Key("int", 2), "scale_h": Key("int", 0), "scale_w": Key("int", 0),
            "pad_out_h": Key("bool", False), "pad_out_w": Key("bool", False),
            "upsample_h": Key("int", 0), "upsample_w": Key("int", 0)}
    BOTTOMS = (2, 2)
    LABEL_BOTTOMS = (1,)
    CHEAP = True

    def setup(self, bottom_shapes):
        shape, mask = (tuple(s) for s in bottom_shapes)
        if len(shape) != 4 or shape != mask:
            self.fail(f"expects a 4-D bottom and a mask of its shape, got {shape_str(shape)} and {shape_str(mask)}")
        cfg = self.cfg
        n, c, h, w = shape
        if cfg["upsample_h"] and cfg["upsample_w"]:
            out = (cfg["upsample_h"], cfg["upsample_w"])
        else:
            sh, sw = cfg["scale_h"] or cfg["scale"], cfg["scale_w"] or cfg["scale"]
            out = (h * sh - int(cfg["pad_out_h"]), w * sw - int(cfg["pad_out_w"]))
        if min(out) < 1 or out[0] * out[1] < h * w:
            self.fail(f"the output {out[0]}x{out[1]} cannot hold the {h}x{w} input")
        self.planes = (n * c, h * w, out[0] * out[1])
        return [(n, c) + out]

    def backward_reads(self):
        return (1,), ()

    def algorithms(self, phase):
        return [Algo("default", workspace_bytes(((self.planes[0], self.planes[1]), np.int64)))]

    def cost(self):
        p, i, o = self.planes
        return Cost(0.0, 0.0, float(p * (2 * i + o) * self.dtype.itemsize), float(p * 3 * i * self.dtype.itemsize))

    def _places(self, ctx, mask):
        """The flat index in the top of each bottom value; LayerError for a mask outside the map."""
        xp, (planes, inner, outer) = ctx.xp, self.planes
        idx = ctx.scratch((planes, inner), np.int64)
        xp.copyto(idx, mask.reshape(planes, inner), casting="unsafe")
        low, high = int(idx.min()), int(idx.max())
        if low < 0 or high >= outer:
            self.fail(f"a mask index is outside the {outer} places of the top map: {low} .. {high}")
        idx += xp.arange(planes, dtype=np.int64)[:, None] * outer
        return idx

    def forward(self, ctx, bottoms, tops, params):
        idx = self._places(ctx, bottoms[1])
        tops[0].fill(0)
        ctx.xp.put(tops[0].reshape(-1), idx.reshape(-1), bottoms[0].reshape(-1))

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is None:
            return
        idx = self._places(ctx, bottoms[1])
        xp = ctx.xp
        if xp is np:
            np.take(top_grads[0].reshape(-1), idx.reshape(-1), out=dx.reshape(-1), mode="clip")
        else:
            xp.take(top_grads[0].reshape(-1), idx.reshape(-1), out=dx.reshape(-1))
