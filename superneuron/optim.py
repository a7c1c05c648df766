"""Solvers in Caffe's vocabulary: SGD (with momentum), Nesterov and Adam, learning-rate policies
with warm-up, and solver files.

Updates follow PyTorch's formulas (``torch.optim.SGD``/``Adam``), so results compare one to one:
SGD keeps ``v = momentum * v + (g + wd * w)`` and steps ``w -= lr * v`` (Caffe scales by lr
before accumulating; the two agree while lr is fixed). Caffe's per-parameter ``lr_mult`` and
``decay_mult`` scale the learning rate and the weight decay. Every update writes in place and
uses only the scratch it declares (``workspace_bytes``): no allocation proportional to a
parameter.
"""

import dataclasses
import difflib
import math
from dataclasses import dataclass, field

import numpy as np
import yaml

from .errors import SpecError, where

TYPES = ("SGD", "Nesterov", "Adam")
POLICIES = ("fixed", "step", "multistep", "poly", "cosine")


@dataclass(frozen=True)
class SolverConfig:
    """Caffe solver keys (``momentum2`` and ``delta`` are Adam's beta2 and epsilon)."""

    type: str = "SGD"
    base_lr: float = 0.01
    momentum: float = 0.9
    momentum2: float = 0.999
    delta: float = 1e-8
    weight_decay: float = 0.0005
    lr_policy: str = "fixed"
    gamma: float = 0.1
    stepsize: int = 0
    stepvalue: tuple = ()
    power: float = 1.0
    min_lr: float = 0.0
    warmup_iter: int = 0
    max_iter: int = 1000
    display: int = 50
    test_interval: int = 0
    test_iter: int = 0
    snapshot: int = 0
    snapshot_prefix: str = ""
    problems: tuple = field(default=(), compare=False, repr=False)

    def __post_init__(self):
        problems = list(self.check())
        if problems:
            raise SpecError(problems)

    def check(self):
        """What is wrong with these values, as messages (empty when all is well)."""
        if self.type not in TYPES:
            yield f"type: expected one of {', '.join(TYPES)}, got {self.type!r}"
        if self.lr_policy not in POLICIES:
            yield f"lr_policy: expected one of {', '.join(POLICIES)}, got {self.lr_policy!r}"
        if self.lr_policy == "step" and self.stepsize <= 0:
            yield "lr_policy step needs stepsize > 0"
        if self.lr_policy == "multistep" and (not self.stepvalue or list(self.stepvalue) != sorted(self.stepvalue)):
            yield "lr_policy multistep needs stepvalue: an ascending list of iterations"
        if self.base_lr < 0:
            yield f"base_lr must be >= 0, got {self.base_lr}"
        if not 0 <= self.momentum < 1 or not 0 <= self.momentum2 < 1:
            yield "momentum and momentum2 must be in [0, 1)"
        if self.max_iter < 0:
            yield f"max_iter must be >= 0, got {self.max_iter}"

    def with_overrides(self, **values):
        """A copy with some values replaced (command-line flags)."""
        return dataclasses.replace(self, **values)

    def describe(self):
        """A one-line summary, e.g. ``SGD lr 0.01 momentum 0.9 weight_decay 0.0005 (fixed)``."""
        text = f"{self.type} lr {self.base_lr:g}"
        if self.type != "SGD" or self.momentum:
            text += f" momentum {self.momentum:g}"
        if self.type == "Adam":
            text += f" momentum2 {self.momentum2:g}"
        text += f" weight_decay {self.weight_decay:g} ({self.lr_policy}"
        text += f", warm-up {self.warmup_iter})" if self.warmup_iter else ")"
        return text


_FIELDS = {f.name: f for f in dataclasses.fields(SolverConfig) if f.name != "problems"}


