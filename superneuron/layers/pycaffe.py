"""What a Python layer's ``import caffe`` finds where Caffe is not installed: the part of
pycaffe that layer modules use (``caffe.Layer``, ``caffe.TRAIN``, ``caffe.TEST``, blobs).

Installed as ``sys.modules['caffe']`` by layers/python_layer.py only when ``import caffe``
fails, so a machine with Caffe keeps its own.
"""

import numpy as np

TRAIN, TEST = 0, 1  # pycaffe's phases


class Layer:
    """The base of a user's layer, as pycaffe's ``caffe.Layer``: ``param_str`` and ``phase``
    are set before ``setup``; each method is given lists of :class:`Blob`."""

    param_str = ""
    phase = TRAIN

    def setup(self, bottom, top):
        """Read ``self.param_str``; check the bottoms."""

    def reshape(self, bottom, top):
        """Give each top its shape (``top[i].reshape(*shape)``)."""

    def forward(self, bottom, top):
        """Write ``top[i].data[...]`` from ``bottom[j].data``."""

    def backward(self, top, propagate_down, bottom):
        """Write ``bottom[j].diff[...]`` where ``propagate_down[j]``, from ``top[i].diff``."""


class Blob:
    """A blob as pycaffe shows it: ``data`` and ``diff`` NumPy arrays of one shape (read-only
    attributes, written through ``[...]`` as in pycaffe), ``reshape``, ``shape``, ``count``."""

    def __init__(self, data, diff=None):
        self._data = data
        self._diff = np.zeros_like(data) if diff is None else diff

    @property
    def data(self):
        return self._data

    @property
    def diff(self):
        return self._diff

    @property
    def shape(self):
        return tuple(self._data.shape)

    @property
    def count(self):
        return int(self._data.size)

    # Caffe's legacy four axes
    num = property(lambda self: self._axis(0))
    channels = property(lambda self: self._axis(1))
    height = property(lambda self: self._axis(2))
    width = property(lambda self: self._axis(3))

    def _axis(self, i):
        return self.shape[i] if i < len(self.shape) else 1

    def reshape(self, *shape):
        """Give the blob ``shape`` (its values are then undefined, as in Caffe)."""
        shape = tuple(int(d) for d in (shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape))
        if shape != self.shape:
            self._data = np.zeros(shape, self._data.dtype)
            self._diff = np.zeros(shape, self._data.dtype)
