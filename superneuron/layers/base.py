"""The Layer contract: what every layer declares and how it is called.

A layer knows shapes and kernels, never the schedule. It declares:

- ``KEYS``: its YAML keys (Caffe's names, flattened), each a :class:`Key` with type and default;
- ``BOTTOMS`` / ``TOPS``: its arity as ``(min, max)`` (``max=None`` for any number);
- :meth:`setup`: top shapes from bottom shapes, raising :class:`LayerError` on a mismatch;
- :meth:`param_specs`: its parameters (learned) and state buffers (not learned), with fillers;
- :meth:`backward_reads`: which bottoms and tops its backward reads (liveness and recompute
  reason about exactly this; the test harness hands ``None`` for everything else);
- ``INPLACE``: whether its top may share bottom 0's memory (and its bottom gradient the top
  gradient's);
- :meth:`grad_inplace`: which bottom gradients may share which top gradients' memory;
- ``CHEAP``: cheap to recompute (SuperNeurons' cost-aware recomputation);
- :meth:`fuses_relu`: whether its forward can end with a ReLU over its top in the same pass
  (``ctx.relu``), so that a recomputation of it and of an in-place ReLU after it is one pass
  over memory, not two (scheduler/fuse.py); :meth:`fuses_scale`, likewise, whether its forward
  can write a Scale's output from its own (``ctx.scale``);
- :meth:`algorithms`: per phase, the ways to compute it, fastest first, each with its workspace;
- :meth:`cost`: flops and bytes moved, from which an estimated time follows;
- :meth:`encodings`: the encoded forms (Gist) its backward can read instead of its operands.

Kernels write into the arrays they are handed: ``forward`` into ``tops``, ``backward`` into
``bottom_grads`` (entries that are ``None`` are not needed) and ``param_grads``, always
overwriting, never accumulating. Scratch memory comes from ``ctx.scratch`` (a view into the
step's workspace), never from a hidden allocation proportional to the tensors.
"""

import difflib
import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import LayerError
from ..limits import MAX_SPEC_INT, over
from .codecs import tensor_encoding
from .fillers import parse_filler
from .scratch import workspace_bytes  # noqa: F401  (the layers take it from here)

REQUIRED = object()


