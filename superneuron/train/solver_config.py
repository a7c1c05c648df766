"""Solver settings in Caffe's vocabulary: :class:`SolverConfig` (every key of a solver file,
checked), solver files (YAML, or Caffe's solver.prototxt through superneuron.netfile.caffe.solver)
and the learning-rate policies with warm-up. The updates themselves are superneuron.train.optim's.
"""

import dataclasses
import difflib
import math
import os
import types
import typing
from dataclasses import dataclass

import yaml

from ..errors import SpecError, where
from ..files import read_text_capped
from ..limits import MAX_ITER_SIZE, MAX_SOLVER_FILE_BYTES, over
from ..netfile.yaml_read import check_tags, count_nodes

TYPES = ("SGD", "Nesterov", "Adam", "AdaGrad", "RMSProp", "AdaDelta")
POLICIES = ("fixed", "step", "multistep", "poly", "cosine", "exp", "inv", "sigmoid")
REGULARIZATION = ("L2", "L1")
ALIASES = {"lr": "base_lr", "iters": "max_iter"}  # command-line names of solver keys


@dataclass(frozen=True)
class SolverConfig:
    """Caffe solver keys (``momentum2`` is Adam's beta2, ``delta`` the epsilon of Adam and the
    adaptive solvers, ``rms_decay`` RMSProp's decay).

    ``epochs``, when set, is turned into ``max_iter`` by :meth:`with_epochs` once the size of
    the training set is known; ``clip_gradients`` <= 0 means no clipping.
    """

    type: str = "SGD"
    base_lr: float = 0.01
    momentum: float = 0.9
    momentum2: float = 0.999
    delta: float = 1e-8
    rms_decay: float = 0.99
    weight_decay: float = 0.0005
    lr_policy: str = "fixed"
    gamma: float = 0.1
    stepsize: int = 0
    stepvalue: typing.Tuple[int, ...] = ()
    power: float = 1.0
    min_lr: float = 0.0
    warmup_iter: int = 0
    max_iter: int = 1000
    epochs: typing.Optional[float] = None
    clip_gradients: float = -1.0
    display: int = 50
    test_interval: int = 0
    test_iter: int = 0
    snapshot: int = 0
    snapshot_prefix: str = ""
    regularization_type: str = "L2"
    average_loss: int = 1
    iter_size: int = 1

    def __post_init__(self):
        problems = [msg for _, msg in check(self)]
        if problems:
            raise SpecError(problems)

    def with_overrides(self, **values):
        """A copy with some values replaced (command-line flags; ``lr`` and ``iters`` are
        accepted for ``base_lr`` and ``max_iter``); SpecError naming every bad flag."""
        problems, clean = [], {}
        for key, value in values.items():
            key = ALIASES.get(key, key)
            if key not in _KINDS:
                problems.append(f"unknown solver key '{key}'" + _hint(key, list(_KINDS) + list(ALIASES)))
                continue
            try:
                clean[key] = _convert(key, value)
            except ValueError as e:
                problems.append(f"'{key}': {e}")
        if problems:
            raise SpecError(problems)
        return dataclasses.replace(self, **clean)

    def with_epochs(self, samples, batch):
        """With ``epochs`` set: a copy whose ``max_iter`` covers that many passes over ``samples``
        training samples in batches of ``batch`` (``iter_size`` of them per iteration; at least
        one iteration); else ``self``."""
        if self.epochs is None:
            return self
        per_iteration = batch * self.iter_size
        return dataclasses.replace(self, max_iter=max(1, math.ceil(self.epochs * samples / per_iteration)))

    def describe(self):
        """A one-line summary, e.g. ``SGD lr 0.01 momentum 0.9 weight_decay 0.0005 (fixed)``."""
        text = f"{self.type} lr {self.base_lr:g}"
        if self.type in ("Nesterov", "Adam", "AdaDelta") or (self.type == "SGD" and self.momentum):
            text += f" momentum {self.momentum:g}"
        if self.type == "RMSProp":
            text += f" rms_decay {self.rms_decay:g}"
        if self.type == "Adam":
            text += f" momentum2 {self.momentum2:g}"
        text += f" weight_decay {self.weight_decay:g}" + (" (L1)" if self.regularization_type == "L1" else "")
        if self.clip_gradients > 0:
            text += f" clip {self.clip_gradients:g}"
        if self.iter_size > 1:
            text += f" iter_size {self.iter_size}"
        text += f" ({self.lr_policy}"
        return text + (f", warm-up {self.warmup_iter})" if self.warmup_iter else ")")


