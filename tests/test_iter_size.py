"""iter_size (Caffe's gradient accumulation): K batches of b train as one batch of K·b, under
every memory policy, at the peak of one batch of b plus the gradients' accumulators; the plan
shows those accumulators and equals the run; BatchNorm and Dropout see K forwards; clipping
comes before the 1/K scaling, as in Caffe's SGDSolver::ApplyUpdate; snapshots taken between
iterations resume exactly; a bad iter_size is one line naming its file and line."""

import functools
import json
import os
import re

import numpy as np
import pytest
from one_line import cli_error, one_line

from superneuron import load_net
from superneuron.cli import convert
from superneuron.cli import plan as plan_cli
from superneuron.cli import train as train_cli
from superneuron.data.batches import Loader
from superneuron.data.sources import open_source, source_config
from superneuron.net import Net
from superneuron.netfile.spec import loads_spec
from superneuron.planning import plan
from superneuron.scheduler.allocator import aligned
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig, load_solver
from superneuron.train.trainer import Trainer

LENET = "nets/lenet.yaml"
TINY = "tests/nets/tiny.yaml"  # BatchNorm and Dropout

# A fork joined by Eltwise and Concat (so parameter gradients come through a Split's summed
# gradients), without BatchNorm or Dropout, whose K forwards could not match one large one.
FORK = """\
name: fork
params: {batch: 4}
input: {data: ['${batch}', 3, 8, 8], label: ['${batch}']}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3, pad: 1}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: branch_a, type: Convolution, bottom: conv1, top: branch_a, num_output: 4, kernel_size: 1}
  - {name: branch_b, type: Convolution, bottom: conv1, top: branch_b, num_output: 4, kernel_size: 3, pad: 1}
  - {name: sum, type: Eltwise, bottom: [branch_a, branch_b], top: sum, operation: SUM}
  - {name: concat, type: Concat, bottom: [sum, conv1], top: concat}
  - {name: pool, type: Pooling, bottom: concat, top: pool, pool: MAX, kernel_size: 2, stride: 2}
  - {name: ip, type: InnerProduct, bottom: pool, top: ip, num_output: 5}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}
"""

POLICIES = ("baseline", "liveness", "recompute", "offload", "superneurons", "liveness+params",
            "superneurons+params")

# float32: the K·b samples' gradient is summed in another order (two sums of b, then their sum,
# against one sum of K·b), which moves each parameter by float32 rounding per iteration. Over
# three iterations of SGD with momentum the largest difference, relative to each parameter's
# largest magnitude, measured 3e-7 on LeNet and the fork (2.5 times float32's epsilon); 2e-6
# leaves room of about seven times, far below what any mistake in the accumulation makes (a
# missing 1/K scaling doubles the step: 1e-2 and more here; a lost micro-batch: 1e-3).
F32_RELATIVE = 2e-6
# float64: the same arithmetic leaves 3e-16 (measured): what remains is rounding alone.
F64_RELATIVE = 1e-12


def _net(case, batch, iter_size=1, policy="baseline", dtype="float32", clip=-1.0):
    solver = SolverConfig(base_lr=0.1, momentum=0.9, weight_decay=5e-4, iter_size=iter_size,
                          clip_gradients=clip)
    if case == "fork":
        return Net(loads_spec(FORK, batch=batch), policy=policy, optimizer=make_optimizer(solver), dtype=dtype)
    return load_net(case, batch=batch, policy=policy, optimizer=make_optimizer(solver), dtype=dtype)


def _samples(net, n, iterations, seed=1):
    """``iterations`` batches of ``n`` samples shaped for ``net``'s inputs (float in its dtype)."""
    rng = np.random.default_rng(seed)
    data, label = net.input_names
    shape, dtype = net.input_shape(data)[1:], net.graph.dtype
    classes = net.classes
    return [(rng.standard_normal((n, *shape)).astype(dtype), rng.integers(0, classes, n).astype(dtype))
            for _ in range(iterations)]


def _train(net, samples, batch):
    """Train on ``samples`` (lists of (x, y) of iter_size·batch samples each) in micro-batches of
    ``batch``; the losses and the learned parameters."""
    data, label = net.input_names
    k, losses = net.iter_size, []
    for it, (x, y) in enumerate(samples):
        feeds = [{data: x[j * batch:(j + 1) * batch], label: y[j * batch:(j + 1) * batch]} for j in range(k)]
        losses.append(net.train_step(feeds[0] if k == 1 else feeds, it))
    return losses, {n: net.param(n) for n in net.learnable_names}


@functools.lru_cache(maxsize=None)
def _one_large_batch(case, batch, dtype="float32", clip=-1.0):
    net = _net(case, batch, dtype=dtype, clip=clip)
    return _train(net, _samples(net, batch, 3), batch)


