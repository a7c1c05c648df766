"""The layers, one module per family; importing the package registers every layer class under
its Caffe type name (registry.py)."""

from . import (  # noqa: F401  (registers each)
    accuracy,
    activation,
    attention,
    caffe_data,
    caffe_fork,
    caffe_loss,
    caffe_misc,
    caffe_neuron,
    conv,
    deconv,
    detection,
    embed,
    inner_product,
    input,
    join,
    layernorm,
    loss,
    lrn,
    matmul,
    multibox,
    neuron,
    norm,
    pool,
    python_layer,
    recurrent,
    shape,
    softmax,
    spp,
)
from .registry import REGISTRY, layer_class, register  # noqa: F401  (the package's names)
