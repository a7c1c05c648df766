"""The update in the backward (scheduler/update.py), which the optimal and auto policies apply:
each parameter updated on the device right after its Backward, its gradient a scheduled
tensor that lives from that Backward to that Update instead of all iteration.

Checked: where the Updates go and what stays resident (training and test schedules alike);
training under ``auto`` (liveness with the pass) gives liveness's losses and parameters bit
for bit over several iterations with SGD, Nesterov with weight decay, Adam and AdaDelta (two
scratch arrays), with plan equal to run and a peak lower by the gradients; the estimated time
unchanged; where it does not apply (clipping, iter_size, parameter offload) nothing moves; a
non-finite loss leaves the parameters as they were; Net.grad says why there is no gradient."""

import json

import numpy as np
import pytest
from one_line import raises_one_line
from test_memory_passes import CHAIN, feed_of, graph_of

from superneuron.errors import SNError
from superneuron.net import Net
from superneuron.netfile.spec import load_spec, loads_spec
from superneuron.options import PlanOptions
from superneuron.scheduler.allocator import aligned
from superneuron.scheduler.context import Context
from superneuron.scheduler.cost import CostModel
from superneuron.scheduler.lower import lower
from superneuron.scheduler.policy import apply_policy
from superneuron.scheduler.simulate import simulate
from superneuron.scheduler.update import update_in_backward
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig

CIFAR = "nets/resnet_cifar.yaml"


def grads_of(graph):
    return {g for n in graph.nodes for g in n.param_grads.values()}


def test_each_backward_with_parameters_is_followed_by_their_update():
    g = graph_of(CHAIN)
    opt = make_optimizer(SolverConfig(momentum=0.9, weight_decay=0.01))
    train, test = (update_in_backward(lower(g, train=t, optimizer=opt)) for t in (True, False))
    grads = grads_of(g)
    assert grads and not grads & set(train.resident)
    assert train.resident == test.resident  # one Runtime serves both: the same resident layout
    steps = train.steps
    updates = [i for i, s in enumerate(steps) if s.kind == "update"]
    assert {x for i in updates for x in steps[i].grads} == grads
    for i, s in enumerate(steps):
        if s.kind == "backward" and g.nodes[s.node].param_grads:
            after = [t for t in steps[i + 1:] if t.kind not in ("alloc", "free")][0]
            assert after.kind == "update" and set(after.grads) == set(g.nodes[s.node].param_grads.values())
            # its workspace is the optimiser's scratch for this layer's parameters alone
            shapes = [g.tensors[t].shape for t in g.nodes[s.node].params.values() if g.tensors[t].kind == "param"]
            assert train.tensors[after.workspace].nbytes == opt.workspace_bytes(shapes, g.dtype)
    assert steps[updates[-1]].grads  # no Update of every gradient is left at the end


def trained_as_liveness(solver, device=None):
    """CIFAR ResNet-8 at batch 4 under liveness and auto (no budget: liveness with the update in
    the backward), three iterations each with ``solver`` (on ``device``; None: the CPU), checked
    to give the same losses and parameters bit for bit: ``(liveness's Net, auto's Net, the
    feed)``."""
    spec = load_spec(CIFAR, overrides={"depth": 8}, batch=4)
    on = {} if device is None else {"device": device}
    nets = {p: Net(spec, policy=p, optimizer=make_optimizer(solver), **on) for p in ("liveness", "auto")}
    feed = feed_of(nets["liveness"].graph)
    losses = {p: [net.train_step(feed, it) for it in range(3)] for p, net in nets.items()}
    assert losses["auto"] == losses["liveness"] and len(set(losses["auto"])) == 3
    live, auto = nets["liveness"], nets["auto"]
    for name in live.param_names:
        np.testing.assert_array_equal(auto.param(name), live.param(name), err_msg=name)
    return live, auto, feed


@pytest.mark.parametrize("solver", [
    SolverConfig(type="SGD", momentum=0.9, weight_decay=0.01),
    SolverConfig(type="Nesterov", momentum=0.9, weight_decay=0.01, regularization_type="L1"),
    SolverConfig(type="Adam", base_lr=0.01, weight_decay=0.001),
    SolverConfig(type="AdaDelta", base_lr=1.0, momentum=0.95),
], ids=["sgd", "nesterov-l1", "adam", "adadelta"])
def test_training_under_auto_matches_liveness_bit_for_bit(solver):
    live, auto, _ = trained_as_liveness(solver)
    grads = grads_of(auto.graph)
    assert any(s.kind == "update" and s.grads for s in auto.schedules["train"].steps)
    nbytes = sum(aligned(auto.graph.tensors[x].nbytes) for x in grads)
    plans = auto.plans["train"], live.plans["train"]
    assert plans[0].resident_bytes == plans[1].resident_bytes - nbytes
    assert plans[0].peak_bytes < plans[1].peak_bytes
    assert auto.runtime.peak_bytes == plans[0].peak_bytes  # plan equals run


def test_the_estimated_time_is_the_same():
    g = graph_of(CHAIN)
    opt = make_optimizer(SolverConfig(type="Adam"))
    model = CostModel("gpu")
    whole = apply_policy(lower(g, optimizer=opt), "liveness", costs=model)
    early = apply_policy(update_in_backward(lower(g, optimizer=opt)), "liveness", costs=model)
    assert sum(s.kind == "update" for s in early.steps) > 1
    # the one Update counts every resident byte, BatchNorm's statistics too, which no update touches
    stats = sum(g.tensors[t].nbytes for t in whole.resident if t in g.tensors and g.tensors[t].kind == "state")
    assert stats > 0
    assert model.iteration_seconds(early) == pytest.approx(
        model.iteration_seconds(whole) - 3 * stats / model.device.bandwidth, rel=1e-9)