def _convert(key, value):
    """``value`` converted to the type of solver key ``key``; ValueError saying what was expected."""
    default = _FIELDS[key].default
    if isinstance(default, bool) or isinstance(value, bool):
        raise ValueError(f"expected a {type(default).__name__}, got {value!r}")
    if isinstance(default, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise ValueError(f"expected an integer, got {value!r}")
        return value
    if isinstance(default, float):
        if not isinstance(value, (int, float)):
            raise ValueError(f"expected a number, got {value!r}")
        return float(value)
    if isinstance(default, tuple):
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
            raise ValueError(f"expected a list of integers, got {value!r}")
        return tuple(items)
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def solver_from_mapping(mapping, file="<solver>", lines=None):
    """A SolverConfig from a mapping of solver keys; every problem in one SpecError, each as
    ``file:line: what`` (``lines`` maps keys to line numbers when known)."""
    lines = lines or {}
    values, problems = {}, []
    if not isinstance(mapping, dict):
        raise SpecError(where(file, 1) + "a solver is a mapping of solver keys (base_lr: 0.01, ...)")
    for key, value in mapping.items():
        at = where(file, lines.get(key, None))
        if key not in _FIELDS:
            close = difflib.get_close_matches(str(key), list(_FIELDS), n=1)
            problems.append(at + f"unknown solver key '{key}'" + (f"; did you mean '{close[0]}'?" if close else ""))
            continue
        try:
            values[key] = _convert(key, value)
        except ValueError as e:
            problems.append(at + f"'{key}': {e}")
    if problems:
        raise SpecError(problems)
    try:
        return SolverConfig(**values)
    except SpecError as e:
        raise SpecError([where(file) + p for p in e.problems]) from None


def load_solver(path):
    """Read a solver YAML file (Caffe solver keys); SpecError with file and line on problems."""
    try:
        with open(path) as f:
            node = yaml.compose(f)
    except FileNotFoundError:
        raise SpecError(f"{path}: no such solver file") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark else None
        raise SpecError(where(path, line) + f"not valid YAML ({getattr(e, 'problem', e)})") from None
    if node is None or not isinstance(node, yaml.MappingNode):
        raise SpecError(where(path, 1) + "a solver file is a mapping of solver keys (base_lr: 0.01, ...)")
    lines = {k.value: k.start_mark.line + 1 for k, _ in node.value}
    mapping = yaml.safe_load(open(path))
    return solver_from_mapping(mapping, path, lines)


def learning_rate(cfg, it):
    """The learning rate at 0-based iteration ``it`` (Caffe's policies, then linear warm-up)."""
    base, policy = cfg.base_lr, cfg.lr_policy
    if policy == "fixed":
        lr = base
    elif policy == "step":
        lr = base * cfg.gamma ** (it // cfg.stepsize)
    elif policy == "multistep":
        lr = base * cfg.gamma ** sum(1 for s in cfg.stepvalue if it >= s)
    elif policy == "poly":
        lr = base * max(0.0, 1 - it / max(cfg.max_iter, 1)) ** cfg.power
    else:  # cosine
        lr = cfg.min_lr + (base - cfg.min_lr) * (1 + math.cos(math.pi * min(it, cfg.max_iter)
                                                               / max(cfg.max_iter, 1))) / 2
    if it < cfg.warmup_iter:
        lr *= (it + 1) / cfg.warmup_iter
    return lr


class Optimizer:
    """Updates parameters in place: ``update(xp, it, entries, scratch)``, where ``entries`` are
    ``(param, grad, [state arrays], lr_mult, decay_mult)`` and ``scratch(shape, dtype)`` gives
    workspace views. The gradient is overwritten (it is scratch once the update has read it)."""

    def __init__(self, cfg):
        self.cfg = cfg

    @property
    def type(self):
        return self.cfg.type

    @property
    def slots(self):
        """State arrays per learnable parameter."""
        if self.cfg.type == "Adam":
            return 2
        return 1 if self.cfg.momentum else 0

    def state_name(self, k):
        return ("exp_avg", "exp_avg_sq")[k] if self.cfg.type == "Adam" else "momentum"

    def workspace_bytes(self, shapes, dtype):
        """Scratch for one update: one array as large as the largest parameter."""
        if not shapes:
            return 0
        from .layers.base import workspace_bytes
        return workspace_bytes((max(shapes, key=lambda s: int(np.prod(s))), dtype))

    def lr(self, it):
        """The learning rate at 0-based iteration ``it``."""
        return learning_rate(self.cfg, it)

    def update(self, xp, it, entries, scratch):
        """One step for every ``(param, grad, state, lr_mult, decay_mult)`` in ``entries``."""
        cfg, lr = self.cfg, self.lr(it)
        if not entries:
            return
        largest = max(entries, key=lambda e: e[0].size)[0]
        buffer = scratch((largest.size,), largest.dtype)  # one buffer, reused by every parameter
        for w, g, state, lr_mult, decay_mult in entries:
            if lr_mult == 0:
                continue
            tmp = buffer[:w.size].reshape(w.shape)
            decay = cfg.weight_decay * decay_mult
            if decay:  # g + wd * w, as torch's weight_decay
                xp.multiply(w, decay, out=tmp)
                g += tmp
            if cfg.type == "Adam":
                self._adam(xp, it, w, g, state, lr * lr_mult, tmp)
            else:
                self._sgd(xp, w, g, state, lr * lr_mult, tmp)

    def _sgd(self, xp, w, g, state, lr, tmp):
        mu = self.cfg.momentum
        step = g
        if state:
            v = state[0]
            v *= mu
            v += g
            if self.cfg.type == "Nesterov":
                xp.multiply(v, mu, out=tmp)
                g += tmp
            else:
                step = v
        xp.multiply(step, lr, out=tmp)
        w -= tmp

    def _adam(self, xp, it, w, g, state, lr, tmp):
        b1, b2, t = self.cfg.momentum, self.cfg.momentum2, it + 1
        m, v = state
        m *= b1
        xp.multiply(g, 1 - b1, out=tmp)
        m += tmp
        xp.multiply(g, g, out=tmp)
        tmp *= 1 - b2
        v *= b2
        v += tmp
        xp.sqrt(v, out=g)
        g /= math.sqrt(1 - b2 ** t)
        g += self.cfg.delta
        xp.divide(m, g, out=tmp)
        tmp *= lr / (1 - b1 ** t)
        w -= tmp


def make_optimizer(cfg):
    """The optimiser a SolverConfig asks for."""
    return Optimizer(cfg)
