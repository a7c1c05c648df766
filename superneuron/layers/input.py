"""Input and Data: the layers that bring a batch into the net.

Neither computes anything: the trainer puts host arrays in ``ctx.feed`` under the layer's top
names and the forward copies them into the tops (``ctx.load``: a host→device copy on GPU).
``Input`` declares its top shapes directly; ``Data`` names a source (see :mod:`superneuron.data.sources`)
and takes its sample shape from it.
"""

import numpy as np

from ..data import sources as data
from ..errors import SNError
from .base import Algo, Cost, Key, Layer, workspace_bytes
from .registry import register

# The layer types whose tops are fed from outside (the trainer's or the user's arrays)
FED_TYPES = ("Input", "Data", "HDF5Data", "MemoryData")


@register
class Input(Layer):
    """Tops of fixed shapes, filled from the feed (``input:`` in a network file becomes one)."""

    KEYS = {"shape": Key("shapes", doc="one shape per top, e.g. [64, 3, 32, 32]")}
    BOTTOMS = (0, 0)
    TOPS = (1, None)
    BACKWARD = False

    def setup(self, bottom_shapes):
        shapes = [tuple(s) for s in self.cfg["shape"]]
        if len(shapes) != len(self.tops):
            self.fail(f"{len(shapes)} shape(s) given for {len(self.tops)} top(s)")
        return self._set_shapes(bottom_shapes, shapes)

    def _set_shapes(self, bottom_shapes, top_shapes):
        self.bottom_shapes, self.top_shapes = list(bottom_shapes), list(top_shapes)
        return list(top_shapes)

    def backward_reads(self):
        return (), ()

    def cost(self):
        moved = sum(int(np.prod(s)) for s in self.top_shapes) * self.dtype.itemsize
        return Cost(0.0, 0.0, float(moved), 0.0)

    def forward(self, ctx, bottoms, tops, params):
        for name, top in zip(self.tops, tops, strict=True):
            if name not in ctx.feed:
                self.fail(f"nothing fed for top '{name}' (fed: {', '.join(sorted(ctx.feed)) or 'nothing'})")
            src = ctx.feed[name]
            if tuple(src.shape) != tuple(top.shape):
                self.fail(f"fed '{name}' has shape {tuple(src.shape)}; the top is {tuple(top.shape)}")
            ctx.load(top, src)

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        pass  # nothing below an input to send gradients to


@register
class Data(Input):
    """A batch of samples and their labels (float32, one per sample) from a data source:
    'digits', 'synthetic', a .npz file, a CIFAR-10 python directory or an image folder. With
    ``boxes`` (SSD's AnnotatedData), synthetic images with that many boxes each, the labels
    Caffe's annotated boxes (box_data.py).
    As in Caffe, one top is allowed too: the samples without their labels (a segmentation
    net's second Data layer carries its masks that way)."""

    KEYS = {
        "source": Key("str", doc="'digits', 'synthetic', a .npz file, a CIFAR-10 python directory "
                      "or an image folder"),
        "batch_size": Key("int", doc="samples per batch, for training and testing"),
        **{key: Key(kind, default, doc=doc) for key, (kind, default, doc) in data.OPTIONS.items()},
        "boxes": Key("int", 0, doc="detection (SSD's AnnotatedData): ground-truth boxes per image; the "
                     "label top is then Caffe's annotated boxes (1, 1, batch × boxes, 8); synthetic only"),
    }
    TOPS = (1, 2)

    def setup(self, bottom_shapes):
        batch = self.cfg["batch_size"]
        if batch < 1:
            self.fail(f"batch_size must be >= 1, got {batch}")
        if self.cfg.get("boxes", 0) < 0:
            self.fail(f"boxes must be >= 0, got {self.cfg['boxes']}")
        try:
            sample_shape, self.num_classes = data.describe(self.cfg)
        except SNError as e:
            message = str(e)
        else:
            labels = (batch,) + data.label_shape(self.cfg, sample_shape)  # text: a target per token
            if self.cfg.get("boxes"):  # one row of Caffe's 8 numbers per box, the images' all together
                labels = (1, 1, batch * self.cfg["boxes"], 8)
            shapes = [(batch,) + tuple(sample_shape), labels]
            return self._set_shapes(bottom_shapes, shapes[:len(self.tops)])
        self.fail(message)


@register
class DummyData(Layer):
    """Tops of the given shapes filled by ``data_filler`` (one for every top, or one per top;
    Caffe's default: constant 0) at every forward: constant, uniform, or gaussian drawn from
    the step's seed (the same numbers on recompute). The old form gives the shapes as
    ``num``, ``channels``, ``height`` and ``width``, one each per top."""

    KEYS = {"shape": Key("shapes", None, doc="one shape per top (or one for all)"),
            "data_filler": Key("fillers", (), doc="one filler per top (or one for all); default constant 0"),
            **{k: Key("ints", (), doc="the old form of shape, one per top")
               for k in ("num", "channels", "height", "width")}}
    BOTTOMS = (0, 0)
    TOPS = (1, None)
    BACKWARD = False
    CHEAP = True

    def setup(self, bottom_shapes):
        n = len(self.tops)
        shapes = self.cfg["shape"]
        if shapes is None:
            old = [self.cfg[k] for k in ("num", "channels", "height", "width")]
            if not all(old) or len({len(v) for v in old}) != 1:
                self.fail("give shape, or num, channels, height and width (one of each per top)")
            shapes = tuple(zip(*old))
        if len(shapes) == 1:
            shapes = shapes * n
        fillers = self.cfg["data_filler"] or ({"type": "constant", "value": 0.0},)
        if len(fillers) == 1:
            fillers = fillers * n
        if len(shapes) != n or len(fillers) != n:
            self.fail(f"{len(shapes)} shapes and {len(fillers)} fillers for {n} tops: give one, or one per top")
        for f in fillers:
            if f["type"] not in ("constant", "uniform", "gaussian"):
                self.fail(f"data_filler {f['type']!r}: constant, uniform or gaussian")
        self.fillers = fillers
        return [tuple(s) for s in shapes]

    def backward_reads(self):
        return (), ()

    def draws(self, train):
        return any(f["type"] != "constant" for f in self.fillers)

    def algorithms(self, phase):
        gaussian = [s for s, f in zip(self.top_shapes, self.fillers) if f["type"] == "gaussian"]
        largest = max((int(np.prod(s)) for s in gaussian), default=0)
        return [Algo("default", workspace_bytes(((largest,), self.dtype)) if largest else 0)]

    def forward(self, ctx, bottoms, tops, params):
        for i, (top, f) in enumerate(zip(tops, self.fillers)):
            if f["type"] == "constant":
                top.fill(f["value"])
            elif f["type"] == "uniform":
                ctx.uniform(top, salt=i)
                top *= f["max"] - f["min"]
                top += f["min"]
            else:  # Box-Muller: sqrt(-2 ln u1) cos(2 pi u2), from two uniform draws
                xp, flat = ctx.xp, top.reshape(-1)
                u2 = ctx.scratch(flat.shape, self.dtype)
                ctx.uniform(flat, salt=2 * i + 1000)
                ctx.uniform(u2, salt=2 * i + 1001)
                xp.subtract(1.0, flat, out=flat)  # (0, 1]: the log is finite
                xp.log(flat, out=flat)
                flat *= -2.0
                xp.sqrt(flat, out=flat)
                u2 *= 2 * np.pi
                xp.cos(u2, out=u2)
                flat *= u2
                flat *= f["std"]
                flat += f["mean"]
                ctx._used = 0  # the next gaussian top reuses the same scratch

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        pass