def _largest_relative_difference(a, b):
    return max(float(np.abs(a[n] - b[n]).max() / np.abs(b[n]).max()) for n in b)


@pytest.mark.parametrize("case, batch", [(LENET, 8), ("fork", 4)])
@pytest.mark.parametrize("policy", POLICIES)
def test_k_batches_of_b_train_as_one_batch_of_k_times_b(case, batch, policy):
    k = 2
    losses, params = _one_large_batch(case, k * batch)
    net = _net(case, batch, iter_size=k, policy=policy)
    acc_losses, acc_params = _train(net, _samples(net, k * batch, 3), batch)
    assert _largest_relative_difference(acc_params, params) < F32_RELATIVE
    # the loss shown is the mean over the K batches, which is the large batch's loss
    np.testing.assert_allclose(acc_losses, losses, rtol=1e-5)
    # plan equals run with K rounds: the arena's real peak is the plan's, to the byte
    assert net.peak_bytes == net.plans["train"].peak_bytes
    assert net.arena_bytes == max(p.arena_bytes for p in net.plans.values())
    if "+params" in policy:  # early host updates only in the last round, never before
        assert net.runtime.updater.early == len(net.learnable_names)


@pytest.mark.parametrize("case, batch", [(LENET, 4), ("fork", 4)])
def test_accumulation_is_exact_up_to_rounding_in_float64(case, batch):
    k = 4
    _, params = _one_large_batch(case, k * batch, dtype="float64")
    net = _net(case, batch, iter_size=k, dtype="float64")
    _, acc_params = _train(net, _samples(net, k * batch, 3), batch)
    assert _largest_relative_difference(acc_params, params) < F64_RELATIVE
    # the control: without the rounds' 1/K the steps would be K times as large
    plain = _net(case, batch, iter_size=1, dtype="float64")
    _, first_batches = _train(plain, [(x[:batch], y[:batch]) for x, y in _samples(plain, k * batch, 3)], batch)
    assert _largest_relative_difference(first_batches, params) > 1e-4


@pytest.mark.parametrize("policy", ["baseline", "liveness+params"])
def test_clipping_comes_before_the_scaling_as_in_caffe(policy):
    """Caffe's ApplyUpdate clips the accumulated sum, then divides it by iter_size: so K=2 with
    clip_gradients c clips as one batch of 2b with c / 2 does, and not as one with c."""
    batch, clip = 4, 0.05
    _, half_clip = _one_large_batch(LENET, 2 * batch, "float64", clip / 2)
    _, same_clip = _one_large_batch(LENET, 2 * batch, "float64", clip)
    net = _net(LENET, batch, iter_size=2, policy=policy, dtype="float64", clip=clip)
    _, params = _train(net, _samples(net, 2 * batch, 3), batch)
    assert net.optimizer.grad_norm > clip  # the sum's norm: the clipping did act
    # the norm differs by Caffe's omitted 1e-6 against torch's: (|S| + 1e-6) vs (|S| + 2e-6)
    assert _largest_relative_difference(params, half_clip) < 1e-6
    assert _largest_relative_difference(params, same_clip) > 1e-3


def test_batchnorm_and_dropout_see_each_batch_of_an_iteration():
    """K=2 on batches (f0, f1) at learning rate 0 is two iterations of K=1 on f0 then f1: the
    BatchNorm running statistics are updated once per batch (Caffe runs the forward K times)
    and each batch draws its own Dropout masks (those K=1 draws at iterations 0 and 1)."""
    (x, y), = _samples(load_net(TINY), 8, 1)
    feeds = [{"data": x[:4], "label": y[:4]}, {"data": x[4:], "label": y[4:]}]
    solver = SolverConfig(base_lr=0.0, iter_size=2)
    accumulated = load_net(TINY, optimizer=make_optimizer(solver))
    loss = accumulated.train_step(feeds, 0)
    single = load_net(TINY, optimizer=make_optimizer(SolverConfig(base_lr=0.0)))
    losses = [single.train_step(f, it) for it, f in enumerate(feeds)]
    assert loss == pytest.approx(np.mean(losses), rel=1e-6)
    for name in single.param_names:
        np.testing.assert_array_equal(accumulated.param(name), single.param(name))
    stats = [n for n in single.param_names if n.startswith("bn1/")]
    fresh = load_net(TINY)
    assert stats and any(not np.array_equal(single.param(n), fresh.param(n)) for n in stats)
    # the same batch twice: the two rounds drop differently, so their losses differ
    again = load_net(TINY, optimizer=make_optimizer(solver))
    again.train_step([feeds[0], feeds[0]], 0)
    twice = load_net(TINY, optimizer=make_optimizer(SolverConfig(base_lr=0.0)))
    first, second = twice.train_step(feeds[0], 0), twice.train_step(feeds[0], 1)
    assert first != second and again.loss == pytest.approx((first + second) / 2, rel=1e-6)


