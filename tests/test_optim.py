"""Solvers against torch.optim (parameter groups standing in for lr_mult/decay_mult, and
clip_grad_norm_ for clip_gradients), learning-rate policies against their formulas and torch's
schedulers, solver files' errors with their lines, and updates that allocate nothing big."""

import math
import tracemalloc

import numpy as np
import pytest
import torch
from one_line import raises_one_line

from superneuron.errors import SNError, SpecError
from superneuron.layers.base import Context, workspace_bytes
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig, learning_rate, load_solver, solver_from_mapping

SHAPES = [(3, 4), (5,), (2, 2, 3)]


def problem_data(dtype, steps=5, seed=0, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s).astype(dtype) for s in shapes]
    grads = [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(steps)]
    return params, grads


def run_ours(cfg, params, grads_per_step, mults=None, xp=np, start=0, state=None):
    """``params`` after one update per entry of ``grads_per_step`` (copies; ``state`` is updated)."""
    opt = make_optimizer(cfg)
    mults = mults or [(1.0, 1.0)] * len(params)
    nbytes = opt.workspace_bytes([p.shape for p in params], params[0].dtype)
    params = [xp.asarray(p).copy() for p in params]
    if state is None:
        state = [[xp.zeros_like(p) for _ in range(opt.slots)] for p in params]
    for it, grads in enumerate(grads_per_step, start):
        entries = [(p, xp.asarray(g).copy(), s, lr_mult, decay_mult)
                   for p, g, s, (lr_mult, decay_mult) in zip(params, grads, state, mults)]
        ws = xp.zeros(nbytes, xp.uint8) if nbytes else None
        opt.update(xp, it, entries, Context(xp, workspace=ws).scratch)
    return params


def run_torch(cfg, params, grads_per_step, mults=None, schedule=None):
    mults = mults or [(1.0, 1.0)] * len(params)
    ts = [torch.tensor(p, requires_grad=True) for p in params]
    groups = [{"params": [t], "lr": cfg.base_lr * lm, "weight_decay": cfg.weight_decay * dm}
              for t, (lm, dm) in zip(ts, mults)]
    if cfg.type == "Adam":
        opt = torch.optim.Adam(groups, betas=(cfg.momentum, cfg.momentum2), eps=cfg.delta)
    else:
        opt = torch.optim.SGD(groups, momentum=cfg.momentum, nesterov=cfg.type == "Nesterov")
    sched = schedule(opt) if schedule else None
    for grads in grads_per_step:
        for t, g in zip(ts, grads):
            t.grad = torch.tensor(g)
        if cfg.clip_gradients > 0:
            torch.nn.utils.clip_grad_norm_(ts, cfg.clip_gradients)
        opt.step()
        if sched:
            sched.step()
    return [t.detach().numpy() for t in ts]


