"""The +params policies recompute every other join (recompute.recompute_joins): a residual
block's sum is rebuilt in the backward from the block's input and its last convolution's
output, which the backward keeps anyway, instead of being kept itself.

Checked on a small residual net (stem, then blocks of conv → BN → Scale → ReLU → conv → BN →
Scale → Eltwise with the block's input → ReLU): which sums are recomputed (every other
one, named from the net's layout), that the host then holds exactly those sums' bytes less
(counted from their shapes), that the run makes the plan's device and host peaks, and that
training gives the same losses and parameters bit for bit as the same policy without it
(under a budget, which gives both the same algorithms) and as baseline (without one)."""

import numpy as np
import pytest
from test_memory_passes import feed_of

from superneuron import planning
from superneuron.net import Net
from superneuron.netfile.spec import loads_spec
from superneuron.scheduler import policy
from superneuron.scheduler.allocator import aligned
from superneuron.scheduler.params import offload_params
from superneuron.scheduler.recompute import recompute
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig

BATCH, SIZE, WIDTH = 4, 16, 8
RESIDUAL = """
name: residual
params: {batch: %d, size: %d, width: %d, blocks: 4}
input: {data: ['${batch}', 3, '${size}', '${size}'], label: ['${batch}']}
templates:
  conv_bn:
    - {name: '${name}', type: Convolution, bottom: '${bottom}', top: '${name}', num_output: '${width}',
       kernel_size: 3, pad: 1, bias_term: false}
    - {name: 'bn_${name}', type: BatchNorm, bottom: '${name}', top: '${name}'}
    - {name: 'scale_${name}', type: Scale, bottom: '${name}', top: '${name}', bias_term: true}
    - {repeat: '${int(relu)}', layers: [{name: '${name}_relu', type: ReLU, bottom: '${name}', top: '${name}'}]}
  block:
    - {use: conv_bn, with: {name: '${name}_a', bottom: '${bottom}', relu: true}}
    - {use: conv_bn, with: {name: '${name}_b', bottom: '${prev}', relu: false}}
    - {name: '${name}', type: Eltwise, bottom: ['${bottom}', '${prev}'], top: '${name}', operation: SUM}
    - {name: '${name}_relu', type: ReLU, bottom: '${name}', top: '${name}'}
layers:
  - {use: conv_bn, with: {name: stem, bottom: data, relu: true}}
  - {repeat: '${blocks}', as: i, use: block, with: {name: 'res${i + 1}', bottom: '${prev}'}}
  - {name: pool, type: Pooling, bottom: '${prev}', top: pool, pool: AVE, global_pooling: true}
  - {name: fc, type: InnerProduct, bottom: pool, top: fc, num_output: 5}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
""" % (BATCH, SIZE, WIDTH)
POLICY = "superneurons+params"
# superneurons+params as it was before it recomputed joins
WITHOUT_JOINS = (recompute, offload_params) + policy.LIVENESS + (policy.offload,) + policy.LAST


def without_joins(monkeypatch):
    monkeypatch.setitem(policy.WITH_PARAMS, "superneurons", WITHOUT_JOINS)


def recomputed(schedule, layer_type="Eltwise"):
    """The names of the ``layer_type`` layers ``schedule`` recomputes."""
    nodes = schedule.graph.nodes
    return {nodes[s.node].name for s in schedule.steps if s.kind == "recompute"
            and nodes[s.node].layer.type == layer_type}


def test_every_other_sum_is_recomputed_from_what_the_backward_keeps_anyway():
    spec = loads_spec(RESIDUAL)
    schedule, _ = planning.plan(spec, POLICY, optimizer=make_optimizer(SolverConfig()))
    # the first sum reads the stem's output and its own branch, both kept (or rebuilt from a
    # convolution's output); the second reads the first, recomputed: kept; and so on
    assert recomputed(schedule) == {"res1", "res3"}
    steps, nodes = schedule.steps, schedule.graph.nodes
    for name in ("res1", "res3"):
        at = next(i for i, s in enumerate(steps) if s.kind == "recompute" and nodes[s.node].name == name)
        # recomputed once, after the turn, and its ReLU after it: the sum as the forward left it
        assert [s.kind for s in steps].index("backward") < at
        assert sum(1 for s in steps if s.kind == "recompute" and nodes[s.node].name == name) == 1
        assert any(s.kind == "recompute" and nodes[s.node].name == f"{name}_relu" for s in steps[at:])
    # superneurons without +params keeps every sum (SuperNeurons' rule: joins are checkpoints)
    plain, _ = planning.plan(spec, "superneurons", optimizer=make_optimizer(SolverConfig()))
    assert recomputed(plain) == set()


