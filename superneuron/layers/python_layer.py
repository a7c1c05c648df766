"""Caffe's ``Python`` layer: a layer written by the user in Python, with Caffe's interface.

``python_param { module: "pyloss" layer: "EuclideanLossLayer" param_str: "..." }`` loads class
``layer`` from ``module`` (found on ``sys.path``, so on ``PYTHONPATH`` as Caffe finds it, or
in the working folder) and drives it as Caffe does: ``setup(bottom, top)`` and ``reshape(bottom, top)`` once to
learn the top shapes, then ``reshape`` and ``forward(bottom, top)`` at every forward, and
``backward(top, propagate_down, bottom)``. Blobs have ``data``, ``diff``, ``shape``,
``reshape``, ``count``, ``num``, ``channels``, ``height`` and ``width``; the layer has
``param_str`` and ``phase`` (``caffe.TRAIN`` or ``caffe.TEST``).

Such a module does ``import caffe`` and subclasses ``caffe.Layer``: where no Caffe is
installed, a small stand-in module is registered as ``caffe`` that has just those names.

The layer is opaque: its backward is taken to read every bottom and top, it is never in place,
and it is not cheap (so the cost-aware policies keep its tops rather than recompute it). A top
it weights with ``loss_weight`` makes it a loss, as Caffe's ``pyloss`` example does. On a GPU
its arrays are copied to the host and back around each call.
"""

import importlib
import os
import sys
import types

import numpy as np

from ..errors import LayerError
from . import register
from .base import Key, Layer

TRAIN, TEST = 0, 1  # Caffe's Phase enum


class _StandInLayer:
    """``caffe.Layer`` where no Caffe is installed: what a Python layer subclasses."""

    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        raise NotImplementedError("forward")

    def backward(self, top, propagate_down, bottom):
        raise NotImplementedError("backward")


def caffe_module():
    """The ``caffe`` module a user's Python layer imports: pycaffe where installed, else the
    stand-in (registered in ``sys.modules``; a ``caffe`` folder without ``Layer``, such as a
    namespace package of prototxt files, is not pycaffe)."""
    module = sys.modules.get("caffe")
    if module is None:
        try:
            module = importlib.import_module("caffe")
        except Exception:  # a broken Caffe install raises more than ImportError
            module = None
    if module is None or not hasattr(module, "Layer"):
        module = types.ModuleType("caffe", "superneuron's stand-in for pycaffe's Layer interface")
        module.Layer, module.TRAIN, module.TEST = _StandInLayer, TRAIN, TEST
        sys.modules["caffe"] = module
    return module


def _same(a, b):
    """Shapes alike, a single value's ``(1,)`` and ``()`` alike."""
    a, b = tuple(a), tuple(b)
    return a == b or {a, b} == {(), (1,)}


class Blob:
    """A pycaffe blob over our arrays: ``data`` and ``diff`` (None until a shape is known)."""

    def __init__(self, data=None, diff=None):
        self.data, self.diff = data, diff
        self._shape = None if data is None else tuple(data.shape)

    @property
    def shape(self):
        return self._shape

    def reshape(self, *shape):
        """Caffe's ``top[0].reshape(n, c, h, w)``: at set-up, the top's shape; later, the same
        (a loss's ``reshape(1)`` is our 0-d top)."""
        self._shape = tuple(int(d) for d in shape)
        if self.data is None or not _same(self.data.shape, self._shape):
            self.data = np.zeros(self._shape, dtype=np.float32)
            self.diff = np.zeros(self._shape, dtype=np.float32)

    @property
    def count(self):
        return int(np.prod(self._shape))

    def _dim(self, i):
        return self._shape[i] if len(self._shape) > i else 1

    num = property(lambda self: self._dim(0))
    channels = property(lambda self: self._dim(1))
    height = property(lambda self: self._dim(2))
    width = property(lambda self: self._dim(3))


