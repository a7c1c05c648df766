"""SPP: Caffe's spatial pyramid pooling (He et al., SPP-net).

Level ``l`` of ``pyramid_height`` pools the map into ``2^l x 2^l`` bins with Caffe's window
(``kernel = ceil(H / bins)``, ``pad = (kernel * bins - H + 1) // 2``, ``stride = kernel``);
each level's output is flattened and the levels are concatenated: a top of ``(N, C * sum of
4^l)``. Each level is one of our Pooling layers, run on the step's workspace: its top (and,
in the backward, its routed gradient and its share of the bottom gradient) in scratch.
"""

import math

import numpy as np

from .base import Algo, Context, Cost, Key, Layer, workspace_bytes
from .join import shape_str
from .pool import Pooling
from .registry import register


def _aligned(n):
    return -(-n // 16) * 16


@register
class SPP(Layer):
    """Spatial pyramid pooling (MAX or AVE) of ``pyramid_height`` levels."""

    KEYS = {"pyramid_height": Key("int"), "pool": Key("str", "MAX", choices=("MAX", "AVE"))}
    CHEAP = True

    def setup(self, bottom_shapes):
        shape = tuple(bottom_shapes[0])
        if len(shape) != 4:
            self.fail(f"expects a 4-D bottom (N, C, H, W), got {shape_str(shape)}")
        height = self.cfg["pyramid_height"]
        if not 1 <= height <= 16:
            self.fail(f"pyramid_height must be in 1 .. 16, got {height}")
        n, c, h, w = shape
        self.levels = []
        for level in range(height):
            bins = 2 ** level
            kh, kw = math.ceil(h / bins), math.ceil(w / bins)
            cfg = {"pool": self.cfg["pool"], "kernel_size": (kh, kw), "stride": (kh, kw),
                   "pad": ((kh * bins - h + 1) // 2, (kw * bins - w + 1) // 2)}
            if bins == 1:
                cfg = {"pool": self.cfg["pool"], "global_pooling": True}
            pool = Pooling(f"{self.name}/level{level}", ["x"], ["y"], Pooling.config(cfg), dtype=self.dtype)
            pool.bottom_shapes = [shape]
            try:
                pool.top_shapes = pool.setup([shape])
            except Exception as e:  # the level's window does not fit: say which level
                self.fail(f"level {level} ({bins}x{bins} bins): {e}")
            self.levels.append(pool)
        self.widths = [math.prod(p.top_shapes[0][1:]) for p in self.levels]
        return [(n, sum(self.widths))]

    def backward_reads(self):
        return ((0,), ()) if self.cfg["pool"] == "MAX" else ((), ())

    def _room(self, phase):
        """Bytes of each level's scratch: its top (and in the backward its top gradient and a
        bottom-sized gradient) and its pooling's own workspace."""
        item, out = self.dtype.itemsize, []
        for pool in self.levels:
            top = _aligned(math.prod(pool.top_shapes[0]) * item)
            if phase == "forward":
                out.append(top + _aligned(pool.algorithms("forward")[0].workspace))
            else:
                whole = _aligned(math.prod(self.bottom_shapes[0]) * item)
                out.append(2 * top + whole + _aligned(pool.algorithms("backward")[0].workspace))
        return out

    def algorithms(self, phase):
        return [Algo("default", workspace_bytes(((max(self._room(phase)),), np.uint8)))]

    def cost(self):
        costs = [p.cost() for p in self.levels]
        return Cost(*(sum(getattr(c, f) for c in costs) for f in ("fwd_flops", "bwd_flops", "fwd_bytes", "bwd_bytes")))

    def _carve(self, region, pool, count):
        """``count`` arrays of the level's top shape, then the rest of ``region`` (uint8)."""
        shape, item = pool.top_shapes[0], self.dtype.itemsize
        size, out, at = math.prod(shape) * item, [], 0
        for _ in range(count):
            out.append(region[at:at + size].view(self.dtype).reshape(shape))
            at = _aligned(at + size)
        return out, region[at:]

    def _level_forward(self, ctx, pool, x, top, room):
        sub = Context(ctx.xp, train=ctx.train, recompute=ctx.recompute, workspace=room, algo="default",
                      seed=ctx.seed, backend=ctx.backend)
        pool.forward(sub, [x], [top], {})

    def forward(self, ctx, bottoms, tops, params):
        region = ctx.scratch((max(self._room("forward")),), np.uint8)
        n, at = self.bottom_shapes[0][0], 0
        for pool, width in zip(self.levels, self.widths):
            (top,), room = self._carve(region, pool, 1)
            self._level_forward(ctx, pool, bottoms[0], top, room)
            ctx.xp.copyto(tops[0][:, at:at + width], top.reshape(n, width))
            at += width

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        dx = bottom_grads[0]
        if dx is None:
            return
        xp = ctx.xp
        region = ctx.scratch((max(self._room("backward")),), np.uint8)
        n, at, item = self.bottom_shapes[0][0], 0, self.dtype.itemsize
        whole = math.prod(self.bottom_shapes[0]) * item
        dx.fill(0)
        for pool, width in zip(self.levels, self.widths):
            (top, dy), rest = self._carve(region, pool, 2)
            part = rest[:whole].view(self.dtype).reshape(self.bottom_shapes[0])
            room = rest[_aligned(whole):]
            x = bottoms[0]
            if self.cfg["pool"] == "MAX":  # its backward reads the level's top: pooled again
                self._level_forward(ctx, pool, x, top, room)
            xp.copyto(dy.reshape(n, width), top_grads[0][:, at:at + width])
            sub = Context(xp, train=ctx.train, workspace=room, algo="default", seed=ctx.seed, backend=ctx.backend)
            pool.backward(sub, [x], [top], [dy], [part], {}, {})
            dx += part
            at += width
