"""Caffe's AdaGrad, RMSProp and AdaDelta: against a float64 NumPy transcription of Caffe's
documented update formulas (sgd_solvers: clip, regularise, then the solver's update, in
Caffe's order of operations), against torch.optim's Adagrad, RMSprop and Adadelta (the same
formulas: torch's Adadelta rounds √a/√b where Caffe rounds √(a/b)), their state as resident
tensors (planned, snapshotted, resumed bit for bit), and the ``type:`` of solver files."""

import numpy as np
import pytest
import torch
from test_optim import problem_data, run_ours
from test_param_offload import feed_of
from test_train import losses, tiny_trainer

from superneuron.errors import SpecError
from superneuron.layers.base import workspace_bytes
from superneuron.net import load_net
from superneuron.netfile.caffe.solver import solver_mapping
from superneuron.train.optim import make_optimizer
from superneuron.train.snapshot import expected_arrays
from superneuron.train.solver_config import SolverConfig, load_solver, load_solver_prototxt

KINDS = ("AdaGrad", "RMSProp", "AdaDelta")


def caffe_reference(cfg, params, steps, mults):
    """Caffe's SGDSolver::ApplyUpdate then the solver's ComputeUpdateValue, in float64."""
    w = [p.astype(np.float64) for p in params]
    hist = [np.zeros_like(p) for p in w]
    upd_hist = [np.zeros_like(p) for p in w]  # AdaDelta's second half of history_
    for it, grads in enumerate(steps):
        rate = cfg.base_lr * cfg.gamma ** (it // cfg.stepsize) if cfg.lr_policy == "step" else cfg.base_lr
        g = [x.astype(np.float64) for x in grads]
        for i, (lr_mult, decay_mult) in enumerate(mults):
            diff = g[i] + cfg.weight_decay * decay_mult * w[i]  # Regularize (L2)
            local_rate = rate * lr_mult
            if cfg.type == "AdaGrad":
                hist[i] = hist[i] + diff ** 2
                update = diff / (np.sqrt(hist[i]) + cfg.delta)
            elif cfg.type == "RMSProp":
                hist[i] = (1 - cfg.rms_decay) * diff ** 2 + cfg.rms_decay * hist[i]
                update = diff / (np.sqrt(hist[i]) + cfg.delta)
            else:
                rho = cfg.momentum
                hist[i] = (1 - rho) * diff ** 2 + rho * hist[i]
                update = diff * np.sqrt((upd_hist[i] + cfg.delta) / (hist[i] + cfg.delta))
                upd_hist[i] = (1 - rho) * update ** 2 + rho * upd_hist[i]
            w[i] = w[i] - local_rate * update
    return w


def run_torch(cfg, params, steps, mults):
    ts = [torch.tensor(p, requires_grad=True) for p in params]
    groups = [{"params": [t], "lr": cfg.base_lr * lm, "weight_decay": cfg.weight_decay * dm}
              for t, (lm, dm) in zip(ts, mults)]
    if cfg.type == "AdaGrad":
        opt = torch.optim.Adagrad(groups, eps=cfg.delta)
    elif cfg.type == "RMSProp":
        opt = torch.optim.RMSprop(groups, alpha=cfg.rms_decay, eps=cfg.delta)
    else:
        opt = torch.optim.Adadelta(groups, rho=cfg.momentum, eps=cfg.delta)
    for grads in steps:
        for t, g in zip(ts, grads):
            t.grad = torch.tensor(g)
        opt.step()
    return [t.detach().numpy() for t in ts]


def config(kind, **more):
    values = dict(type=kind, base_lr=0.05, momentum=0.9, rms_decay=0.9, delta=1e-6, weight_decay=0.01)
    if kind == "AdaDelta":
        values.update(base_lr=1.0, momentum=0.95)  # Caffe's AdaDelta example: lr 1, decay 0.95
    return SolverConfig(**dict(values, **more))


MULTS = [(1.0, 1.0), (2.0, 0.0), (0.5, 3.0)]


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
@pytest.mark.parametrize("kind", KINDS)
def test_updates_follow_caffes_formulas(kind, dtype, tol):
    params, steps = problem_data(dtype, steps=6, seed=7)
    cfg = config(kind, lr_policy="step", stepsize=2, gamma=0.5)
    ours = run_ours(cfg, params, steps, MULTS)
    for a, ref, before in zip(ours, caffe_reference(cfg, params, steps, MULTS), params):
        assert a.dtype == dtype and not np.allclose(a, before)
        np.testing.assert_allclose(a, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", KINDS)
def test_updates_match_torch_optim(kind):
    params, steps = problem_data(np.float64, steps=6, seed=8)
    cfg = config(kind)
    for a, theirs in zip(run_ours(cfg, params, steps, MULTS), run_torch(cfg, params, steps, MULTS)):
        np.testing.assert_allclose(a, theirs, rtol=1e-12, atol=1e-13)


def test_state_slots_names_and_workspace():
    shapes = [(512, 3, 3), (7,), (64, 100)]
    one = workspace_bytes(((64, 100), np.float32))
    two = workspace_bytes(((64, 100), np.float32), ((64, 100), np.float32))
    for kind, names, nbytes in [("AdaGrad", ("sum",), one), ("RMSProp", ("square_avg",), one),
                                ("AdaDelta", ("square_avg", "acc_delta"), two)]:
        opt = make_optimizer(config(kind, weight_decay=0.0))  # the squares need scratch even so
        assert (opt.slots, opt.state_names(), opt.workspace_bytes(shapes, np.float32)) == (len(names), names, nbytes)


@pytest.mark.parametrize("kind", KINDS)
def test_state_is_planned_and_the_run_matches_the_plan(kind):
    net = load_net("tests/nets/tiny.yaml", optimizer=make_optimizer(config(kind)))
    opt = net.optimizer
    learnable = list(net.learnable_names)
    state = [f"{t}.{name}" for t in learnable for name in opt.state_names()]
    resident = net.runtime.resident
    assert all(s in resident for s in state)
    plan_sgd = load_net("tests/nets/tiny.yaml", optimizer=make_optimizer(
        SolverConfig(momentum=0.0))).plans["train"].resident_bytes
    extra = sum(resident[s].nbytes for s in state)
    assert net.plans["train"].resident_bytes >= plan_sgd + extra
    before = {n: net.param(n).copy() for n in learnable}
    net.train_step(feed_of(net.graph), 0)
    assert net.runtime.peak_bytes == max(p.peak_bytes for p in net.plans.values())
    assert any(not np.array_equal(net.param(n), before[n]) for n in learnable)
    assert all(np.asarray(resident[s]).any() for s in state if s.endswith((".sum", ".square_avg")))


@pytest.mark.parametrize("kind", KINDS)
def test_snapshots_hold_the_state_and_resume_bit_for_bit(tmp_path, kind):
    whole = tiny_trainer(tmp_path, 6, log="whole.jsonl", solver_type=kind)
    whole.run()
    first = tiny_trainer(tmp_path / "a", 3, snapshot_every=3, log="first.jsonl", solver_type=kind)
    first.run()
    snapshot = tmp_path / "a" / "snap" / "tiny_iter_3.npz"
    names = set(np.load(snapshot).files)
    state = {k for k in names if k.startswith("opt:")}
    suffixes = make_optimizer(SolverConfig(type=kind)).state_names()
    assert state and {k.rsplit(".", 1)[1] for k in state} == set(suffixes)
    assert set(expected_arrays(first.net)) == names - {"__meta__"}
    second = tiny_trainer(tmp_path / "b", 6, log="second.jsonl", solver_type=kind)
    second.restore(str(snapshot))
    second.run()
    assert losses(tmp_path / "a" / "first.jsonl") + losses(tmp_path / "b" / "second.jsonl") == \
        losses(tmp_path / "whole.jsonl")
    for name in whole.net.param_names:
        np.testing.assert_array_equal(second.net.param(name), whole.net.param(name))


@pytest.mark.parametrize("spelled, solver_type, kind", [
    ('type: "AdaGrad"', "solver_type: ADAGRAD", "AdaGrad"),
    ('type: "RMSProp"\nrms_decay: 0.98', "solver_type: RMSPROP\nrms_decay: 0.98", "RMSProp"),
    ('type: "AdaDelta"\nmomentum: 0.95\ndelta: 1e-6', "solver_type: ADADELTA\nmomentum: 0.95\ndelta: 1e-6",
     "AdaDelta")])
def test_solver_prototxt_and_yaml_name_the_type(tmp_path, spelled, solver_type, kind):
    head = 'base_lr: 1.0\nlr_policy: "fixed"\nmax_iter: 10\n'
    configs = []
    for i, text in enumerate((spelled, solver_type)):
        path = tmp_path / f"s{i}.prototxt"
        path.write_text(head + text + "\n")
        configs.append(load_solver_prototxt(path)[0])
    yaml = tmp_path / "s.yaml"
    yaml.write_text(f"type: {kind}\nbase_lr: 1.0\nmax_iter: 10\nmomentum: {configs[0].momentum}\n"
                    f"weight_decay: 0\nrms_decay: {configs[0].rms_decay}\ndelta: {configs[0].delta}\n")
    assert configs[0] == configs[1] == load_solver(yaml)
    assert configs[0].type == kind and kind in configs[0].describe()
    if kind == "RMSProp":
        assert configs[0].rms_decay == pytest.approx(0.98) and "rms_decay 0.98" in configs[0].describe()


@pytest.mark.parametrize("kind", ["AdaGrad", "RMSProp"])
def test_caffe_refuses_momentum_with_adagrad_and_rmsprop(tmp_path, kind):
    path = tmp_path / "solver.prototxt"
    path.write_text(f'base_lr: 0.1\nlr_policy: "fixed"\ntype: "{kind}"\nmomentum: 0.9\n')
    with pytest.raises(SpecError, match=rf"solver.prototxt:4:1: momentum cannot be used with {kind}"):
        solver_mapping(path)


def test_rms_decay_is_checked():
    with pytest.raises(SpecError, match=r"rms_decay must be in \[0, 1\), got 1.0"):
        SolverConfig(type="RMSProp", rms_decay=1.0)


@pytest.mark.parametrize("kind", ["AdaGrad", "AdaDelta"])
def test_their_snapshots_convert_to_a_caffemodel(tmp_path, capsys, kind):
    from test_caffe_weights import NET

    from superneuron.cli import convert, train
    solver = tmp_path / "solver.yaml"
    solver.write_text(f"type: {kind}\nbase_lr: 0.01\nmomentum: 0.9\n")
    snaps = tmp_path / "snaps"
    assert train.main([NET, "--solver", str(solver), "--iters", "2", "--batch", "4", "--test-interval", "0",
                       "--snapshot", str(snaps), "--snapshot-format", "caffemodel"]) == 0
    (npz,) = snaps.glob("*.npz")
    converted = tmp_path / "converted.caffemodel"
    assert convert.main([str(npz), "--net", NET, "-o", str(converted)]) == 0
    assert converted.read_bytes() == npz.with_suffix(".caffemodel").read_bytes()
