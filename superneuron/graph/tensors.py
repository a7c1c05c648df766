"""The graph's vocabulary: tensor kinds, TensorInfo, Node (a placed layer) and storage_root."""

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from ..layers.base import Layer
from ..netfile.rules import PHASES

# Tensor kinds (DESIGN.md): "encoded" is a feature map's encoded form (Gist), which an Encode
# step will make; "accum" a parameter gradient's sum over an iteration's rounds (iter_size);
# "bucket" the gradients of a data-parallel all-reduce, packed (scheduler/allreduce.py);
# liveness.SCHEDULED lists those whose storage the steps manage.
KINDS = ("data", "grad", "param", "param_grad", "state", "accum", "workspace", "encoded", "bucket")


def storage_root(tensors, name):
    """The tensor whose memory ``name`` uses in ``tensors`` (the graph's, or a schedule's, which
    may alias more: see the in-place pass), following aliases; names not in ``tensors`` are
    their own root."""
    info = tensors.get(name)
    while info is not None and info.alias is not None:
        name = info.alias
        info = tensors.get(name)
    return name


@dataclass
class TensorInfo:
    """A tensor of the iteration: name, shape, dtype, kind (one of KINDS) and the tensor whose
    memory it shares (``alias``: an in-place top, a Split top, an in-place gradient)."""

    name: str
    shape: tuple
    dtype: np.dtype
    kind: str
    alias: str = None

    @functools.cached_property
    def nbytes(self):
        """Bytes of the tensor; computed once (planning asks millions of times; shapes do not
        change once set, and dataclasses.replace makes a new object, which computes its own)."""
        return math.prod(map(int, self.shape)) * np.dtype(self.dtype).itemsize


@dataclass
class Node:
    """A layer placed in the graph, with the tensors it reads and writes."""

    index: int
    layer: Layer
    spec: object                    # the LayerSpec (None for inserted Splits)
    bottoms: list                   # tensor names
    tops: list
    params: dict = field(default_factory=dict)       # param name -> tensor name
    param_specs: dict = field(default_factory=dict)  # param name -> ParamSpec (lr/decay mults set)
    param_grads: dict = field(default_factory=dict)  # learnable param name -> tensor name
    bottom_grads: list = field(default_factory=list)  # tensor name or None per bottom
    top_grads: list = field(default_factory=list)     # tensor name or None per top
    backward: bool = False          # runs a backward step
    loss_weight: float = 0.0
    phases: frozenset = PHASES      # TRAIN and/or TEST (Caffe's include/exclude)
    inplace: bool = False           # its first top shares its first bottom's memory
    kept: str = None                # why an in-place request got memory of its own

    @property
    def name(self):
        return self.layer.name
