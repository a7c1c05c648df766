"""Solvers in Caffe's vocabulary: SGD (with momentum), Nesterov, Adam, and Caffe's AdaGrad, RMSProp
and AdaDelta (:mod:`superneuron.train.adaptive`), and gradient clipping; their settings, solver files
and learning-rate policies are :mod:`superneuron.train.solver_config`'s.

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
Every formula is elementwise, so a parameter is updated :data:`SPAN` values at a time where it is
larger (the same operations on the same values: the same bits), and the scratch is that of one
span at most: 8 MiB of float32 rather than VGG-16's fc6, 392 MiB.
"""

import math
import os

import numpy as np

from ..errors import SNError
from ..layers.base import workspace_bytes
from . import adaptive, optim_kernels
from .solver_config import SolverConfig, learning_rate, solver_from_mapping

SPAN = 1 << 21  # values of a parameter an update takes at a time, where it needs scratch


class Optimizer:
    """The solver of a SolverConfig. ``update(xp, it, entries, scratch)`` takes ``entries`` of
    ``(param, grad, [state arrays], lr_mult, decay_mult)`` and ``scratch(shape, dtype)`` giving
    views of the workspace declared by ``workspace_bytes``."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.grad_norm = None  # the global gradient norm of the last update, when clipping
        self._lr_at = (None, None, None)  # (iteration, cfg, its rate): asked once a parameter
        self._fused = None  # optim_kernels.FusedSGD on a GPU, made on the first update there
        self.fused_missing = None  # why not, where it failed to compile (then False above)

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
        """Scratch for one update: arrays as large as the largest parameter's span (two for
        AdaDelta, else one), or none for SGD without weight decay (the gradient itself is the
        scratch)."""
        if not shapes or not self._needs_scratch:
            return 0
        span = ((min(SPAN, max(math.prod(s) for s in shapes)),), dtype)
        return workspace_bytes(*[span] * adaptive.SCRATCH.get(self.cfg.type, 1))

    @property
    def _needs_scratch(self):
        """All but SGD without weight decay (whose gradient, once read, holds the step)."""
        return self.cfg.type != "SGD" or bool(self.cfg.weight_decay)

    def lr(self, it):
        """The learning rate at 0-based iteration ``it``."""
        return learning_rate(self.cfg, it)

    @property
    def iter_size(self):
        """Batches whose gradients one iteration accumulates before its update."""
        return self.cfg.iter_size

    def guards_on_device(self, xp):
        """Whether :meth:`update` can take the losses' finiteness as a device flag and skip
        itself there (the one-kernel SGD on a GPU), so that the host need not read it back."""
        return (xp is not np and optim_kernels.mode_of(self.cfg) is not None
                and os.environ.get("SN_FUSED_UPDATE", "1") != "0")

    def replay_blocker(self, xp):
        """Why an update of this optimiser, once captured in a CUDA graph (runtime/graphs.py),
        could not be replayed at a later iteration, or None where it can. Asked after an update
        has run. What changes from one iteration to the next must reach the kernels through
        device memory: the one-kernel SGD (guards_on_device) reads the losses' finiteness as a
        device flag and its rates from tables that :meth:`refresh` rewrites; every other path
        takes the rate, and Adam its step, as host numbers, which a replay would repeat."""
        if not self.guards_on_device(xp):
            return (f"solver {self.cfg.type}: its update reads host values each iteration (only SGD and "
                    f"Nesterov in one kernel take theirs from the device)")
        if xp is not np and not self._fused:  # float64, or a kernel that did not compile
            return ("the update took SGD's per-parameter path, which reads host values"
                    + (f" ({self.fused_missing})" if self.fused_missing else ""))
        rate_changes = self.cfg.lr_policy != "fixed" or bool(self.cfg.warmup_iter)
        if rate_changes and not self._fused:
            return (f"the learning rate changes (lr_policy {self.cfg.lr_policy}) and this update takes it "
                    f"from the host" + (f": {self.fused_missing}" if self.fused_missing else ""))
        return None

    def refresh(self, it):
        """Before a captured update is replayed for 0-based iteration ``it``: write that
        iteration's learning rates where the one-kernel SGD reads them (nothing to do elsewhere:
        :meth:`replay_blocker` allows no other path whose rate changes)."""
        if self._fused:
            self._fused.refresh(self.lr(it))

    def update(self, xp, it, entries, scratch, finite=None):
        """One step at 0-based iteration ``it`` for every entry; grads are left overwritten.
        With ``iter_size`` K > 1 the grads hold the sum of K batches' gradients. ``finite``
        (see :meth:`guards_on_device`): a device flag, the step skipped where it is false."""
        cfg = self.cfg
        live = [e for e in entries if e[3] != 0]  # lr_mult 0: frozen
        if not live:
            return
        at, of, _ = self._lr_at
        if at != it or of is not cfg:  # the update in the backward asks once a parameter
            self._lr_at = (it, cfg, self.lr(it))
        lr = self._lr_at[2]
        # Caffe's order (sgd_solver.cpp, SGDSolver::ApplyUpdate): ClipGradients() on the
        # accumulated sum first, then per parameter Normalize() (diff *= 1 / iter_size),
        # Regularize() (the weight decay) and ComputeUpdateValue()
        if cfg.clip_gradients > 0:
            self._clip(xp, [e[1] for e in live])
        if cfg.iter_size > 1:
            for _, g, *_ in live:
                g *= g.dtype.type(1 / cfg.iter_size)
        if xp is not np and self._fused_update(xp, live, lr, finite):
            return
        if finite is not None and not bool(finite):  # (a float64 net: the flag read back here)
            return
        buffers, span = [], max(e[0].size for e in live)
        if self._needs_scratch:
            span = min(span, SPAN)
            buffers = [scratch((span,), live[0][0].dtype)  # reused by every parameter and span
                       for _ in range(adaptive.SCRATCH.get(cfg.type, 1))]
        for w, g, state, lr_mult, decay_mult in live:
            w, g, state = w.reshape(-1), g.reshape(-1), [s.reshape(-1) for s in state]
            for a in range(0, w.size, span):
                b = min(a + span, w.size)
                tmp = [buf[:b - a] for buf in buffers]
                self._update_one(xp, it, (w[a:b], g[a:b], [s[a:b] for s in state]), lr * lr_mult,
                                 cfg.weight_decay * decay_mult, tmp or [None])

    def _fused_update(self, xp, live, lr, finite=None):
        """Every entry's update in one GPU kernel (optim_kernels: SGD, plain, momentum or
        Nesterov, L2 or no decay, float32), the same bits as the per-parameter path; False
        where it does not apply, or with ``SN_FUSED_UPDATE=0``."""
        if not self.guards_on_device(xp):
            return False
        if any(a.dtype != np.float32 or not a.flags.c_contiguous for w, g, state, *_ in live for a in (w, g, *state)):
            return False
        if self._fused is False:
            return False
        try:
            if self._fused is None:
                self._fused = optim_kernels.FusedSGD(xp)
            self._fused.update(live, lr, self.cfg.weight_decay, self.cfg.momentum,
                               optim_kernels.mode_of(self.cfg), finite)
        except Exception as e:  # noqa: BLE001 - a kernel that does not compile here: nothing ran yet
            self._fused, self.fused_missing = False, f"{type(e).__name__}: {str(e).strip()[:200]}"
            return False
        return True

    def _update_one(self, xp, it, span, lr, decay, scratch):
        """The update of one span of one parameter (``(w, g, state)``, flat views); ``scratch``:
        its scratch arrays (the first for every optimiser, more for AdaDelta)."""
        cfg = self.cfg
        w, g, state = span
        tmp = scratch[0]
        if decay:  # g + wd * w, as torch's weight_decay (L1, as Caffe: g + wd * sign(w))
            if cfg.regularization_type == "L1":
                xp.sign(w, out=tmp)
                tmp *= decay
            else:
                xp.multiply(w, decay, out=tmp)
            g += tmp
        if cfg.type == "Adam":
            self._adam(xp, it, w, g, state, lr, tmp)
        elif cfg.type == "AdaGrad":
            adaptive.adagrad(xp, w, g, state, lr, cfg.delta, tmp)
        elif cfg.type == "RMSProp":
            adaptive.rmsprop(xp, w, g, state, lr, cfg.delta, cfg.rms_decay, tmp)
        elif cfg.type == "AdaDelta":
            adaptive.adadelta(xp, w, g, state, lr, cfg.delta, cfg.momentum, scratch)
        else:
            self._sgd(xp, w, g, state, lr, tmp)

    def _clip(self, xp, grads):
        # torch's clip_grad_norm_: the norm of the per-tensor norms, scale by max / (norm + 1e-6)
        if xp is not np:
            return self._clip_on_device(xp, grads)
        norm = math.sqrt(sum(float(xp.vdot(g.reshape(-1), g.reshape(-1))) for g in grads))
        self.grad_norm = norm
        coef = self.cfg.clip_gradients / (norm + 1e-6)
        if coef < 1:
            for g in grads:
                g *= g.dtype.type(coef)

    def _clip_on_device(self, xp, grads):
        """:meth:`_clip` without reading the norm back: the norm (float64) and the factor
        min(1, max / (norm + 1e-6)) stay device scalars, so a GPU's host never waits here
        (``grad_norm`` is then a device scalar; reading it is the sync). A factor of 1 leaves
        every gradient as it was, as the host path's skipped multiply does."""
        total = xp.zeros((), np.float64)
        for g in grads:
            total += xp.vdot(g.reshape(-1), g.reshape(-1))
        norm = xp.sqrt(total)
        self.grad_norm = norm
        coef = xp.minimum(self.cfg.clip_gradients / (norm + 1e-6), 1.0)
        for g in grads:
            g *= coef.astype(g.dtype)

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
