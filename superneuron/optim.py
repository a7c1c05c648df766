"""Solvers in Caffe's vocabulary: SGD (with momentum), Nesterov, Adam, and Caffe's AdaGrad, RMSProp
and AdaDelta (:mod:`superneuron.adaptive`), learning-rate policies with warm-up, gradient
clipping, and solver files.

Updates follow PyTorch's formulas, so results compare one to one with ``torch.optim``:

- SGD keeps ``v = momentum * v + (g + wd * w)`` and steps ``w -= lr * v`` (``torch.optim.SGD``).
  Caffe scales by lr before accumulating, ``v = momentum * v + lr * (g + wd * w)``; the two agree
  while lr is fixed and differ only in how a change of lr reaches the history.
- Nesterov is ``torch.optim.SGD(nesterov=True)``: the step is ``g + wd * w + momentum * v``.
- Adam is ``torch.optim.Adam``: L2 weight decay added to the gradient, bias corrections with
  step ``t = it + 1``; ``momentum``/``momentum2``/``delta`` are beta1/beta2/eps.
- AdaGrad, RMSProp (``rms_decay``) and AdaDelta (``momentum`` is its decay) are Caffe's formulas,
  which torch.optim's Adagrad, RMSprop and Adadelta share; ``delta`` is their epsilon. AdaGrad
  and RMSProp have no momentum (Caffe refuses one in a solver.prototxt; here it is unused).
- ``clip_gradients`` is ``torch.nn.utils.clip_grad_norm_``: when the global L2 norm of the
  gradients exceeds it, every gradient is scaled by ``clip / (norm + 1e-6)`` (Caffe omits the 1e-6).
- ``iter_size`` K (gradient accumulation, Caffe's): an iteration runs K forward and backward
  passes on K successive batches and sums their gradients (the runtime's Accumulate step); the
  update then clips that sum and scales it by 1/K, in Caffe's order (see :meth:`Optimizer.update`),
  so that K batches of b train as one batch of K·b (without clipping, BatchNorm or Dropout).

Caffe's per-parameter ``lr_mult`` and ``decay_mult`` scale the learning rate and the weight
decay, as a torch parameter group with ``lr * lr_mult`` and ``weight_decay * decay_mult`` would;
a parameter with ``lr_mult`` 0 is frozen (its gradient takes no part in clipping either).
Every update writes in place and uses only the scratch it declares (``workspace_bytes``): nothing
proportional to a parameter is allocated. The gradient is overwritten: it is scratch once read.
"""

import dataclasses
import difflib
import math
import os
import types
import typing
from dataclasses import dataclass

import yaml

from . import adaptive
from .errors import SNError, SpecError, where
from .files import read_text_capped
from .limits import MAX_ITER_SIZE, MAX_SOLVER_FILE_BYTES, over

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


def load_solver_prototxt(path):
    """``(SolverConfig, net path or None)`` from a Caffe ``solver.prototxt`` (translated by
    :mod:`superneuron.caffe.solver`); SpecError listing every problem as ``file:line:col: ...``."""
    from .caffe.solver import solver_mapping
    mapping, lines, net = solver_mapping(path)
    return solver_from_mapping(mapping, str(path), lines), net


def load_solver(path):
    """Read a solver YAML file (Caffe solver keys); one SpecError listing every problem, each
    as ``file:line: what is wrong``. A Caffe ``solver.prototxt`` is read by
    :mod:`superneuron.caffe.solver`."""
    if str(path).lower().endswith(".prototxt"):
        return load_solver_prototxt(path)[0]
    from .expr import count_nodes
    if not os.path.lexists(path):
        raise SpecError(f"{path}: no such solver file")
    text = read_text_capped(path, MAX_SOLVER_FILE_BYTES, "solver file", "MAX_SOLVER_FILE_BYTES", SpecError)
    loader = None
    try:
        loader = yaml.SafeLoader(text)
        node = loader.get_single_node()
        if node is not None:
            count_nodes(node, path)  # an alias bomb is refused before it is built
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


