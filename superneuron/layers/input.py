"""Input and Data: the layers that bring a batch into the net.

Neither computes anything: the trainer puts host arrays in ``ctx.feed`` under the layer's top
names and the forward copies them into the tops (``ctx.load``: a host→device copy on GPU).
``Input`` declares its top shapes directly; ``Data`` names a source (see :mod:`superneuron.data`)
and takes its sample shape from it.
"""

import numpy as np

from .. import data
from ..errors import SNError
from . import register
from .base import Cost, Key, Layer


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
    'digits', 'synthetic', a .npz file, a CIFAR-10 python directory or an image folder.
    As in Caffe, one top is allowed too: the samples without their labels (a segmentation
    net's second Data layer carries its masks that way)."""

    KEYS = {
        "source": Key("str", doc="'digits', 'synthetic', a .npz file, a CIFAR-10 python directory "
                      "or an image folder"),
        "batch_size": Key("int", doc="samples per batch, for training and testing"),
        **{key: Key(kind, default, doc=doc) for key, (kind, default, doc) in data.OPTIONS.items()},
    }
    TOPS = (1, 2)

    def setup(self, bottom_shapes):
        batch = self.cfg["batch_size"]
        if batch < 1:
            self.fail(f"batch_size must be >= 1, got {batch}")
        try:
            sample_shape, self.num_classes = data.describe(self.cfg)
        except SNError as e:
            message = str(e)
        else:
            shapes = [(batch,) + tuple(sample_shape), (batch,)]
            return self._set_shapes(bottom_shapes, shapes[:len(self.tops)])
        self.fail(message)