class Key:
    """A YAML key a layer accepts: its kind, default and (optionally) allowed values.

    Kinds: ``int``, ``float``, ``bool``, ``str``, ``pair`` (an int or ``[h, w]``, converted to a
    tuple of two ints), ``floats`` (a number or list of numbers, converted to a tuple of floats),
    ``shapes`` (one shape or a list of shapes, each a list of positive ints → tuple of tuples),
    ``ints`` (an int or a list of ints → a tuple: Reshape's ``shape``, Slice's ``slice_point``),
    ``fillers`` (one filler or a list of them → a tuple of dicts: DummyData's ``data_filler``),
    ``filler`` (a name such as ``msra`` or a mapping ``{type: gaussian, std: 0.01}``, converted to
    a dict), ``strs`` (a string or list of strings, converted to a tuple).
    """

    KINDS = ("int", "float", "bool", "str", "pair", "floats", "filler", "fillers", "strs", "shapes", "ints")

    def __init__(self, kind, default=REQUIRED, choices=None, doc=""):
        assert kind in self.KINDS, kind
        self.kind, self.default, self.choices, self.doc = kind, default, choices, doc
        if default is not REQUIRED and default is not None:
            self.default = self.convert(default)  # so defaults may be written as in YAML

    @property
    def required(self):
        return self.default is REQUIRED

    def convert(self, value):
        """Return ``value`` converted to this key's kind, or raise ValueError saying what was expected."""
        kind = self.kind
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"expected an integer, got {value!r}")
        elif kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"expected a number, got {value!r}")
            value = _finite(value)
        elif kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"expected true or false, got {value!r}")
        elif kind == "str":
            if not isinstance(value, str):
                raise ValueError(f"expected a string, got {value!r}")
        elif kind == "pair":
            if isinstance(value, int) and not isinstance(value, bool):
                value = (value, value)
            elif (isinstance(value, (list, tuple)) and len(value) == 2
                  and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
                value = tuple(value)
            else:
                raise ValueError(f"expected an integer or [h, w], got {value!r}")
        elif kind == "floats":
            items = value if isinstance(value, (list, tuple)) else [value]
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
                raise ValueError(f"expected a number or a list of numbers, got {value!r}")
            value = tuple(_finite(v) for v in items)
        elif kind == "ints":
            items = value if isinstance(value, (list, tuple)) else [value]
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
                raise ValueError(f"expected an integer or a list of integers, got {value!r}")
            value = tuple(items)
        elif kind == "strs":
            items = value if isinstance(value, (list, tuple)) else [value]
            if not all(isinstance(v, str) for v in items):
                raise ValueError(f"expected a name or a list of names, got {value!r}")
            value = tuple(items)
        elif kind == "shapes":
            if (not isinstance(value, (list, tuple)) or not value
                    or not isinstance(value[0], (list, tuple))):
                value = [value]
            for shape in value:
                if not (isinstance(shape, (list, tuple)) and shape and all(
                        isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
                    raise ValueError(f"expected a shape such as [8, 3, 32, 32], got {shape!r}")
            value = tuple(tuple(s) for s in value)
        elif kind == "filler":
            value = parse_filler(value)
        elif kind == "fillers":
            items = value if isinstance(value, (list, tuple)) else [value]
            value = tuple(parse_filler(v) for v in items)
        if kind in ("int", "pair", "ints", "shapes"):
            _check_ints(value)
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"expected one of {', '.join(map(str, self.choices))}, got {value!r}")
        return value



def _check_ints(value):
    """ValueError for an integer (in a converted int, pair, ints or shapes value) whose size is
    over MAX_SPEC_INT: no layer needs one, and the shapes it would make cannot exist."""
    items = [value] if isinstance(value, int) else [v for v in value for v in (v if isinstance(v, tuple) else (v,))]
    for v in items:
        if abs(v) > MAX_SPEC_INT:
            raise ValueError(over("integer", v, MAX_SPEC_INT, "MAX_SPEC_INT"))


def _finite(value):
    """``value`` as a float; ValueError for a NaN or an infinity (YAML's ``.nan``, ``.inf``), or
    an int too large for a float: either would train on garbage in silence."""
    try:
        value = float(value)
    except OverflowError:
        raise ValueError(f"expected a finite number, got {value!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value!r}")
    return value




@dataclass
class ParamSpec:
    """A parameter (``learnable``: it has a gradient and the optimiser updates it) or a state
    buffer (``learnable=False``: BatchNorm running statistics and the like); ``kept=False``: a
    state buffer that each iteration's forward writes anew for that iteration's backward or
    recomputation, left out of snapshots and their fingerprint (BatchNorm's ``saved_mean``)."""

    name: str
    shape: tuple
    filler: dict
    learnable: bool = True
    fan_in: int = 1
    fan_out: int = 1
    lr_mult: float = 1.0
    decay_mult: float = 1.0
    kept: bool = True


@dataclass
class Algo:
    """One way to compute a phase of a layer, with the workspace bytes it needs."""

    name: str
    workspace: int = 0
    speed: float = 1.0  # relative speed estimate (higher is faster); measured tables override it
    # a kernel for the host alone (NumPy's Winograd): a plan for a GPU leaves it out, since
    # there cuDNN's engines run (its own Winograd among those its heuristics rank first)
    host_only: bool = False


@dataclass
class Cost:
    """Work of a layer: flops and bytes moved, forward and backward."""

    fwd_flops: float = 0.0
    bwd_flops: float = 0.0
    fwd_bytes: float = 0.0
    bwd_bytes: float = 0.0
    # the forward run again as a Recompute, where it does less (BatchNorm from the statistics
    # its forward saved); None: the forward's
    rec_flops: float = None
    rec_bytes: float = None


@dataclass(eq=False)
class Context:
    """What a kernel may use besides its operands: the array module, the phase, scratch memory
    from the step's workspace, the random stream, and (for Input/Data) the batch being fed."""

    xp: object = np
    train: bool = True
    recompute: bool = False
    workspace: object = None  # the step's workspace, carved by scratch()
    algo: str = None
    seed: int = 0
    feed: dict = None  # Input/Data: the batch being fed (None: {})
    backend: object = None
    # the layer's direct encoded form (Layer.encodings), if any: a backward reads it, a forward
    # writes it too
    encoded: object = None
    ranks: object = None  # synchronised BatchNorm: the ranks whose batches it pools (see sum_ranks)
    labels_checked: bool = False  # its labels were checked on the host when fed (check_labels)
    relu: bool = False  # a forward ends with max(top, 0) in the same pass (Layer.fuses_relu)
    # a forward writes a Scale's top from its own in the same pass (Layer.fuses_scale; its
    # ``relu`` is then the Scale's): the Scale's (layer, params, top), norm.ScaleAfter
    scale: object = None
    _used: int = field(default=0, init=False, repr=False)

    def __post_init__(self):
        if self.feed is None:
            self.feed = {}

    def host_value(self, value, reason):
        """The device scalar ``value`` as a Python float: a host sync on a GPU, which the
        backend counts (Backend.host_sync)."""
        if self.backend is not None:
            return self.backend.host_value(value, reason)
        return float(value)

    def sum_ranks(self, array):
        """``array`` summed over the ranks of synchronised BatchNorm (``ranks.size``); a new
        array of its shape (a few floats per channel: not the arena's)."""
        return self.ranks.sum(array, "a synchronised BatchNorm")

    def scratch(self, shape, dtype):
        """A view of ``shape`` and ``dtype`` carved from the workspace (successive calls do not
        overlap). Raises if the layer asks for more than the workspace its algorithm declared."""
        dtype = np.dtype(dtype)
        n = math.prod(shape) * dtype.itemsize  # Python ints: exact, and 30x quicker than np.prod
        start = -(-self._used // 16) * 16  # keep every view 16-byte aligned
        if self.workspace is None or start + n > self.workspace.nbytes:
            have = 0 if self.workspace is None else self.workspace.nbytes
            raise AssertionError(f"scratch of {n} bytes at {start} exceeds workspace of {have}")
        self._used = start + n
        return self.workspace[start:start + n].view(dtype).reshape(shape)

    def reset_scratch(self):
        """Carve the workspace from its start again: for a kernel made of two parts run one
        after the other, which declares the larger of their workspaces, not their sum."""
        self._used = 0

    def load(self, dst, src):
        """Copy the host array ``src`` into the device array ``dst`` (Input and Data layers)."""
        if self.backend is not None:
            return self.backend.copy_from_host(dst, src)
        np.copyto(dst, src, casting="same_kind")

    def uniform(self, out, salt=0):
        """Fill ``out`` with U[0, 1) numbers fixed by this step's seed: the same on recompute."""
        if self.backend is not None:
            return self.backend.uniform(self.seed + salt, out)
        np.random.default_rng(self.seed + salt).random(out=out, dtype=out.dtype)
        return out


class Layer:
    """Base class of all layers; see the module docstring for the contract."""

    type = ""
    KEYS = {}
    BOTTOMS = (1, 1)
    TOPS = (1, 1)
    INPLACE = False
    CHEAP = False
    LOSS = False       # its top is a scalar loss, weighted by ``loss_weight``
    ANY_TOP_LOSS = False  # a ``loss_weight`` written on it makes it a loss (Caffe's Python layers)
    BACKWARD = True    # False: never differentiated (Accuracy, Input, Data)
    ALIAS_TOPS = False  # tops are views of bottom 0 (Split, Flatten, Reshape): forward does nothing
    ALIAS_GRADS = False  # bottom 0's gradient is a view of top 0's (Flatten, Reshape): backward does nothing
    LABEL_BOTTOMS = ()  # indices of bottoms that are labels: never differentiated
    INTERNAL = False    # only ever inserted by the graph, never written in network files
    kernels = None      # vendor kernels of the device (layers/cudnn.py), set by the Graph
    source_file = None  # the net file that wrote it, set by the Graph (Python layers look beside it)
    RECOMPUTABLE = True  # False: its forward must run once an iteration (a user's Python layer)
    HOST_CODE = False  # its forward or backward runs host code of its own (a user's Python layer),
    #                    which a captured CUDA graph would not run again (runtime/graphs.py)

    def __init__(self, name, bottoms, tops, cfg, dtype=np.float32):
        self.name, self.bottoms, self.tops = name, list(bottoms), list(tops)
        self.cfg = cfg
        self.dtype = np.dtype(dtype)
        self.bottom_shapes, self.top_shapes = [], []

    @classmethod
    def config(cls, raw):
        """Check a mapping of YAML keys against ``KEYS``; return it converted, defaults filled.

        Raises LayerError naming the first bad key (the spec module checks key by key itself so
        that it can point at lines; this is for the Python API and tests)."""
        cfg = {}
        for key, value in raw.items():
            if key not in cls.KEYS:
                close = difflib.get_close_matches(key, list(cls.KEYS), n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                raise LayerError(f"unknown key '{key}'{hint}")
            try:
                cfg[key] = cls.KEYS[key].convert(value)
            except ValueError as e:
                raise LayerError(f"'{key}': {e}") from None
        for key, spec in cls.KEYS.items():
            if key not in cfg:
                if spec.required:
                    raise LayerError(f"missing required key '{key}'")
                cfg[key] = spec.default
        return cfg

    def __repr__(self):
        return f"{self.type}({self.name!r})"

    def fail(self, message):
        """Raise a LayerError; the graph prefixes it with the file, line and layer."""
        raise LayerError(message)

    def setup(self, bottom_shapes):
        """Check the bottoms and return the top shapes (a list of tuples)."""
        raise NotImplementedError

    def param_specs(self):
        """Parameters and state buffers, after :meth:`setup`."""
        return []

    def backward_reads(self):
        """``(bottom indices, top indices)`` whose data the backward reads."""
        return tuple(range(len(self.bottoms))), ()

    def grad_inplace(self):
        """``[(bottom index, top index)]``, in order of preference: the bottom gradients that
        may be written over a top gradient's memory where nothing after the backward reads that
        gradient (the in-place pass decides): the backward reads each element of that top
        gradient before it writes the same element there, and gives the same bits either way.
        An ``INPLACE`` layer's bottom 0 over top 0."""
        return [(0, 0)] if self.INPLACE else []

    def grad_over_bottom(self):
        """``[bottom index]``: the bottoms whose gradient may be written over the bottom's own
        memory where nothing after the backward reads that bottom (the in-place pass decides):
        the backward is done reading the bottom (for its parameter gradients) before it
        writes any element of the bottom gradient, or each sample's before that sample's, and
        gives the same bits either way. None by default."""
        return []

    def backward_operands(self, bottoms, tops, get=None):
        """``(bottoms, tops)`` as :meth:`backward` is given them: ``get(x)`` of those that
        :meth:`backward_reads` names (``x`` itself without ``get``), None for the others (the
        calling convention the Runtime and kernel timing share)."""
        reads_b, reads_t = self.backward_reads()
        get = get or (lambda x: x)
        return ([get(b) if i in reads_b else None for i, b in enumerate(bottoms)],
                [get(t) if i in reads_t else None for i, t in enumerate(tops)])

    def draws(self, train):
        """Whether a step of this layer draws random numbers (``ctx.uniform``) in the phase
        ``train`` says: their seed is the iteration's, a host value that a captured CUDA graph
        would replay unchanged (runtime/graphs.py). Default: no."""
        return False

    def algorithms(self, phase):
        """Ways to run ``phase`` (``'forward'`` or ``'backward'``), fastest first."""
        return [Algo("default", 0)]

    def encodings(self):
        """The encoded forms (layers/codecs.py's ``Encoding``) in which this layer's backward
        can read operands that :meth:`backward_reads` names, beyond the exact and lossy forms
        any backward takes (a Decode gives those back whole): ``sign`` where it reads only the
        signs of a value, a ``direct`` form its backward reads itself (then ``backward`` finds
        it in ``ctx.encoded`` and its bottoms and tops as None; ``forward``, given
        ``ctx.encoded``, writes it there too, as :meth:`encode` would). Default: none."""
        return []

    def tensor_encoding(self, codec, shape, dtype):
        """The Encoding of tensor form ``codec`` (``sign``, ``sparse``, ``fp16``) of an operand
        of ``shape`` and ``dtype`` that this layer's backward reads: the bytes its encoded form
        takes and the scratch of its Encode and Decode (layers/codecs.py; the same for every
        layer, asked of the layer so that the scheduler learns bytes, never kernels)."""
        return tensor_encoding(codec, shape, dtype)

    def encode(self, ctx, codec, bottoms, tops, out):
        """Write this layer's ``direct`` encoded form ``codec`` of its backward's operands
        (``bottoms`` and ``tops`` as :meth:`backward_operands` gives them) into ``out``."""
        raise NotImplementedError(f"{self.type} has no encoded form {codec!r}")

    def cost(self):
        """Flops and bytes moved; the default is an elementwise layer."""
        n = sum(int(np.prod(s)) for s in self.top_shapes)
        item = self.dtype.itemsize
        return Cost(n, 2 * n, 2 * n * item, 3 * n * item)

    def fuses_relu(self):
        """Whether :meth:`forward` honours ``ctx.relu``: ends with ``max(top, 0)`` over its one
        top in the same pass, the same bits as a ReLU after it (default: no)."""
        return False

    def constant(self, xp, name, value, dtype=None):
        """The host array ``value`` (a layer's own, set up with its shapes; known as ``name``)
        as ``dtype`` on ``xp``'s device, uploaded on first use and kept while ``value`` is the
        same object: an upload at every call would copy from the host inside each iteration,
        and inside a CUDA graph's capture (runtime/graphs.py) it would query the capture's
        event, which CUDA forbids; the warm-up makes it before."""
        if xp is np:
            return np.asarray(value, dtype=dtype)
        kept = self.__dict__.setdefault("_constants", {})
        found = kept.get(name)
        if found is None or found[0] is not value:
            found = kept[name] = (value, xp.asarray(value, dtype=dtype))
        return found[1]

    def fuses_scale(self, scale):
        """Whether :meth:`forward` honours ``ctx.scale`` for the Scale layer ``scale`` over its
        one top: writes that Scale's top too (then its ReLU, with ``ctx.relu``) in the same pass,
        the same bits as the Scale's forward after it (default: no; BatchNorm's)."""
        return False

    def forward(self, ctx, bottoms, tops, params):
        """Compute ``tops`` (written in place) from ``bottoms`` and ``params`` (dict by name)."""
        raise NotImplementedError

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        """Write ``bottom_grads`` (skip ``None`` entries) and ``param_grads`` (dict by name)."""
        raise NotImplementedError
