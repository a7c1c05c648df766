"""The layers, one module per family; importing the package registers every layer class under
its Caffe type name (registry.py)."""

from . import activation, conv, deconv, inner_product, input, join, loss, lrn, neuron, norm, pool, shape  # noqa: F401  (registers each)
from .registry import REGISTRY, layer_class, register  # noqa: F401  (the package's names)