@pytest.mark.parametrize("budget", [None, 0], ids=["unbounded", "floor"])
def test_the_host_holds_the_recomputed_sums_bytes_less(monkeypatch, budget):
    spec, opt = loads_spec(RESIDUAL), make_optimizer(SolverConfig(momentum=0.9))
    after = planning.plan(spec, POLICY, budget=budget, optimizer=opt)[1]
    without_joins(monkeypatch)
    schedule, before = planning.plan(spec, POLICY, budget=budget, optimizer=opt)
    # Without the change (no budget, or a budget of nothing, offloads all it can) the sums
    # wait on the host across the turn, where the host peaks (its gradients are a few KiB)
    offloaded = {s.tensor for s in schedule.steps if s.kind == "offload"}
    assert {"res1", "res2", "res3", "res4"} <= offloaded
    # with it res1 and res3 are not kept at all: two sums of BATCH x WIDTH x SIZE x SIZE float32
    one_sum = aligned(BATCH * WIDTH * SIZE * SIZE * 4)
    assert before.host_bytes - after.host_bytes == 2 * one_sum


def _train(spec, budget, iters=3, **kw):
    net = Net(spec, policy=kw.pop("policy", POLICY), optimizer=make_optimizer(SolverConfig(momentum=0.9)),
              memory=budget, **kw)
    feed = feed_of(net.graph)
    losses = [net.train_step(feed, it) for it in range(iters)]
    return net, losses


@pytest.mark.parametrize("placement", ["dynamic", "planned"])
def test_plan_equals_run_and_training_is_bit_identical_without_it(monkeypatch, placement):
    spec = loads_spec(RESIDUAL)
    opt = make_optimizer(SolverConfig(momentum=0.9))
    # a budget that makes the offload pass move most of the stash: a tenth over its floor
    budget = planning.plan(spec, POLICY, budget=0, optimizer=opt, placement=placement)[1].arena_bytes * 11 // 10
    net, losses = _train(spec, budget, placement=placement)
    plan, rt = net.plans["train"], net.runtime
    assert recomputed(net.schedules["train"]) and plan.host_bytes > 0
    assert any(s.kind == "offload" and net.graph.tensors.get(s.tensor) is not None
               and net.graph.tensors[s.tensor].kind == "data" for s in net.schedules["train"].steps)
    assert rt.peak_bytes == max(p.peak_bytes for p in net.plans.values())
    assert rt.host_peak == max(p.host_bytes for p in net.plans.values())
    assert rt.stalls == 0
    with monkeypatch.context() as m:
        without_joins(m)
        old, old_losses = _train(spec, budget, placement=placement)
    assert not recomputed(old.schedules["train"])
    assert len(set(losses)) == len(losses)  # the parameters moved between iterations
    if placement == "dynamic":
        # the budget gives both the same algorithms (im2col under it rounds otherwise): the same bits
        assert algorithms(net) == algorithms(old)
        assert losses == old_losses
        for name in net.param_names:
            np.testing.assert_array_equal(net.param(name), old.param(name), err_msg=name)
        return
    # planned: the workspaces get the rooms the tensors leave, which differ between the two
    # plans, and with them some algorithms (tests/test_passes.py): the same to rounding
    np.testing.assert_allclose(losses, old_losses, rtol=1e-5)
    for name in net.param_names:
        np.testing.assert_allclose(net.param(name), old.param(name), rtol=1e-4, atol=1e-6, err_msg=name)


def test_training_without_a_budget_is_baselines_bit_for_bit():
    spec = loads_spec(RESIDUAL)
    net, losses = _train(spec, None)
    base, base_losses = _train(spec, None, policy="baseline")
    assert recomputed(net.schedules["train"]) and algorithms(net) == algorithms(base)
    assert losses == base_losses
    for name in base.param_names:
        np.testing.assert_array_equal(net.param(name), base.param(name), err_msg=name)


def algorithms(net):
    """Each forward and backward step's algorithm in ``net``'s training schedule."""
    nodes = net.graph.nodes
    return {(s.kind, nodes[s.node].name): s.algorithm for s in net.schedules["train"].steps
            if s.kind in ("forward", "backward")}