def check(c):
    """What is wrong with the solver values of ``c`` (a SolverConfig or any object with its
    attributes), as ``(key, message)`` pairs; none when all is well."""
    infinite = [k for k, (kind, _) in _KINDS.items() if kind is float and getattr(c, k) is not None
                and not math.isfinite(getattr(c, k))]
    for key in infinite:  # a NaN passes every comparison below: catch it first
        yield key, f"{key} must be a finite number, got {getattr(c, key)}"
    if infinite:
        return
    for key, allowed in (("type", TYPES), ("lr_policy", POLICIES), ("regularization_type", REGULARIZATION)):
        value = getattr(c, key)
        if value not in allowed:
            yield key, f"{key}: expected one of {', '.join(allowed)}, got {value!r}" + _hint(value, allowed)
    if c.lr_policy == "step" and c.stepsize <= 0:
        yield "lr_policy", "lr_policy step needs stepsize > 0"
    if c.lr_policy == "multistep" and (not c.stepvalue or any(
            b <= a for a, b in zip(c.stepvalue, c.stepvalue[1:]))):
        yield "lr_policy", "lr_policy multistep needs stepvalue: a strictly ascending list of iterations"
    if c.lr_policy in ("poly", "cosine") and c.max_iter <= 0:
        yield "lr_policy", f"lr_policy {c.lr_policy} needs max_iter > 0"
    if c.type == "Nesterov" and c.momentum <= 0:
        yield "momentum", "type Nesterov needs momentum > 0"
    for key in ("momentum", "momentum2", "rms_decay"):
        if not 0 <= getattr(c, key) < 1:
            yield key, f"{key} must be in [0, 1), got {getattr(c, key)}"
    for key in ("base_lr", "weight_decay", "min_lr", "power", "stepsize", "warmup_iter", "max_iter",
                "display", "test_interval", "test_iter", "snapshot"):
        if getattr(c, key) < 0:
            yield key, f"{key} must be >= 0, got {getattr(c, key)}"
    if any(v < 0 for v in c.stepvalue):
        yield "stepvalue", "stepvalue must hold iterations >= 0"
    if c.lr_policy == "sigmoid":  # Caffe's sigmoid decays with a negative gamma
        if c.gamma == 0:
            yield "gamma", "lr_policy sigmoid needs gamma != 0 (negative to decay)"
    elif c.gamma <= 0:
        yield "gamma", f"gamma must be > 0, got {c.gamma}"
    if c.average_loss < 1:
        yield "average_loss", f"average_loss must be >= 1, got {c.average_loss}"
    if c.iter_size < 1:
        yield "iter_size", f"iter_size must be >= 1, got {c.iter_size}"
    elif c.iter_size > MAX_ITER_SIZE:
        yield "iter_size", over("iter_size", c.iter_size, MAX_ITER_SIZE, "MAX_ITER_SIZE")
    if c.delta <= 0:
        yield "delta", f"delta must be > 0, got {c.delta}"
    if c.epochs is not None and c.epochs <= 0:
        yield "epochs", f"epochs must be > 0, got {c.epochs}"


