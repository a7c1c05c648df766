"""Caffe's other data layers, HDF5Data and MemoryData, and Filter.

HDF5Data and MemoryData are inputs as Input and Data are: their tops are fed (``ctx.feed``,
under the top names) and the forward copies them in. HDF5Data takes its shapes from the first
file its ``source`` lists (:mod:`superneuron.hdf5_data` reads the batches, in Caffe's order);
MemoryData from ``batch_size``, ``channels``, ``height`` and ``width`` (pycaffe's
``set_input_arrays`` is the feed here: ``net.train_step({"data": x, "label": y}, it)``).

Filter passes the items (along axis 0) whose selector (the last bottom) is nonzero. Caffe's
Filter gives tops of as many items as are selected, a shape known only when the selector is;
our shapes are planned before any value exists, so here each top keeps the batch's shape, the
selected items copied and the others zero, and the backward sends the selected items' gradients
back and zero to the others (Caffe's gradients of the selected items, and zero where Caffe has
none). A layer after Filter sees the unselected items as zeros: a loss should ignore them (an
``ignore_label``) to give Caffe's value.
"""

import numpy as np

from ..data import hdf5_data
from ..errors import SNError
from .base import Algo, Cost, Key, Layer, workspace_bytes
from .input import Input
from .join import shape_str
from .registry import register


@register
class HDF5Data(Input):
    """Tops read from HDF5 files: ``source`` lists them, each top a dataset of its name."""

    KEYS = {"source": Key("str", doc="a text file listing .h5 files, one a line"),
            "batch_size": Key("int", doc="rows per batch"),
            "shuffle": Key("bool", False, doc="shuffle the files' order and each file's rows")}

    def setup(self, bottom_shapes):
        batch = self.cfg["batch_size"]
        if batch < 1:
            self.fail(f"batch_size must be >= 1, got {batch}")
        try:
            shapes = hdf5_data.describe(self.cfg["source"], self.tops)
        except SNError as e:
            self.fail(str(e))
        return self._set_shapes(bottom_shapes, [(batch,) + shapes[t] for t in self.tops])

    def batches(self, seed=0):
        """The reader of this layer's batches (feeds keyed by its tops)."""
        return hdf5_data.HDF5Batches(self.cfg["source"], self.tops, self.cfg["batch_size"],
                                     self.cfg["shuffle"], seed)


@register
class MemoryData(Input):
    """Samples and labels fed from Python: tops (batch_size, channels, height, width) and
    (batch_size,), as Caffe's MemoryData."""

    KEYS = {k: Key("int", doc=f"the data's {k}") for k in ("batch_size", "channels", "height", "width")}
    TOPS = (2, 2)

    def setup(self, bottom_shapes):
        dims = [self.cfg[k] for k in ("batch_size", "channels", "height", "width")]
        if min(dims) < 1:
            self.fail(f"batch_size, channels, height and width must be >= 1, got {dims}")
        return self._set_shapes(bottom_shapes, [tuple(dims), (dims[0],)])


@register
class Filter(Layer):
    """Each bottom's items whose selector (the last bottom, one value per item) is nonzero;
    the others zero (see the module's doc for how this differs from Caffe)."""

    BOTTOMS = (2, None)
    TOPS = (1, None)
    CHEAP = True

    def __init__(self, name, bottoms, tops, cfg, dtype=np.float32):
        super().__init__(name, bottoms, tops, cfg, dtype=dtype)
        self.LABEL_BOTTOMS = (len(bottoms) - 1,)  # the selector is never differentiated

    def setup(self, bottom_shapes):
        shapes = [tuple(s) for s in bottom_shapes]
        *data, selector = shapes
        if len(self.tops) != len(data):
            self.fail(f"{len(data)} bottom(s) to filter and a selector need {len(data)} top(s), "
                      f"got {len(self.tops)}")
        if not selector or int(np.prod(selector[1:], dtype=np.int64)) != 1:
            self.fail(f"the selector (last bottom) must hold one value per item, got {shape_str(selector)}")
        for s in data:
            if not s or s[0] != selector[0]:
                self.fail(f"every bottom must have the selector's {selector[0]} items, got {shape_str(s)}")
        return data

    def backward_reads(self):
        return (len(self.bottom_shapes) - 1,), ()

    def algorithms(self, phase):
        n = self.bottom_shapes[-1][0]
        return [Algo("default", workspace_bytes(((n,), np.bool_)))]

    def cost(self):
        moved = sum(int(np.prod(s)) for s in self.top_shapes) * self.dtype.itemsize
        return Cost(0.0, float(moved // self.dtype.itemsize), 2.0 * moved, 2.0 * moved)

    def _keep(self, ctx, selector):
        """True where the item is selected."""
        keep = ctx.scratch((selector.shape[0],), np.bool_)
        ctx.xp.not_equal(selector.reshape(selector.shape[0]), 0, out=keep)
        return keep

    @staticmethod
    def _select(xp, keep, src, dst):
        """``dst`` = ``src`` on the kept items, 0 on the others (not ``src * keep``: an
        unselected item's inf or NaN must not reach the top)."""
        dst.fill(0)
        xp.copyto(dst, src, where=keep.reshape((-1,) + (1,) * (src.ndim - 1)))

    def forward(self, ctx, bottoms, tops, params):
        keep = self._keep(ctx, bottoms[-1])
        for x, y in zip(bottoms[:-1], tops):
            self._select(ctx.xp, keep, x, y)

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        keep = self._keep(ctx, bottoms[-1])
        for dy, dx in zip(top_grads, bottom_grads[:-1]):
            if dx is not None:
                self._select(ctx.xp, keep, dy, dx)
