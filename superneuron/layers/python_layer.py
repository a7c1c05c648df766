"""Caffe's ``Python`` layer: a layer written by the user in Python, with pycaffe's interface.

``python_param { module: "voc_layers" layer: "VOCSegDataLayer" param_str: "..." }`` (in our YAML
flattened: ``module``, ``layer``, ``param_str``) names a class in the user's module. The module
does ``import caffe`` and subclasses ``caffe.Layer``, as it would for Caffe; without Caffe
installed, that import finds :mod:`superneuron.layers.pycaffe`, which offers what such modules
use (``caffe.Layer``, ``caffe.TRAIN``, ``caffe.TEST``; blobs with ``data``, ``diff``,
``reshape``, ``shape``, ``count``). The module is looked for where Python looks (PYTHONPATH,
as for Caffe), then in the current folder and the net file's.

Caffe calls ``setup`` and ``reshape`` once when the net is built, then ``reshape`` and
``forward`` at each forward and ``backward(top, propagate_down, bottom)`` at each backward;
so do we. The blobs hold host (NumPy) arrays; on a GPU the operands are copied to the host and
back. Shapes are planned ahead, so a ``reshape`` that changes a top's shape after set-up is an
error naming the layer. The layer is opaque to the scheduler: its backward reads every bottom
and top (they stay live until it has run), it never runs in place and is never recomputed (a
second forward of a data layer would read the next batch). A ``loss_weight`` on its top makes
it a loss, as in Caffe's ``pyloss`` example: the ``(1,)`` top that example reshapes to is our
0-d loss value, and its backward finds the weight in the top's diff, as Caffe's layers do.
"""

import importlib
import os
import sys

import numpy as np

from ..errors import LayerError
from . import pycaffe
from .base import Key, Layer
from .registry import register


def _import_user_module(module, folders):
    """The user's module ``module``, with ``caffe`` importable (pycaffe when Caffe is absent),
    looked for on sys.path, then in ``folders``."""
    try:
        real = hasattr(importlib.import_module("caffe"), "Layer")
    except Exception:  # no Caffe here, or a broken one
        real = False
    if not real:  # (a folder called caffe/ imports as an empty namespace package)
        sys.modules["caffe"] = pycaffe
    added = [f for f in folders if f and f not in sys.path]
    sys.path.extend(added)
    try:
        return importlib.import_module(module)
    finally:
        for f in added:
            sys.path.remove(f)


@register
class Python(Layer):
    """A user's pycaffe layer (see the module docstring)."""

    KEYS = {"module": Key("str", doc="the Python module to import (on PYTHONPATH, or beside the net file)"),
            "layer": Key("str", doc="the class in that module, a subclass of caffe.Layer"),
            "param_str": Key("str", "", doc="handed to the layer as self.param_str"),
            "share_in_parallel": Key("bool", False, doc="Caffe's; one process holds one net here")}
    BOTTOMS = (0, None)
    TOPS = (0, None)
    RECOMPUTABLE = False
    HOST_CODE = True
    ANY_TOP_LOSS = True  # a loss_weight on its top makes it a loss (Caffe's pyloss)

    def setup(self, bottom_shapes):
        module, name = self.cfg["module"], self.cfg["layer"]
        folders = [os.getcwd(), os.path.dirname(os.path.abspath(self.source_file)) if self.source_file else None]
        try:
            user_module = _import_user_module(module, folders)
        except Exception as e:  # whatever the user's module raises on import
            self.fail(f"cannot import Python module '{module}': {type(e).__name__}: {e}")
        cls = getattr(user_module, name, None)
        if not isinstance(cls, type):
            self.fail(f"Python module '{module}' has no class '{name}'")
        try:
            user = cls()
        except Exception as e:
            self.fail(f"'{module}.{name}()' failed: {type(e).__name__}: {e}")
        user.param_str, user.phase = self.cfg["param_str"], pycaffe.TRAIN
        self.user = user
        bottom = [pycaffe.Blob(np.zeros(s, self.dtype)) for s in bottom_shapes]
        top = [pycaffe.Blob(np.zeros((0,), self.dtype)) for _ in self.tops]
        self._call("setup", bottom, top)
        self._call("reshape", bottom, top)
        shapes = [tuple(t.shape) for t in top]
        for i, s in enumerate(shapes):
            if s == (0,):
                self.fail(f"'{module}.{name}' did not reshape top {i} ('{self.tops[i]}') in setup or reshape")
        return [() if s == (1,) else s for s in shapes]  # pyloss's reshape(1): a loss's 0-d value

    def _call(self, method, *args):
        """``self.user.method(*args)``; a LayerError naming the layer for whatever it raises."""
        try:
            return getattr(self.user, method)(*args)
        except LayerError:
            raise
        except Exception as e:
            self.fail(f"{self.cfg['module']}.{self.cfg['layer']}.{method}: {type(e).__name__}: {e}")

    def backward_reads(self):
        return tuple(range(len(self.bottoms))), tuple(range(len(self.tops)))

    def forward(self, ctx, bottoms, tops, params):
        self.user.phase = pycaffe.TRAIN if ctx.train else pycaffe.TEST
        bottom = [pycaffe.Blob(_host(b)) for b in bottoms]
        top = [pycaffe.Blob(np.empty(_caffe_shape(t.shape), self.dtype)) for t in tops]
        self._call("reshape", bottom, top)
        self._check_shapes(top, tops)
        self._call("forward", bottom, top)
        self._check_shapes(top, tops)
        for blob, t in zip(top, tops):
            ctx.load(t, blob.data.reshape(t.shape))

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        bottom = [pycaffe.Blob(_host(b), np.zeros(b.shape, self.dtype)) for b in bottoms]
        top = [pycaffe.Blob(_host(t), _host(g) if g is not None else np.zeros(t.shape, self.dtype))
               for t, g in zip(tops, top_grads)]
        self._call("backward", top, [g is not None for g in bottom_grads], bottom)
        for blob, g in zip(bottom, bottom_grads):
            if g is not None:
                ctx.load(g, blob.diff)

    def _check_shapes(self, blobs, arrays):
        for i, (blob, array) in enumerate(zip(blobs, arrays)):
            if tuple(blob.shape) != _caffe_shape(array.shape):
                self.fail(f"Python layer '{self.name}' reshaped top {i} ('{self.tops[i]}') from "
                          f"{tuple(array.shape)} to {tuple(blob.shape)}: shapes are planned ahead, "
                          "so a Python layer's tops keep the shape of set-up")


def _caffe_shape(shape):
    """The shape Caffe gives an array of ``shape``: a single value is ``(1,)``."""
    return tuple(shape) or (1,)


def _host(array):
    """A host (NumPy) copy of a device array, or the NumPy array itself, in Caffe's shape."""
    host = array if isinstance(array, np.ndarray) else array.get()
    return host.reshape(_caffe_shape(host.shape))