def _hint(word, choices):
    close = difflib.get_close_matches(str(word), choices, n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def _kind(hint):
    """``(python type, optional)`` of a field's annotation."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union:
        return args[0], True
    return typing.get_origin(hint) or hint, False


_KINDS = {name: _kind(hint) for name, hint in typing.get_type_hints(SolverConfig).items()}


def _number(value):
    """``value`` as a finite float; YAML reads ``1e-3`` (no dot) as a string, so numeric strings count."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError
    return value


def _convert(key, value):
    """``value`` converted to the type of solver key ``key``; ValueError saying what was expected."""
    kind, optional = _KINDS[key]
    if value is None and optional:
        return None
    try:
        if kind is float:
            return float(_number(value))
        if kind is int:
            value = _number(value)
            if float(value).is_integer():
                return int(value)
            raise ValueError
        if kind is tuple:
            items = value if isinstance(value, (list, tuple)) else [value]
            return tuple(_convert("stepsize", v) for v in items)
    except ValueError:
        want = {float: "a number", int: "an integer", tuple: "a list of integers"}[kind]
        if isinstance(value, float) and not math.isfinite(value):
            want = "a finite number"  # a NaN or an infinity, from YAML's .nan/.inf or --lr nan
        raise ValueError(f"expected {want}, got {value!r}") from None
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def solver_from_mapping(mapping, file="<solver>", lines=None):
    """A SolverConfig from a mapping of solver keys; every problem in one SpecError, each as
    ``file:line: what``. ``lines`` maps keys to line numbers, or is the line of the whole
    mapping (a net file's ``solver:`` section)."""
    at_line = lines if isinstance(lines, dict) else {}
    default_line = None if isinstance(lines, dict) else lines
    if not isinstance(mapping, dict):
        raise SpecError(where(file, default_line) + "a solver is a mapping of solver keys (base_lr: 0.01, ...)")

    def at(key):
        return where(file, at_line.get(key, default_line))

    values, problems = {}, []
    for key, value in mapping.items():
        if key not in _KINDS:
            problems.append(at(key) + f"unknown solver key '{key}'" + _hint(key, list(_KINDS)))
            continue
        try:
            values[key] = _convert(key, value)
        except ValueError as e:
            problems.append(at(key) + f"'{key}': {e}")
    if "epochs" in mapping and "max_iter" in mapping:
        problems.append(at("epochs") + "give max_iter or epochs, not both")
    if not problems:
        try:
            return SolverConfig(**values)
        except SpecError:  # values that do not fit together: put each at the key it is about
            merged = types.SimpleNamespace(**dict(dataclasses.asdict(SolverConfig()), **values))
            problems = [at(key) + msg for key, msg in check(merged)]
    raise SpecError(problems)


def load_solver_prototxt(path, find_net=True):
    """``(SolverConfig, net path or None)`` from a Caffe ``solver.prototxt`` (translated by
    :mod:`superneuron.netfile.caffe.solver`); SpecError listing every problem as ``file:line:col: ...``.
    ``find_net=False``: the net is given elsewhere; the solver's ``net:`` is not looked for."""
    # here, not at the top: Caffe's formats load protobuf, which costs start-up time
    from ..netfile.caffe.solver import solver_mapping
    mapping, lines, net = solver_mapping(path, find_net)
    return solver_from_mapping(mapping, str(path), lines), net


def load_solver(path):
    """Read a solver YAML file (Caffe solver keys); one SpecError listing every problem, each
    as ``file:line: what is wrong``. A Caffe ``solver.prototxt`` is read by
    :mod:`superneuron.netfile.caffe.solver`."""
    if str(path).lower().endswith(".prototxt"):
        return load_solver_prototxt(path, find_net=False)[0]  # the net was named: it wins
    if not os.path.lexists(path):
        raise SpecError(f"{path}: no such solver file")
    text = read_text_capped(path, MAX_SOLVER_FILE_BYTES, "solver file", "MAX_SOLVER_FILE_BYTES", SpecError)
    loader = None
    try:
        loader = yaml.SafeLoader(text)
        node = loader.get_single_node()
        if node is not None:
            count_nodes(node, path)  # an alias bomb is refused before it is built
            check_tags(node, path)  # and a !!python/... tag before anything is constructed
        mapping = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        why = getattr(e, "problem", None) or getattr(e, "reason", None) or str(e).splitlines()[0]
        raise SpecError(where(path, mark.line + 1 if mark else None) + f"not valid YAML ({why})") from None
    except ValueError as e:  # a scalar YAML reads but Python refuses (an integer of 5000 digits)
        raise SpecError(where(path) + f"not valid YAML ({str(e).splitlines()[0]})") from None
    finally:
        if loader is not None:
            loader.dispose()
    if not isinstance(node, yaml.MappingNode):
        raise SpecError(where(path, 1) + "a solver file is a mapping of solver keys (base_lr: 0.01, ...)")
    lines, duplicates = {}, []
    for key, _ in node.value:
        line = key.start_mark.line + 1
        if key.value in lines:
            duplicates.append(where(path, line) + f"solver key '{key.value}' given twice (first on line "
                                                  f"{lines[key.value]})")
        lines.setdefault(key.value, line)
    try:
        cfg = solver_from_mapping(mapping, path, lines)
    except SpecError as e:
        raise SpecError(duplicates + e.problems) from None
    if duplicates:
        raise SpecError(duplicates)
    return cfg


def learning_rate(cfg, it):
    """The learning rate at 0-based iteration ``it``: Caffe's policy, then linear warm-up
    (``(it + 1) / warmup_iter`` of it while ``it < warmup_iter``)."""
    base, policy = cfg.base_lr, cfg.lr_policy
    if policy == "fixed":
        lr = base
    elif policy == "step":
        lr = base * cfg.gamma ** (it // cfg.stepsize)
    elif policy == "multistep":
        lr = base * cfg.gamma ** sum(1 for s in cfg.stepvalue if it >= s)
    elif policy == "poly":
        lr = base * (1 - min(it, cfg.max_iter) / cfg.max_iter) ** cfg.power
    elif policy == "exp":
        lr = base * cfg.gamma ** it
    elif policy == "inv":
        lr = base * (1 + cfg.gamma * it) ** -cfg.power
    elif policy == "sigmoid":
        lr = base / (1 + math.exp(min(-cfg.gamma * (it - cfg.stepsize), 700.0)))
    else:  # cosine, held at min_lr after max_iter
        lr = cfg.min_lr + (base - cfg.min_lr) * (1 + math.cos(math.pi * min(it, cfg.max_iter) / cfg.max_iter)) / 2
    if it < cfg.warmup_iter:
        lr *= (it + 1) / cfg.warmup_iter
    return lr