@pytest.mark.parametrize("solver, policy", [
    (SolverConfig(momentum=0.9, clip_gradients=1.0), "auto"),  # clipping needs every gradient
    (SolverConfig(momentum=0.9, iter_size=2), "auto"),         # the rounds' sum
    (SolverConfig(momentum=0.9), "auto+params"),               # the host updates them
], ids=["clipped", "iter_size", "params"])
def test_where_it_does_not_apply_the_gradients_stay(solver, policy):
    g = graph_of(CHAIN)
    opt = make_optimizer(solver)
    train, test = (apply_policy(lower(g, train=t, optimizer=opt), policy, costs=CostModel("cpu"))
                   for t in (True, False))
    assert not any(s.kind == "update" and s.grads for s in train.steps)
    stays = set(train.resident) | set(train.host_resident)
    assert grads_of(g) <= stays or policy.endswith("+params")
    assert test.resident == train.resident  # one Runtime: the device's resident layout is shared
    net = Net(loads_spec(CHAIN), policy=policy, optimizer=opt)  # which asserts that too
    feed = feed_of(net.graph)
    assert np.isfinite(net.train_step([feed] * solver.iter_size if solver.iter_size > 1 else feed, 0))


def test_no_budget_no_change_but_the_gradients():
    # auto without a budget is liveness: the same steps, an Update after each Backward besides
    g = graph_of(CHAIN)
    opt = make_optimizer(SolverConfig(momentum=0.9))
    auto = apply_policy(lower(g, optimizer=opt), "auto", costs=CostModel("cpu"))
    live = apply_policy(lower(g, optimizer=opt), "liveness", costs=CostModel("cpu"))
    layers = [s for s in live.steps if s.kind in ("forward", "backward")]
    assert [s for s in auto.steps if s.kind in ("forward", "backward")] == layers
    assert simulate(auto).peak_bytes < simulate(live).peak_bytes


def test_a_non_finite_loss_leaves_the_parameters_as_they_were():
    spec = loads_spec(CHAIN)
    net = Net(spec, policy="auto", optimizer=make_optimizer(SolverConfig(momentum=0.9)))
    assert any(s.kind == "update" and s.grads for s in net.schedules["train"].steps)
    feed = feed_of(net.graph)
    before = {n: net.param(n) for n in net.learnable_names}  # (BatchNorm's statistics move in the forward)
    bad = dict(feed)
    data = next(iter(net.graph.inputs)).tops[0]
    bad[data] = np.full_like(feed[data], np.nan)
    assert not np.isfinite(net.train_step(bad, 0))
    for name, value in before.items():
        np.testing.assert_array_equal(net.param(name), value, err_msg=name)
    net.train_step(feed, 1)
    assert any(not np.array_equal(net.param(n), before[n]) for n in net.learnable_names)


def test_net_grad_says_the_gradient_is_not_kept():
    net = Net(loads_spec(CHAIN), policy="auto", optimizer=make_optimizer(SolverConfig(momentum=0.9)))
    name = net.learnable_names[0]
    with raises_one_line(SNError, "updated right after its backward"):
        net.grad(name)
    plain = Net(loads_spec(CHAIN), policy="auto")  # no optimiser: nothing updates, the gradients stay
    plain.forward_backward(feed_of(plain.graph))
    assert np.abs(plain.grad(name)).sum() > 0


def test_context_with_ranks_keeps_the_gradients():
    g = graph_of(CHAIN)
    schedule = lower(g, optimizer=make_optimizer(SolverConfig()))
    assert update_in_backward(schedule, Context(PlanOptions(ranks=2))) is schedule


def test_the_optimal_program_counts_each_updates_scratch():
    """Each Update's workspace (the optimiser's scratch for its layer's parameters) is in the
    program's memory row of that step: VGG-16's fc6 took 392 MiB there, uncounted."""
    from superneuron.scheduler.inplace import inplace
    from superneuron.scheduler.liveness import liveness
    from superneuron.scheduler.optimal_model import build
    g = graph_of(CHAIN)
    schedule = update_in_backward(lower(g, optimizer=make_optimizer(SolverConfig(momentum=0.9, weight_decay=0.01))))
    m = build(schedule, CostModel("gpu"), joins=False)
    steps = [s for s in liveness(inplace(schedule, grads_only=True)).steps if s.kind not in ("alloc", "free")]
    updates = [i for i, s in enumerate(steps) if s.kind == "update"]
    assert updates and all(steps[i].workspace for i in updates)
    for i in updates:
        assert m.fixed_workspace[i] == aligned(schedule.tensors[steps[i].workspace].nbytes) > 0


def test_sn_plan_says_so_and_counts_no_gradient_resident(capsys):
    from superneuron.cli.plan import main
    status = main(["tests/nets/tiny.yaml", "--policy", "auto", "--json"])
    auto = json.loads(capsys.readouterr().out)
    main(["tests/nets/tiny.yaml", "--policy", "liveness", "--json"])
    live = json.loads(capsys.readouterr().out)
    assert status == 0 and auto["resident_bytes"] < live["resident_bytes"]
    main(["tests/nets/tiny.yaml", "--policy", "auto"])
    assert "each parameter updated right after its backward (no gradient resident)" in capsys.readouterr().out
    main(["tests/nets/tiny.yaml", "--policy", "auto", "--iter-size", "2"])  # the rounds are summed first
    out = capsys.readouterr().out
    assert "right after its backward" not in out
