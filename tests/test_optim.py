"""Solvers against torch.optim, learning-rate policies against their formulas and torch's
schedulers, solver files' errors, and updates that allocate nothing big."""

import math
import tracemalloc

import numpy as np
import pytest
import torch

from superneuron.errors import SpecError
from superneuron.layers.base import Context, workspace_bytes
from superneuron.optim import SolverConfig, learning_rate, load_solver, make_optimizer


def run_ours(cfg, params, grads_per_step, lr_mults=None, decay_mults=None):
    opt = make_optimizer(cfg)
    ws = np.zeros(opt.workspace_bytes([p.shape for p in params], params[0].dtype), np.uint8)
    params = [p.copy() for p in params]
    state = [[np.zeros_like(p) for _ in range(opt.slots)] for p in params]
    for it, grads in enumerate(grads_per_step):
        entries = [(p, g.copy(), s, (lr_mults or [1] * len(params))[i], (decay_mults or [1] * len(params))[i])
                   for i, (p, g, s) in enumerate(zip(params, grads, state))]
        opt.update(np, it, entries, Context(np, workspace=ws).scratch)
    return params


def run_torch(cfg, params, grads_per_step):
    ts = [torch.tensor(p, requires_grad=True) for p in params]
    if cfg.type == "Adam":
        opt = torch.optim.Adam(ts, lr=cfg.base_lr, betas=(cfg.momentum, cfg.momentum2), eps=cfg.delta,
                               weight_decay=cfg.weight_decay)
    else:
        opt = torch.optim.SGD(ts, lr=cfg.base_lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                              nesterov=cfg.type == "Nesterov")
    for grads in grads_per_step:
        for t, g in zip(ts, grads):
            t.grad = torch.tensor(g)
        opt.step()
    return [t.detach().numpy() for t in ts]


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 2e-6)])
@pytest.mark.parametrize("kind, momentum, decay", [("SGD", 0.0, 0.0), ("SGD", 0.9, 0.0), ("SGD", 0.9, 1e-2),
                                                   ("Nesterov", 0.9, 1e-2), ("Adam", 0.9, 0.0),
                                                   ("Adam", 0.8, 1e-2)])
def test_updates_match_torch_optim(kind, momentum, decay, dtype, tol):
    rng = np.random.default_rng(0)
    params = [rng.standard_normal(s).astype(dtype) for s in [(3, 4), (5,), (2, 2, 3)]]
    steps = [[rng.standard_normal(p.shape).astype(dtype) for p in params] for _ in range(5)]
    cfg = SolverConfig(type=kind, base_lr=0.05, momentum=momentum, weight_decay=decay)
    for ours, theirs in zip(run_ours(cfg, params, steps), run_torch(cfg, params, steps)):
        np.testing.assert_allclose(ours, theirs, rtol=tol, atol=tol)


def test_lr_and_decay_multipliers_scale_each_parameter():
    rng = np.random.default_rng(1)
    w = [rng.standard_normal(4), rng.standard_normal(4)]
    g = [[rng.standard_normal(4), rng.standard_normal(4)]]
    cfg = SolverConfig(type="SGD", base_lr=0.1, momentum=0.0, weight_decay=0.01)
    out = run_ours(cfg, w, g, lr_mults=[2.0, 0.0], decay_mults=[0.0, 1.0])
    np.testing.assert_allclose(out[0], w[0] - 0.2 * g[0][0])  # doubled lr, no decay
    np.testing.assert_array_equal(out[1], w[1])                # lr_mult 0: frozen


def test_policies_follow_their_formulas_and_torch_schedulers():
    base = dict(base_lr=0.1, max_iter=100)
    step = SolverConfig(lr_policy="step", stepsize=30, gamma=0.5, **base)
    assert [learning_rate(step, i) for i in (0, 29, 30, 95)] == [0.1, 0.1, 0.05, 0.1 * 0.5 ** 3]
    multi = SolverConfig(lr_policy="multistep", stepvalue=(10, 50), gamma=0.1, **base)
    assert learning_rate(multi, 9) == 0.1 and learning_rate(multi, 10) == pytest.approx(0.01)
    assert learning_rate(multi, 50) == pytest.approx(0.001)
    poly = SolverConfig(lr_policy="poly", power=2.0, **base)
    assert learning_rate(poly, 25) == pytest.approx(0.1 * 0.75 ** 2)
    cos = SolverConfig(lr_policy="cosine", min_lr=0.01, **base)
    assert learning_rate(cos, 50) == pytest.approx(0.01 + 0.09 * 0.5)
    warm = SolverConfig(warmup_iter=4, **base)
    assert [learning_rate(warm, i) for i in range(5)] == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1])

    def torch_lrs(make, n=100):
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        sched, out = make(opt), []
        for _ in range(n):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    S = torch.optim.lr_scheduler
    for cfg, make in [(step, lambda o: S.StepLR(o, 30, 0.5)), (multi, lambda o: S.MultiStepLR(o, [10, 50], 0.1)),
                      (poly, lambda o: S.PolynomialLR(o, 100, 2.0)),
                      (cos, lambda o: S.CosineAnnealingLR(o, 100, eta_min=0.01))]:
        assert [learning_rate(cfg, i) for i in range(100)] == pytest.approx(torch_lrs(make), rel=1e-9, abs=1e-12)


def test_solver_files_report_every_problem_with_its_line(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("type: Adam\nbase_lr: 0.001\nlr_policy: step\nstepsize: 100\nmax_iter: 500\n")
    cfg = load_solver(str(good))
    assert (cfg.type, cfg.base_lr, cfg.stepsize, cfg.max_iter) == ("Adam", 0.001, 100, 500)
    bad = tmp_path / "bad.yaml"
    bad.write_text("base_lr: fast\nmomentun: 0.9\nmax_iter: 10\n")
    with pytest.raises(SpecError) as e:
        load_solver(str(bad))
    lines = str(e.value).splitlines()
    assert lines[0].startswith(f"{bad}:1:") and "'base_lr': expected a number" in lines[0]
    assert lines[1].startswith(f"{bad}:2:") and "did you mean 'momentum'?" in lines[1]
    inconsistent = tmp_path / "step.yaml"
    inconsistent.write_text("lr_policy: step\n")
    with pytest.raises(SpecError, match="step.yaml: lr_policy step needs stepsize"):
        load_solver(str(inconsistent))
    broken = tmp_path / "broken.yaml"
    broken.write_text("base_lr: [1,\n")
    with pytest.raises(SpecError, match="broken.yaml:.*not valid YAML"):
        load_solver(str(broken))


@pytest.mark.parametrize("kind", ["SGD", "Nesterov", "Adam"])
def test_updates_allocate_nothing_big(kind):
    params = [np.ones((512, 1024), np.float32), np.ones(1000, np.float32)]  # 2 MiB
    cfg = SolverConfig(type=kind, weight_decay=1e-3)
    opt = make_optimizer(cfg)
    ws = np.zeros(opt.workspace_bytes([p.shape for p in params], np.float32), np.uint8)
    assert ws.nbytes == workspace_bytes(((512, 1024), np.float32))
    entries = [(p, np.ones_like(p), [np.zeros_like(p) for _ in range(opt.slots)], 1.0, 1.0) for p in params]
    tracemalloc.start()
    try:
        opt.update(np, 0, entries, Context(np, workspace=ws).scratch)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 and math.isfinite(float(params[0][0, 0]))
