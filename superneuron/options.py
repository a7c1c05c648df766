"""What a user chooses for a plan, as one frozen value: :class:`PlanOptions`.

Both doors build it once: the command-line tools from their flags (cli/common.py
``options_from_args``), the Python API from keywords (``load_net(path, memory="5MiB")``,
``Net(spec, policy="gist")``, ``planning.plan(spec, "superneurons", budget=2 << 30)``). It is
checked once, here, with one-line errors, and passed whole to ``Net``, ``planning.plan`` and
the passes (scheduler/context.py: the options, the cost model and the memo); a pass reads the
fields it needs.

    options = PlanOptions.of("superneurons", memory="5MiB", placement="planned")
    options.budget, options.policy, options.offload_params   # 5242880 'superneurons' False
    options.name                                              # 'superneurons' (shown to users)

A policy is a preset's name; parameter offload is its own field (``offload_params``), which a
name ending in ``+params`` (``--policy superneurons+params``, as the CLI has always taken) sets:
the suffix is read here, once, and nothing downstream looks at a policy's spelling.
"""

import dataclasses
import difflib
import math

import numpy as np

from .errors import SNError
from .sizes import parse_size

# The presets of scheduler/policy.py, which checks that it gives each of these its passes.
POLICIES = ("baseline", "liveness", "recompute", "offload", "superneurons", "gist", "optimal", "auto")
SOLVED = ("optimal", "auto")  # policies that solve a program per plan (scheduler/optimal.py)
PARAMS = "+params"  # a policy name ending so keeps the parameters on the host (scheduler/params.py)
# The policies to list (--help, sn-depth's default scan): the presets, and SuperNeurons' with
# parameter offload; any preset but baseline takes "+params".
LISTED = POLICIES + ("superneurons" + PARAMS,)
PLACEMENTS = ("dynamic", "planned")  # scheduler/placement.py
DEVICES = ("cpu", "gpu")
DTYPES = ("float32", "float64")
LOSSY = ("fp16",)  # the lossy encodings (scheduler/encode.py)
DEFAULT_BUCKET_BYTES = 25 << 20  # PyTorch DDP's bucket_cap_mb default, 25 MiB
DEFAULT_SOLVER_SECONDS = None  # no cap: the solver's work limits end it, the same plan every run
# Keywords that name a field by the CLI's word for it: Net's and load_net's ``memory`` (--memory).
ALIASES = {"memory": "budget"}
# The flag each field comes from, for errors that a user of either door reads.
FLAGS = {"budget": "--memory", "host_memory": "--host-memory", "workspace_limit": "--workspace-limit",
         "bucket_bytes": "--bucket-size", "solver_seconds": "--solver-time", "ranks": "--ranks",
         "placement": "--placement", "policy": "--policy", "device": "--device", "lossy": "--lossy",
         "cuda_graph": "--cuda-graph"}


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    """A plan's options. ``policy``: a preset of :data:`POLICIES` (None: ``auto`` under a
    budget, else ``baseline``, as ``sn-train --memory`` means); ``budget``, ``host_memory``,
    ``workspace_limit``, ``bucket_bytes``: bytes, as ints or text (``"5MiB"``; None: unbounded);
    ``placement``: ``'dynamic'`` or ``'planned'``; ``device``: ``'cpu'`` or ``'gpu'`` (whose
    kernels and estimates planning sees); ``dtype``: of the activations, parameters and
    gradients; ``lossy``: the lossy encodings a policy that encodes may use; ``solver_seconds``:
    a cap on the optimal policy's solving time (None: none; its work limits end it); ``ranks``:
    data-parallel ranks, their gradients all-reduced in buckets of ``bucket_bytes``, BatchNorm
    over the global batch with ``sync_bn``; ``offload_params``: parameters, gradients and
    optimiser state on the host; ``cuda_graph``: a training iteration is captured once as a CUDA
    graph and replayed (runtime/graphs.py; where it cannot be, the run says why and goes on
    without). The last is a run's option rather than a plan's: no pass reads it."""

    policy: str = None
    budget: int = None
    host_memory: int = None
    workspace_limit: int = None
    placement: str = "dynamic"
    device: str = "cpu"
    dtype: str = "float32"
    lossy: tuple = ()
    solver_seconds: float = DEFAULT_SOLVER_SECONDS
    ranks: int = 1
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    sync_bn: bool = False
    offload_params: bool = False
    cuda_graph: bool = False

    def __post_init__(self):
        def put(name, value):
            object.__setattr__(self, name, value)

        for name in ("budget", "host_memory", "workspace_limit", "bucket_bytes"):
            put(name, _size(name, getattr(self, name)))
        if self.bucket_bytes is None or self.bucket_bytes < 1:
            raise SNError(f"{_flag('bucket_bytes')} must be at least 1 byte, got {self.bucket_bytes}")
        put("placement", _choice("placement", self.placement, PLACEMENTS))
        put("device", _choice("device", self.device, DEVICES))
        if _dtype_name(self.dtype) not in DTYPES:
            raise SNError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        put("dtype", _dtype_name(self.dtype))
        lossy = (self.lossy,) if isinstance(self.lossy, str) else tuple(self.lossy or ())
        put("lossy", tuple(_choice("lossy", v, LOSSY) for v in lossy))
        if self.solver_seconds is not None:  # None: no cap
            put("solver_seconds", _number("solver_seconds", self.solver_seconds))
        if isinstance(self.ranks, bool) or not isinstance(self.ranks, int) or self.ranks < 1:
            raise SNError(f"{_flag('ranks')} must be a whole number of at least 1, got {self.ranks!r}")
        put("sync_bn", bool(self.sync_bn))
        put("offload_params", bool(self.offload_params))
        put("cuda_graph", bool(self.cuda_graph))
        policy = self.policy
        if policy is None:
            policy = "auto" if self.budget is not None else "baseline"
        if not isinstance(policy, str):
            raise SNError(f"{_flag('policy')} must be a policy's name, got {policy!r}")
        offered = ", ".join(p + PARAMS for p in POLICIES if p != "baseline")
        if policy.endswith(PARAMS):
            policy = policy[:-len(PARAMS)]
            put("offload_params", True)
        put("policy", _choice("policy", policy, POLICIES, f"; with parameter offload: {offered}", self.policy))
        if self.offload_params and policy == "baseline":
            raise SNError(f"policy 'baseline{PARAMS}': parameter offload is not offered with baseline (it frees "
                          f"a parameter's device copy after its step, which needs liveness's passes in a known "
                          f"order); with parameter offload: {offered}")

    @classmethod
    def of(cls, options=None, **settings):
        """A PlanOptions from ``options`` (a PlanOptions, a policy's name, or None: the
        defaults) with the fields ``settings`` names changed (``memory`` for ``budget``, as
        Net and the CLI call it). SNError, naming the closest field, for an unknown keyword."""
        if isinstance(options, str):
            settings.setdefault("policy", options)
            options = None
        elif options is not None and not isinstance(options, PlanOptions):
            raise SNError(f"options must be a PlanOptions or a policy's name, got {type(options).__name__}")
        for alias, name in ALIASES.items():
            if alias in settings:
                if name in settings:
                    raise SNError(f"give {alias}= or {name}=, not both (the same budget)")
                settings[name] = settings.pop(alias)
        known = [f.name for f in dataclasses.fields(cls)]
        for key in settings:
            if key not in known:
                close = difflib.get_close_matches(key, known + list(ALIASES), n=1)
                raise SNError(f"unknown option '{key}'" + (f"; did you mean '{close[0]}'?" if close else "")
                              + f" (options: {', '.join(list(ALIASES) + known)})")
        if options is None:
            return cls(**settings)
        return dataclasses.replace(options, **settings) if settings else options

    @property
    def name(self):
        """The policy as users see and write it: the preset's name, ``+params`` with parameter
        offload (``superneurons+params``)."""
        return self.policy + (PARAMS if self.offload_params else "")

    @property
    def solved(self):
        """Whether the policy solves a program per plan (``optimal``, ``auto``)."""
        return self.policy in SOLVED