def test_the_peak_is_one_batch_plus_the_accumulators():
    spec32 = load_net(LENET, batch=32).spec
    _, one = plan(spec32, "liveness", optimizer=make_optimizer(SolverConfig()))
    schedule, two = plan(spec32, "liveness", optimizer=make_optimizer(SolverConfig(iter_size=2)))
    _, large = plan(load_net(LENET, batch=64).spec, "liveness", optimizer=make_optimizer(SolverConfig()))
    accums = sum(aligned(schedule.tensors[t].nbytes) for t in schedule.resident
                 if schedule.tensors[t].kind == "accum")
    assert accums == sum(aligned(schedule.tensors[g].nbytes)
                         for n in schedule.graph.nodes for g in n.param_grads.values())
    assert two.peak_bytes == one.peak_bytes + accums
    assert two.peak_bytes < large.peak_bytes


def test_sn_plan_shows_the_accumulators(capsys):
    assert plan_cli.main([LENET, "--batch", "16", "--policy", "liveness", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert plan_cli.main([LENET, "--batch", "16", "--policy", "liveness", "--iter-size", "3", "--json"]) == 0
    three = json.loads(capsys.readouterr().out)
    assert (one["iter_size"], three["iter_size"]) == (1, 3) and one["accumulator_bytes"] == 0
    assert three["accumulator_bytes"] > 0
    assert three["resident_bytes"] == one["resident_bytes"] + three["accumulator_bytes"]
    assert three["peak_bytes"] == one["peak_bytes"] + three["accumulator_bytes"]
    # three batches run the layers three times, the update once
    assert 2.5 * one["est_seconds"] < three["est_seconds"] < 3 * one["est_seconds"]
    assert plan_cli.main([LENET, "--batch", "16", "--policy", "liveness+params", "--iter-size", "3"]) == 0
    text = capsys.readouterr().out
    assert "x iter_size 3" in text and "accumulators on the host" in text


def _solver_prototxt(tmp_path, iter_size):
    path = tmp_path / "solver.prototxt"
    path.write_text(f'net: "{os.path.abspath("tests/caffe/lenet_train_test.prototxt")}"\nbase_lr: 0.01\n'
                    f'lr_policy: "fixed"\niter_size: {iter_size}\nmax_iter: 2\ndisplay: 1\n')
    return path


def test_a_solver_prototxt_with_iter_size_trains(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    assert train_cli.main(["--solver", str(_solver_prototxt(tmp_path, 2)), "--data", "synthetic:1x28x28",
                           "--batch", "4", "--log", str(log)]) == 0
    out = capsys.readouterr().out
    assert "batch 4 x iter_size 2" in out and "2 batches of 4 (iter_size 2)" in out
    records = [json.loads(line) for line in open(log)]
    assert records[0]["kind"] == "start" and records[0]["iter_size"] == 2
    assert [r["iter"] for r in records if r["kind"] == "display"] == [1, 2]


@pytest.mark.parametrize("value, message", [
    ("0", r"solver\.prototxt:4: iter_size must be >= 1, got 0"),
    ("-1", r"solver\.prototxt:4: iter_size must be >= 1, got -1"),
    ("1.5", r"solver\.prototxt:4:12: Couldn't parse integer: 1\.5"),
    ("100000", r"solver\.prototxt:4: iter_size 100 000 is over the limit of 65 536 \(MAX_ITER_SIZE\)"),
    ("99999999999", r"solver\.prototxt:4:12: .*out of range"),
])
def test_a_bad_iter_size_in_a_solver_prototxt_is_one_line(tmp_path, capsys, value, message):
    solver = _solver_prototxt(tmp_path, value)
    line = cli_error(capsys, train_cli.main, [LENET, "--solver", solver, "--iters", "1"])
    assert re.search(message, line), line


@pytest.mark.parametrize("value, message", [
    ("0", r"solver\.yaml:2: iter_size must be >= 1, got 0"),
    ("-1", r"solver\.yaml:2: iter_size must be >= 1, got -1"),
    ("1.5", r"solver\.yaml:2: 'iter_size': expected an integer, got 1\.5"),
    ("1e12", r"solver\.yaml:2: iter_size 1 000 000 000 000 is over the limit of 65 536 \(MAX_ITER_SIZE\)"),
])
def test_a_bad_iter_size_in_a_yaml_solver_is_one_line(tmp_path, capsys, value, message):
    solver = tmp_path / "solver.yaml"
    solver.write_text(f"base_lr: 0.01\niter_size: {value}\nmax_iter: 2\n")
    line = cli_error(capsys, train_cli.main, [LENET, "--solver", solver, "--iters", "1"])
    assert re.search(message, line), line


@pytest.mark.parametrize("value, message", [
    ("0", "iter_size must be >= 1, got 0"),
    ("70000", "iter_size 70 000 is over the limit of 65 536 (MAX_ITER_SIZE)"),
])
def test_a_bad_iter_size_flag_is_one_line(capsys, value, message):
    assert message in cli_error(capsys, train_cli.main, [LENET, "--iter-size", value, "--iters", "1"])


def test_a_fractional_iter_size_flag_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_:
        train_cli.main([LENET, "--iter-size", "1.5"])
    assert exit_.value.code == 2
    assert "argument --iter-size: invalid int value: '1.5'" in one_line(capsys.readouterr().err)


def _trainer(tmp_path, max_iter, log, policy="liveness", path=TINY):
    """tests/nets/tiny.yaml (BatchNorm, Dropout, a fork; or ``path``, of its inputs) with
    iter_size 2 on synthetic data."""
    solver = SolverConfig(base_lr=0.05, momentum=0.9, weight_decay=1e-4, max_iter=max_iter, display=1,
                          lr_policy="step", stepsize=3, gamma=0.5, iter_size=2)
    net = load_net(path, optimizer=make_optimizer(solver), policy=policy)
    cfg = source_config("synthetic", {"batch_size": 4})
    cfg.update(channels=3, size=8, classes=5, samples=30)
    train_set, _ = open_source(cfg)
    return Trainer(net, solver, Loader(train_set, 4, shuffle=True, seed=0),
                   snapshot_dir=str(tmp_path / "snap"), log_path=str(tmp_path / log))


def _losses(path):
    return [json.loads(line)["loss"] for line in open(path) if '"display"' in line]


@pytest.mark.parametrize("policy", ["liveness", "recompute"])
def test_snapshot_and_resume_with_iter_size_are_exact(tmp_path, policy):
    """(recompute, on a net whose bn2 it recomputes: from the mean its forward saved, which no
    snapshot holds, since each forward writes it before a recomputation reads it)"""
    from test_data_parallel import BATCH_NORM
    path = TINY
    if policy == "recompute":
        path = tmp_path / "tiny.yaml"  # the snapshot's name: the net's
        path.write_text(BATCH_NORM.replace("name: bnnet", "name: tiny"))
    whole = _trainer(tmp_path, 6, "whole.jsonl", policy, path)
    assert (policy == "recompute") == any(s.kind == "recompute" and whole.net.graph.nodes[s.node].name == "bn2"
                                          for s in whole.net.schedules["train"].steps)
    whole.run()
    first = _trainer(tmp_path / "a", 3, "first.jsonl", policy, path)
    first.run()
    snapshot = tmp_path / "a" / "snap" / "tiny_iter_3.npz"
    with np.load(snapshot) as arrays:  # the accumulators are empty between iterations: not kept
        assert not any(key.endswith(".accum") or key.endswith("saved_mean") for key in arrays.files)
    second = _trainer(tmp_path / "b", 6, "second.jsonl", policy, path)
    second.restore(str(snapshot))
    assert second.iteration == 3 and second.train_loader.state() == first.train_loader.state()
    second.run()
    assert _losses(tmp_path / "a" / "first.jsonl") + _losses(tmp_path / "b" / "second.jsonl") == \
        _losses(tmp_path / "whole.jsonl")
    for name in whole.net.param_names:
        np.testing.assert_array_equal(second.net.param(name), whole.net.param(name))
    # each iteration took 2 batches of 4: where a loader of batches of 4 is after 12 of them
    reference = Loader(whole.train_loader.dataset, 4, shuffle=True, seed=0)
    for _ in range(12):
        reference.next()
    assert whole.train_loader.state() == reference.state()


def test_epochs_count_iter_size_batches_per_iteration():
    assert SolverConfig(epochs=2, iter_size=4).with_epochs(100, 5).max_iter == 10  # 200 samples / 20
    assert SolverConfig(epochs=2).with_epochs(100, 5).max_iter == 40


def test_sn_convert_keeps_iter_size(tmp_path):
    solver = _solver_prototxt(tmp_path, 4)
    out = tmp_path / "solver.yaml"
    assert convert.main([str(solver), "-o", str(out)]) == 0
    assert load_solver(out).iter_size == 4 and load_solver(out) == load_solver(solver)


def test_a_loss_gone_non_finite_names_the_layer_with_iter_size(capsys):
    line = cli_error(capsys, train_cli.main, [LENET, "--iter-size", "2", "--batch", "8", "--iters", "30",
                                               "--lr", "1e6", "--display", "0"])
    assert re.search(r"loss is nan at iteration \d+, first non-finite output at .*lenet\.yaml:\d+: layer", line)