CASES = [("SGD", 0.0, 0.0), ("SGD", 0.0, 1e-2), ("SGD", 0.9, 0.0), ("SGD", 0.9, 1e-2),
         ("Nesterov", 0.9, 0.0), ("Nesterov", 0.5, 1e-2), ("Adam", 0.9, 0.0), ("Adam", 0.8, 1e-2)]


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-13), (np.float32, 2e-6)])
@pytest.mark.parametrize("kind, momentum, decay", CASES)
def test_updates_match_torch_optim(kind, momentum, decay, dtype, tol):
    params, steps = problem_data(dtype)
    cfg = SolverConfig(type=kind, base_lr=0.05, momentum=momentum, momentum2=0.99, weight_decay=decay)
    for ours, theirs, before in zip(run_ours(cfg, params, steps), run_torch(cfg, params, steps), params):
        assert ours.dtype == dtype
        assert not np.allclose(ours, before)  # the update did move the weights
        np.testing.assert_allclose(ours, theirs, rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", ["SGD", "Nesterov", "Adam"])
def test_momentum_is_torchs_when_the_learning_rate_changes(kind):
    """torch's momentum accumulates unscaled gradients (Caffe's accumulates lr * g): the two
    part ways once lr changes, here every other step."""
    params, steps = problem_data(np.float64, steps=6, seed=5)
    cfg = SolverConfig(type=kind, base_lr=0.1, lr_policy="step", stepsize=2, gamma=0.2)
    theirs = run_torch(cfg, params, steps, schedule=lambda o: torch.optim.lr_scheduler.StepLR(o, 2, 0.2))
    for ours, t in zip(run_ours(cfg, params, steps), theirs):
        np.testing.assert_allclose(ours, t, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("kind", ["SGD", "Nesterov", "Adam"])
def test_lr_and_decay_multipliers_act_as_torch_parameter_groups(kind):
    params, steps = problem_data(np.float64, seed=1)
    cfg = SolverConfig(type=kind, base_lr=0.03, weight_decay=0.02)
    mults = [(2.0, 0.0), (0.5, 3.0), (1.0, 1.0)]
    for ours, theirs in zip(run_ours(cfg, params, steps, mults), run_torch(cfg, params, steps, mults)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-13, atol=1e-13)


def test_lr_mult_zero_freezes_a_parameter_and_its_state():
    params, steps = problem_data(np.float64, steps=2)
    cfg = SolverConfig(type="Adam", weight_decay=0.1, clip_gradients=1e-3)
    state = [[np.zeros_like(p) for _ in range(2)] for p in params]
    out = run_ours(cfg, params, steps, [(0.0, 1.0), (1.0, 1.0), (1.0, 1.0)], state=state)
    np.testing.assert_array_equal(out[0], params[0])
    assert not state[0][0].any() and not state[0][1].any() and state[1][0].any()
    # and the frozen gradient takes no part in clipping: as if the parameter were not there
    rest = run_ours(cfg, params[1:], [g[1:] for g in steps])
    for a, b in zip(out[1:], rest):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", ["SGD", "Adam"])
@pytest.mark.parametrize("clip", [0.5, 100.0])  # clipping every step, and never
def test_clip_gradients_is_torch_clip_grad_norm(kind, clip):
    params, steps = problem_data(np.float64, seed=2)
    cfg = SolverConfig(type=kind, base_lr=0.1, clip_gradients=clip)
    for ours, theirs in zip(run_ours(cfg, params, steps), run_torch(cfg, params, steps)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-13, atol=1e-13)
    opt = make_optimizer(cfg)
    g = [x.copy() for x in steps[0]]
    entries = [(p.copy(), x, [np.zeros_like(p) for _ in range(opt.slots)], 1, 0) for p, x in zip(params, g)]
    opt.update(np, 0, entries, lambda shape, dtype: np.zeros(shape, dtype))
    assert opt.grad_norm == pytest.approx(math.sqrt(sum((x ** 2).sum() for x in steps[0])))


@pytest.mark.parametrize("kind", ["SGD", "Nesterov", "Adam"])
def test_updates_are_bit_reproducible_and_resume_exactly(kind):
    """Five steps at once equal three, then two more from the same state, bit for bit."""
    params, steps = problem_data(np.float32, seed=3)
    cfg = SolverConfig(type=kind, lr_policy="step", stepsize=2, gamma=0.5)
    whole = run_ours(cfg, params, steps)
    slots = make_optimizer(cfg).slots
    state = [[np.zeros_like(p) for _ in range(slots)] for p in params]
    half = run_ours(cfg, params, steps[:3], state=state)
    resumed = run_ours(cfg, half, steps[3:], start=3, state=state)
    for a, b in zip(whole, resumed):
        np.testing.assert_array_equal(a, b)


def test_slots_state_names_and_workspace():
    shapes = [(512, 3, 3), (7,), (64, 100)]
    need = workspace_bytes(((64, 100), np.float32))
    for kwargs, slots, names, nbytes in [
            (dict(type="SGD", momentum=0.0, weight_decay=0.0), 0, (), 0),
            (dict(type="SGD", momentum=0.9, weight_decay=0.0), 1, ("momentum",), 0),
            (dict(type="SGD", momentum=0.9), 1, ("momentum",), need),
            (dict(type="Nesterov", weight_decay=0.0), 1, ("momentum",), need),
            (dict(type="Adam"), 2, ("exp_avg", "exp_avg_sq"), need)]:
        opt = make_optimizer(SolverConfig(**kwargs))
        assert (opt.slots, opt.state_names(), opt.workspace_bytes(shapes, np.float32)) == (slots, names, nbytes)
        assert opt.workspace_bytes([], np.float32) == 0


@pytest.mark.parametrize("kind", ["SGD", "Nesterov", "Adam", "AdaDelta", "RMSProp", "AdaGrad"])
def test_a_parameter_updated_a_span_at_a_time_gets_the_same_bits(kind, monkeypatch):
    """optim.SPAN values at a time (a ragged last span, parameters smaller than one): the same
    bits as the whole parameter at once, with a span's scratch."""
    from superneuron.train import optim
    params, steps = problem_data(np.float32, seed=5, shapes=[(7, 143), (5,), (64,)])
    cfg = SolverConfig(type=kind, momentum=0.9 if kind != "AdaGrad" else 0.0, weight_decay=1e-2, base_lr=0.1)
    whole = run_ours(cfg, params, steps)
    monkeypatch.setattr(optim, "SPAN", 64)
    opt = make_optimizer(cfg)
    scratch = {"AdaDelta": 2}.get(kind, 1)
    assert opt.workspace_bytes([(7, 143), (5,)], np.float32) == workspace_bytes(*[((64,), np.float32)] * scratch)
    spans = run_ours(cfg, params, steps)
    for a, b in zip(whole, spans):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    assert not np.array_equal(whole[0], params[0])


@pytest.mark.parametrize("kind", ["SGD", "Nesterov", "Adam"])
def test_updates_allocate_nothing_big(kind):
    params = [np.ones((512, 1024), np.float32), np.ones(1000, np.float32)]  # 2 MiB
    opt = make_optimizer(SolverConfig(type=kind, weight_decay=1e-3, clip_gradients=1.0))
    ws = np.zeros(opt.workspace_bytes([p.shape for p in params], np.float32), np.uint8)
    assert ws.nbytes == workspace_bytes(((512, 1024), np.float32))
    entries = [(p, np.ones_like(p), [np.zeros_like(p) for _ in range(opt.slots)], 1.0, 1.0) for p in params]
    opt.update(np, 0, entries, Context(np, workspace=ws).scratch)  # warm up numpy's own caches
    tracemalloc.start()
    try:
        opt.update(np, 1, entries, Context(np, workspace=ws).scratch)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 and np.isfinite(params[0]).all() and params[0][0, 0] != 1


# -- learning-rate policies -------------------------------------------------------------------
def torch_lrs(make, n=100, base=0.1):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base)
    sched, out = make(opt), []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_policies_follow_caffes_formulas():
    base = dict(base_lr=0.1, max_iter=100)
    step = SolverConfig(lr_policy="step", stepsize=30, gamma=0.5, **base)
    assert [learning_rate(step, i) for i in (0, 29, 30, 95)] == [0.1, 0.1, 0.05, 0.1 * 0.5 ** 3]
    multi = SolverConfig(lr_policy="multistep", stepvalue=(10, 50), gamma=0.1, **base)
    assert [learning_rate(multi, i) for i in (9, 10, 49, 50, 99)] == pytest.approx([0.1, 0.01, 0.01, 1e-3, 1e-3])
    poly = SolverConfig(lr_policy="poly", power=2.0, **base)  # 0.1 * (1 - it/100)^2
    assert [learning_rate(poly, i) for i in (0, 25, 100, 150)] == pytest.approx([0.1, 0.1 * 0.75 ** 2, 0, 0])
    cos = SolverConfig(lr_policy="cosine", min_lr=0.01, **base)  # 0.01 + 0.09 * (1 + cos(pi it/100)) / 2
    assert [learning_rate(cos, i) for i in (0, 50, 100, 200)] == pytest.approx([0.1, 0.055, 0.01, 0.01])
    assert learning_rate(cos, 25) == pytest.approx(0.01 + 0.09 * (1 + math.sqrt(0.5)) / 2)
    assert make_optimizer(cos).lr(50) == learning_rate(cos, 50)


def test_warmup_ramps_linearly_into_the_policy():
    warm = SolverConfig(base_lr=0.1, warmup_iter=4)  # (it + 1) / 4 of 0.1 for it < 4
    assert [learning_rate(warm, i) for i in range(6)] == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1, 0.1])
    stepped = SolverConfig(base_lr=0.1, warmup_iter=5, lr_policy="step", stepsize=3, gamma=0.5)
    assert learning_rate(stepped, 3) == pytest.approx(0.1 * 0.5 * 4 / 5)  # both multipliers apply
    S = torch.optim.lr_scheduler  # LinearLR from 1/W to 1 over W - 1 steps is (it + 1) / W
    theirs = torch_lrs(lambda o: S.ChainedScheduler([S.LinearLR(o, 1 / 5, 1.0, total_iters=4), S.StepLR(o, 3, 0.5)]),
                       n=20)
    assert [learning_rate(stepped, i) for i in range(20)] == pytest.approx(theirs, rel=1e-12)


