"""LayerSpec and NetSpec: what a net file (YAML or Caffe's prototxt) becomes once read and checked."""

from dataclasses import dataclass, field

from .rules import PHASES


@dataclass
class LayerSpec:
    """One layer as written (after templates, repeats and ``${}`` are expanded)."""

    name: str
    type: str
    bottoms: list
    tops: list
    cfg: dict                 # the layer's own keys, converted by Key.convert, defaults filled
    file: str = "<net>"
    line: int = 0             # 1-based line of the layer's mapping in ``file``
    col: int = 0
    loss_weight: float = None  # None: the layer class default (1.0 for loss layers, else 0)
    lr_mult: tuple = ()       # per parameter, in param_specs order; missing → 1.0
    decay_mult: tuple = ()
    phases: frozenset = PHASES  # the phases it runs in (Caffe's include/exclude)
    rules: tuple = ()         # its include/exclude rules as written: (("include", [rule, ...]), ...)


@dataclass
class NetSpec:
    """A whole network file: its name, the resolved ``params``, and the layers in file order
    (``input:`` becomes a first layer of type ``Input``)."""

    name: str
    file: str
    layers: list
    params: dict = field(default_factory=dict)
    solver: dict = None       # the file's ``solver:`` section (Caffe solver keys), if any
    solver_line: int = 0

