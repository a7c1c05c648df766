"""Caffe solver.prototxt files: Caffe's keys and defaults, its learning-rate policies (inv, exp,
sigmoid, by Caffe's documented formulas), L1 regularisation, average_loss display smoothing,
net: resolved beside the solver, unsupported keys refused at their line."""

import json
import math

import numpy as np
import pytest

from superneuron.cli import convert, train
from superneuron.errors import SpecError
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig, learning_rate, load_solver, load_solver_prototxt

SOLVER = "tests/caffe/lenet_solver.prototxt"


def test_bvlc_lenet_solver_reads_as_written():
    solver, net = load_solver_prototxt(SOLVER)
    assert net == "tests/caffe/lenet_train_test.prototxt"  # examples/mnist/... found beside the solver
    assert (solver.base_lr, solver.momentum, solver.weight_decay) == (0.01, 0.9, 0.0005)
    assert (solver.lr_policy, solver.gamma, solver.power) == ("inv", 0.0001, 0.75)
    assert (solver.max_iter, solver.test_iter, solver.test_interval, solver.display) == (10000, 100, 500, 100)
    assert (solver.snapshot, solver.snapshot_prefix) == (5000, "examples/mnist/lenet")


def test_caffe_defaults_where_they_differ_from_ours(tmp_path):
    path = tmp_path / "solver.prototxt"
    path.write_text('base_lr: 0.1\nlr_policy: "fixed"\nmax_iter: 10\n')
    solver, net = load_solver_prototxt(path)
    assert net is None and solver.momentum == 0.0 and solver.weight_decay == 0.0


@pytest.mark.parametrize("policy,extra,expected", [
    ("inv", {"gamma": 1e-4, "power": 0.75}, lambda it: 0.01 * (1 + 1e-4 * it) ** -0.75),
    ("exp", {"gamma": 0.99}, lambda it: 0.01 * 0.99 ** it),
    ("sigmoid", {"gamma": -0.05, "stepsize": 100}, lambda it: 0.01 / (1 + math.exp(0.05 * (it - 100)))),
])
def test_caffe_learning_rate_policies(policy, extra, expected):
    cfg = SolverConfig(base_lr=0.01, lr_policy=policy, **extra)
    for it in (0, 1, 99, 100, 101, 5000):
        assert learning_rate(cfg, it) == pytest.approx(expected(it), rel=1e-12)


def test_l1_regularisation_adds_the_sign_of_the_weights():
    cfg = SolverConfig(base_lr=0.1, momentum=0.0, weight_decay=0.01, regularization_type="L1")
    opt = make_optimizer(cfg)
    w = np.array([1.5, -2.0, 0.25], np.float32)
    g = np.array([0.1, 0.2, -0.3], np.float32)
    expect = w - 0.1 * (g + 0.01 * np.sign(w))
    opt.update(np, 0, [(w, g.copy(), [], 1.0, 1.0)], lambda shape, dtype: np.empty(shape, dtype))
    np.testing.assert_allclose(w, expect, rtol=1e-6)


@pytest.mark.parametrize("text,message", [
    ('type: "AdaGard"\n', r"solver.prototxt:3:1: solver type AdaGard is not supported"),
    ('lr_policy: "fixd"\n', r"lr_policy: expected one of .*did you mean 'fixed'"),
    ("base_lrr: 0.1\n", r"solver.prototxt:3:1: unknown field 'base_lrr'; did you mean 'base_lr'\?"),
])
def test_unsupported_solver_keys_are_refused_at_their_line(tmp_path, text, message):
    path = tmp_path / "solver.prototxt"
    path.write_text('base_lr: 0.1\nmax_iter: 10\n' + text + ('lr_policy: "fixed"\n' if "lr_policy" not in text else ""))
    with pytest.raises(SpecError, match=message):
        load_solver_prototxt(path)


def test_solver_converts_to_our_solver_file(tmp_path, capsys):
    out = tmp_path / "lenet_solver.yaml"
    assert convert.main([SOLVER, "-o", str(out)]) == 0
    assert load_solver(out) == load_solver_prototxt(SOLVER)[0] == load_solver(SOLVER)


def _display_losses(tmp_path, name, average):
    solver = tmp_path / f"{name}_solver.prototxt"
    solver.write_text(f'net: "{__import__("os").path.abspath("tests/caffe/lenet_train_test.prototxt")}"\n'
                      f'base_lr: 0.01\nlr_policy: "inv"\ngamma: 0.0001\npower: 0.75\nmomentum: 0.9\n'
                      f'max_iter: 5\ndisplay: 1\naverage_loss: {average}\n')
    log = tmp_path / f"{name}.jsonl"
    assert train.main(["--solver", str(solver), "--data", "synthetic:1x28x28", "--batch", "2",
                       "--test-interval", "0", "--log", str(log)]) == 0
    return [r["loss"] for r in map(json.loads, log.read_text().splitlines()) if "loss" in r and "test_loss" not in r]


def test_sn_train_takes_the_net_from_the_solver_and_smooths_the_displayed_loss(tmp_path, capsys):
    plain = _display_losses(tmp_path, "plain", 1)
    smoothed = _display_losses(tmp_path, "smooth", 3)
    assert len(plain) == len(smoothed) == 5
    for k in range(5):  # Caffe shows the mean of the last average_loss iterations
        assert smoothed[k] == pytest.approx(np.mean(plain[max(0, k - 2):k + 1]), rel=1e-6)
    assert "inv" in capsys.readouterr().out