def _flag(name):
    """``name`` as an error shows it: the keyword and the CLI's flag for it."""
    return f"{name} ({FLAGS[name]})" if name in FLAGS else name


def _size(name, value):
    """Bytes from an int or a text size (``'5MiB'``); None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        return parse_size(value)
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise SNError(f"{_flag(name)} must be a size in bytes (an int or text such as '5MiB'), got {value!r}")
    if value < 0:
        raise SNError(f"{_flag(name)} must not be negative, got {value}")
    return value


def _choice(name, value, allowed, more="", shown=None):
    """``value`` when it is one of ``allowed``, else SNError listing them (``shown``: the value
    as the user gave it, where it differs)."""
    if value not in allowed:
        close = difflib.get_close_matches(str(value), allowed, n=1)
        value = value if shown is None else shown
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise SNError(f"unknown {name} '{value}'; known: {', '.join(LISTED if name == 'policy' else allowed)}"
                      f"{more}{hint}")
    return value


def _dtype_name(dtype):
    """``'float64'`` for NumPy's spellings of it (``np.float64``, ``'f8'``); else as given."""
    try:
        return np.dtype(dtype).name
    except TypeError:
        return dtype


def _number(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise SNError(f"{_flag(name)} must be a number of seconds more than 0, got {value!r}")
    return float(value)
