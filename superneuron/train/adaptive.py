"""Caffe's adaptive solvers, AdaGrad, RMSProp and AdaDelta, as in-place updates of one
parameter (called by :class:`superneuron.train.optim.Optimizer` after clipping and weight decay).

Each follows the formula of Caffe's ``sgd_solvers`` (``adagrad_solver``, ``rmsprop_solver``,
``adadelta_solver``), which torch.optim's ``Adagrad`` (``lr_decay`` 0), ``RMSprop``
(``momentum`` 0, not centred) and ``Adadelta`` share:

- AdaGrad: ``h += g²``; ``w -= lr · g / (√h + delta)``.
- RMSProp: ``h = rms_decay · h + (1 - rms_decay) · g²``; ``w -= lr · g / (√h + delta)``.
- AdaDelta (``momentum`` is the decay ρ): ``h = ρ h + (1 - ρ) g²``;
  ``u = g · √((d + delta) / (h + delta))``; ``d = ρ d + (1 - ρ) u²``; ``w -= lr · u``.
  torch writes ``√(d + eps) / √(h + eps)``: the same value, rounded differently.

``g`` is overwritten (it holds the step); ``tmp`` (and ``tmp2``) are scratch of ``w``'s shape.
"""


def adagrad(xp, w, g, state, lr, delta, tmp):
    """One AdaGrad step; ``state`` is ``[sum of g²]``."""
    (history,) = state
    xp.multiply(g, g, out=tmp)
    history += tmp
    _divide_by_rms(xp, w, g, history, lr, delta, tmp)


def rmsprop(xp, w, g, state, lr, delta, decay, tmp):
    """One RMSProp step; ``state`` is ``[running mean of g²]``, decayed by ``decay``."""
    (history,) = state
    _running_mean(xp, history, g, decay, tmp)
    _divide_by_rms(xp, w, g, history, lr, delta, tmp)


def adadelta(xp, w, g, state, lr, delta, decay, scratch):
    """One AdaDelta step; ``state`` is ``[running mean of g², running mean of step²]``;
    ``scratch``: two arrays of ``w``'s size."""
    square_avg, acc_delta = state
    tmp, tmp2 = scratch
    _running_mean(xp, square_avg, g, decay, tmp)
    xp.add(acc_delta, delta, out=tmp)
    xp.add(square_avg, delta, out=tmp2)
    tmp /= tmp2
    xp.sqrt(tmp, out=tmp)
    g *= tmp  # g is the unscaled step u now
    _running_mean(xp, acc_delta, g, decay, tmp)
    g *= lr
    w -= g


def _running_mean(xp, avg, g, decay, tmp):
    # avg = decay * avg + (1 - decay) * g², as Caffe's axpby
    xp.multiply(g, g, out=tmp)
    tmp *= 1 - decay
    avg *= decay
    avg += tmp


def _divide_by_rms(xp, w, g, history, lr, delta, tmp):
    xp.sqrt(history, out=tmp)
    tmp += delta
    g /= tmp
    g *= lr
    w -= g


SCRATCH = {"AdaGrad": 1, "RMSProp": 1, "AdaDelta": 2}  # arrays of the largest parameter's size
STATE = {"AdaGrad": ("sum",), "RMSProp": ("square_avg",), "AdaDelta": ("square_avg", "acc_delta")}