class Optimizer:
    """The solver of a SolverConfig. ``update(xp, it, entries, scratch)`` takes ``entries`` of
    ``(param, grad, [state arrays], lr_mult, decay_mult)`` and ``scratch(shape, dtype)`` giving
    views of the workspace declared by ``workspace_bytes``."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.grad_norm = None  # the global gradient norm of the last update, when clipping

    def for_epochs(self, samples, batch):
        """Its SolverConfig with ``epochs`` turned into ``max_iter`` (SolverConfig.with_epochs),
        which it then follows too (``max_iter`` shapes the poly and cosine learning rates); that
        SolverConfig. The state layout (its slots) does not change."""
        self.cfg = self.cfg.with_epochs(samples, batch)
        return self.cfg

    @property
    def type(self):
        return self.cfg.type

    @property
    def slots(self):
        """State arrays per learnable parameter (SGD without momentum keeps none)."""
        if self.cfg.type == "Adam":
            return 2
        if self.cfg.type in adaptive.STATE:
            return len(adaptive.STATE[self.cfg.type])
        return 1 if self.cfg.momentum else 0

    @property
    def needs_every_gradient(self):
        """Whether an update needs every gradient at once (clipping by their global norm), so
        that no parameter can be updated as soon as its own gradient is there."""
        return self.cfg.clip_gradients > 0

    def state_name(self, k):
        """The name of state array ``k`` (torch's names), for snapshots and the arena."""
        if self.cfg.type in adaptive.STATE:
            return adaptive.STATE[self.cfg.type][k]
        return ("exp_avg", "exp_avg_sq")[k] if self.cfg.type == "Adam" else "momentum"

    def state_names(self):
        """The names of the state arrays of one parameter, in slot order."""
        return tuple(self.state_name(k) for k in range(self.slots))

    def workspace_bytes(self, shapes, dtype):
        """Scratch for one update: arrays as large as the largest parameter (two for AdaDelta,
        else one), or none for SGD without weight decay (the gradient itself is the scratch)."""
        if not shapes or (self.cfg.type == "SGD" and not self.cfg.weight_decay):
            return 0
        from .layers.base import workspace_bytes
        largest = (max(shapes, key=lambda s: math.prod(s)), dtype)
        return workspace_bytes(*[largest] * adaptive.SCRATCH.get(self.cfg.type, 1))

    def lr(self, it):
        """The learning rate at 0-based iteration ``it``."""
        return learning_rate(self.cfg, it)

    @property
    def iter_size(self):
        """Batches whose gradients one iteration accumulates before its update."""
        return self.cfg.iter_size

    def update(self, xp, it, entries, scratch):
        """One step at 0-based iteration ``it`` for every entry; grads are left overwritten.
        With ``iter_size`` K > 1 the grads hold the sum of K batches' gradients."""
        cfg, lr = self.cfg, self.lr(it)
        live = [e for e in entries if e[3] != 0]  # lr_mult 0: frozen
        if not live:
            return
        # Caffe's order (sgd_solver.cpp, SGDSolver::ApplyUpdate): ClipGradients() on the
        # accumulated sum first, then per parameter Normalize() (diff *= 1 / iter_size),
        # Regularize() (the weight decay) and ComputeUpdateValue()
        if cfg.clip_gradients > 0:
            self._clip(xp, [e[1] for e in live])
        if cfg.iter_size > 1:
            for _, g, *_ in live:
                g *= g.dtype.type(1 / cfg.iter_size)
        buffers = []
        if self.workspace_bytes([e[0].shape for e in live], live[0][0].dtype):
            largest = max(live, key=lambda e: e[0].size)[0]
            buffers = [scratch((largest.size,), largest.dtype)  # reused by every parameter
                       for _ in range(adaptive.SCRATCH.get(cfg.type, 1))]
        for w, g, state, lr_mult, decay_mult in live:
            tmp, *more = [b[:w.size].reshape(w.shape) for b in buffers] or [None]
            decay = cfg.weight_decay * decay_mult
            if decay:  # g + wd * w, as torch's weight_decay (L1, as Caffe: g + wd * sign(w))
                if cfg.regularization_type == "L1":
                    xp.sign(w, out=tmp)
                    tmp *= decay
                else:
                    xp.multiply(w, decay, out=tmp)
                g += tmp
            if cfg.type == "Adam":
                self._adam(xp, it, w, g, state, lr * lr_mult, tmp)
            elif cfg.type == "AdaGrad":
                adaptive.adagrad(xp, w, g, state, lr * lr_mult, cfg.delta, tmp)
            elif cfg.type == "RMSProp":
                adaptive.rmsprop(xp, w, g, state, lr * lr_mult, cfg.delta, cfg.rms_decay, tmp)
            elif cfg.type == "AdaDelta":
                adaptive.adadelta(xp, w, g, state, lr * lr_mult, cfg.delta, cfg.momentum, tmp, *more)
            else:
                self._sgd(xp, w, g, state, lr * lr_mult, tmp)

    def _clip(self, xp, grads):
        # torch's clip_grad_norm_: the norm of the per-tensor norms, scale by max / (norm + 1e-6)
        norm = math.sqrt(sum(float(xp.vdot(g.reshape(-1), g.reshape(-1))) for g in grads))
        self.grad_norm = norm
        coef = self.cfg.clip_gradients / (norm + 1e-6)
        if coef < 1:
            for g in grads:
                g *= g.dtype.type(coef)

    def _sgd(self, xp, w, g, state, lr, tmp):
        mu = self.cfg.momentum
        step = g
        if state:
            v = state[0]
            v *= mu
            v += g
            if self.cfg.type == "Nesterov":  # g + mu * v
                xp.multiply(v, mu, out=tmp)
                g += tmp
            else:
                step = v
        xp.multiply(step, lr, out=g)  # g is free now: it holds the step
        w -= g

    def _adam(self, xp, it, w, g, state, lr, tmp):
        b1, b2, t = self.cfg.momentum, self.cfg.momentum2, it + 1
        m, v = state
        xp.subtract(g, m, out=tmp)  # m.lerp_(g, 1 - b1), as torch: m + (1 - b1) * (g - m)
        tmp *= 1 - b1
        m += tmp
        v *= b2
        xp.multiply(g, g, out=tmp)
        tmp *= 1 - b2
        v += tmp
        xp.sqrt(v, out=g)  # denominator sqrt(v) / sqrt(1 - b2^t) + eps, in g
        g /= math.sqrt(1 - b2 ** t)
        g += self.cfg.delta
        xp.divide(m, g, out=tmp)
        tmp *= lr / (1 - b1 ** t)
        w -= tmp


def make_optimizer(cfg=None):
    """The optimiser ``cfg`` asks for: a SolverConfig, a plain mapping of Caffe's solver keys
    (``{"type": "Adam", "base_lr": 0.001}``, checked as a solver file is), or None for the
    defaults."""
    if cfg is None:
        cfg = SolverConfig()
    elif isinstance(cfg, dict):
        cfg = solver_from_mapping(cfg, "make_optimizer")
    elif not isinstance(cfg, SolverConfig):
        raise SNError(f"make_optimizer takes a SolverConfig or a mapping of solver keys, got {type(cfg).__name__}")
    return Optimizer(cfg)