@register
class Python(Layer):
    """A user's layer in Python (see the module docstring)."""

    KEYS = {"module": Key("str", doc="the Python module (on sys.path or beside the net file)"),
            "layer": Key("str", doc="the class in that module"),
            "param_str": Key("str", "", doc="a string the layer reads as self.param_str"),
            "share_in_parallel": Key("bool", False, doc="Caffe's multi-GPU switch; no effect here")}
    BOTTOMS = (0, None)
    TOPS = (1, None)
    ANY_TOP_LOSS = True  # a loss_weight on its top makes it a loss (Caffe's pyloss)

    def _instance(self):
        caffe_module()
        module, name = self.cfg["module"], self.cfg["layer"]
        added = [f for f in (os.getcwd(),) if f not in sys.path]
        sys.path[:0] = added
        try:
            mod = importlib.import_module(module)
        except Exception as e:  # the user's module may raise anything while it loads
            self.fail(f"python_param module '{module}' cannot be imported: {type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''}")
        finally:
            for f in added:
                sys.path.remove(f)
        cls = getattr(mod, name, None)
        if not isinstance(cls, type):
            self.fail(f"python_param module '{module}' has no class '{name}'")
        layer = cls()
        layer.param_str, layer.phase = self.cfg["param_str"], TRAIN
        return layer

    def _call(self, what, *args):
        try:
            return getattr(self.user, what)(*args)
        except Exception as e:  # a user's error: one line naming the layer and the method
            if isinstance(e, LayerError):
                raise
            self.fail(f"{self.cfg['layer']}.{what} raised {type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''}")

    def setup(self, bottom_shapes):
        self.user = self._instance()
        bottom = [Blob(np.zeros(s, dtype=self.dtype)) for s in bottom_shapes]
        top = [Blob() for _ in self.tops]
        self._call("setup", bottom, top)
        self._call("reshape", bottom, top)
        shapes = [b.shape for b in top]
        if any(s is None for s in shapes):
            self.fail(f"{self.cfg['layer']}.reshape gave top {shapes.index(None)} no shape")
        # a single value (pyloss's reshape(1)) is a 0-d top: a loss's, as Caffe's C++ losses have
        return [() if tuple(s) == (1,) else tuple(s) for s in shapes]

    def backward_reads(self):
        return tuple(range(len(self.bottoms))), tuple(range(len(self.tops)))

    def _host(self, ctx, arrays):
        """NumPy arrays of ``arrays`` (copies on a GPU); a 0-d one as the (1,) Caffe gives."""
        host = [None if a is None else (a if ctx.xp is np else ctx.xp.asnumpy(a)) for a in arrays]
        return [a.reshape(1) if a is not None and a.ndim == 0 else a for a in host]

    def forward(self, ctx, bottoms, tops, params):
        self.user.phase = TRAIN if ctx.train else TEST
        bottom = [Blob(b) for b in self._host(ctx, bottoms)]
        top = [Blob(t) for t in self._host(ctx, tops)]
        self._call("reshape", bottom, top)
        for i, (blob, want) in enumerate(zip(top, self.top_shapes)):
            if not _same(blob.shape, want):
                self.fail(f"{self.cfg['layer']}.reshape changed top {i} to {blob.shape} from {tuple(want)}: "
                          "tops keep the shape set up first here")
        self._call("forward", bottom, top)
        if ctx.xp is not np:
            for t, blob in zip(tops, top):
                ctx.xp.copyto(t, ctx.xp.asarray(blob.data))

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        host = self._host(ctx, bottom_grads)
        for g in host:
            if g is not None:
                g.fill(0)
        diffs = [g if g is not None else np.zeros(s, self.dtype) for g, s in zip(host, self.bottom_shapes)]
        top_diffs = [g if g is not None else np.zeros(s, self.dtype)
                     for g, s in zip(self._host(ctx, top_grads), self.top_shapes)]
        bottom = [Blob(b, d) for b, d in zip(self._host(ctx, bottoms), diffs)]
        top = [Blob(t, d) for t, d in zip(self._host(ctx, tops), top_diffs)]
        self._call("backward", top, [g is not None for g in bottom_grads], bottom)
        if ctx.xp is not np:
            for g, d in zip(bottom_grads, diffs):
                if g is not None:
                    ctx.xp.copyto(g, ctx.xp.asarray(d))
