"""The net as layers in execution order with tensors of known shapes (build.py: the Graph, from a
NetSpec), the tensors' records and storage roots (tensors.py), and which layers run backward with
which gradients (backward.py)."""

from .build import Graph  # noqa: F401  (the package's name for it)
from .tensors import KINDS, Node, TensorInfo, storage_root  # noqa: F401