def test_policies_match_torch_schedulers():
    base = dict(base_lr=0.1, max_iter=100)
    S = torch.optim.lr_scheduler
    for cfg, make in [
            (SolverConfig(lr_policy="step", stepsize=30, gamma=0.5, **base), lambda o: S.StepLR(o, 30, 0.5)),
            (SolverConfig(lr_policy="multistep", stepvalue=(10, 50), **base),
             lambda o: S.MultiStepLR(o, [10, 50], 0.1)),
            (SolverConfig(lr_policy="poly", power=2.0, **base), lambda o: S.PolynomialLR(o, 100, 2.0)),
            (SolverConfig(lr_policy="cosine", min_lr=0.01, **base),
             lambda o: S.CosineAnnealingLR(o, 100, eta_min=0.01)),
            (SolverConfig(**base), lambda o: S.ConstantLR(o, 1.0))]:
        assert [learning_rate(cfg, i) for i in range(100)] == pytest.approx(torch_lrs(make), rel=1e-9, abs=1e-12)


# -- solver files ----------------------------------------------------------------------------
GOOD = """\
# a Caffe-style solver
type: Adam
base_lr: 1e-3          # YAML reads this as a string; it is still a number
momentum: 0.9
momentum2: 0.99
weight_decay: 0
lr_policy: multistep
stepvalue: [100, 300]
gamma: 0.5
warmup_iter: 10
max_iter: 500
clip_gradients: 5
snapshot: 100
snapshot_prefix: snaps/lenet
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def problems_of(path):
    with pytest.raises(SpecError) as e:
        load_solver(path)
    assert str(e.value).splitlines() == e.value.problems
    return e.value.problems


def test_solver_file_is_read_with_its_types(tmp_path):
    cfg = load_solver(write(tmp_path, "good.yaml", GOOD))
    assert cfg == SolverConfig(type="Adam", base_lr=1e-3, momentum2=0.99, weight_decay=0.0, lr_policy="multistep",
                               stepvalue=(100, 300), gamma=0.5, warmup_iter=10, max_iter=500, clip_gradients=5.0,
                               snapshot=100, snapshot_prefix="snaps/lenet")
    assert isinstance(cfg.base_lr, float) and isinstance(cfg.max_iter, int) and isinstance(cfg.clip_gradients, float)
    assert cfg.describe() == "Adam lr 0.001 momentum 0.9 momentum2 0.99 weight_decay 0 clip 5 (multistep, warm-up 10)"


def test_solver_file_reports_every_problem_with_its_line(tmp_path):
    path = write(tmp_path, "bad.yaml", "base_lr: fast\nmomentun: 0.9\nmax_iter: 10.5\ntype: Adma\n"
                                       "stepvalue: [3, x]\ndisplay: true\n")
    assert problems_of(path) == [
        f"{path}:1: 'base_lr': expected a number, got 'fast'",
        f"{path}:2: unknown solver key 'momentun'; did you mean 'momentum'?",
        f"{path}:3: 'max_iter': expected an integer, got 10.5",
        f"{path}:5: 'stepvalue': expected a list of integers, got [3, 'x']",
        f"{path}:6: 'display': expected an integer, got True"]


def test_solver_values_that_do_not_fit_together_name_their_line(tmp_path):
    path = write(tmp_path, "step.yaml", "base_lr: 0.1\nlr_policy: step\ntype: Adma\nmomentum: 1.5\n")
    assert problems_of(path) == [
        f"{path}:3: type: expected one of SGD, Nesterov, Adam, AdaGrad, RMSProp, AdaDelta, got 'Adma'; "
        "did you mean 'Adam'?",
        f"{path}:2: lr_policy step needs stepsize > 0",
        f"{path}:4: momentum must be in [0, 1), got 1.5"]
    path = write(tmp_path, "multi.yaml", "lr_policy: multistep\nstepvalue: [50, 10]\nepochs: 3\nmax_iter: 9\n")
    assert problems_of(path) == [f"{path}:3: give max_iter or epochs, not both"]
    path = write(tmp_path, "multi2.yaml", "lr_policy: multistep\nstepvalue: [50, 10]\n")
    assert problems_of(path) == [f"{path}:1: lr_policy multistep needs stepvalue: a strictly ascending list "
                                 f"of iterations"]
    path = write(tmp_path, "nesterov.yaml", "type: Nesterov\nmomentum: 0\n")
    assert problems_of(path) == [f"{path}:2: type Nesterov needs momentum > 0"]


def test_solver_files_that_are_not_solvers(tmp_path):
    path = write(tmp_path, "broken.yaml", "base_lr: 0.1\nstepvalue: [1,\n")
    [problem] = problems_of(path)
    assert problem.startswith(f"{path}:3: not valid YAML")
    path = write(tmp_path, "list.yaml", "- base_lr: 0.1\n")
    assert problems_of(path) == [f"{path}:1: a solver file is a mapping of solver keys (base_lr: 0.01, ...)"]
    assert problems_of(write(tmp_path, "empty.yaml", "# nothing\n"))[0].startswith(f"{tmp_path}/empty.yaml:1:")
    path = write(tmp_path, "twice.yaml", "base_lr: 0.1\nmax_iter: 5\nbase_lr: 0.2\ngama: 0.1\n")
    assert problems_of(path) == [f"{path}:3: solver key 'base_lr' given twice (first on line 1)",
                                 f"{path}:4: unknown solver key 'gama'; did you mean 'gamma'?"]
    with raises_one_line(SNError, match="nosuch.yaml: no such solver file"):
        load_solver(str(tmp_path / "nosuch.yaml"))


def test_a_net_files_solver_section_names_its_line():
    with raises_one_line(SpecError) as e:
        solver_from_mapping({"base_lr": 0.1, "stepsize": "ten"}, "net.yaml", 40)
    assert e.value.problems == ["net.yaml:40: 'stepsize': expected an integer, got 'ten'"]
    assert solver_from_mapping({"max_iter": 7}, "net.yaml").max_iter == 7


def test_overrides_and_epochs():
    cfg = SolverConfig().with_overrides(lr=0.5, iters=20, stepvalue=[5, 9], display=5)
    assert (cfg.base_lr, cfg.max_iter, cfg.stepvalue, cfg.display) == (0.5, 20, (5, 9), 5)
    with pytest.raises(SpecError) as e:
        cfg.with_overrides(lr="x", max_itr=3)
    assert e.value.problems == ["'base_lr': expected a number, got 'x'",
                                "unknown solver key 'max_itr'; did you mean 'max_iter'?"]
    with raises_one_line(SpecError, match="lr_policy step needs stepsize > 0"):
        cfg.with_overrides(lr_policy="step")
    assert SolverConfig(epochs=2.5).with_epochs(samples=1000, batch=64).max_iter == 40  # ceil(2500 / 64)
    assert cfg.with_epochs(1000, 64) is cfg


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["SGD", "Nesterov", "Adam", "AdaGrad", "RMSProp", "AdaDelta"])
def test_gpu_updates_match_cpu(kind):
    import cupy
    params, steps = problem_data(np.float32, seed=4, shapes=[(64, 3, 3, 3), (300,)])
    cfg = SolverConfig(type=kind, base_lr=0.05, clip_gradients=2.0, lr_policy="cosine", warmup_iter=2)
    for g, c in zip(run_ours(cfg, params, steps, xp=cupy), run_ours(cfg, params, steps)):
        np.testing.assert_allclose(cupy.asnumpy(g), c, rtol=1e-5, atol=1e-6)
