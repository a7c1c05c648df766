"""Policy invariance (DESIGN.md invariant 1) and plan equals run (invariant 2) on a net of the
stock Caffe layers added for issue 32: every policy computes baseline's losses and gradients
bit for bit on the CPU, and three training steps give the same parameters."""

import numpy as np
import pytest
from test_net import feed_for

from superneuron.net import Net, load_net
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig

NET = "tests/nets/caffe_misc.yaml"
POLICIES = ("liveness", "recompute", "offload", "superneurons", "gist")


@pytest.fixture(scope="module")
def baseline():
    net = load_net(NET, policy="baseline")
    feed = feed_for(net)
    feed["label"][0, 0, :3] = -1  # labels left out of the loss (Caffe's negative labels)
    loss = net.forward_backward(feed)
    return net, feed, loss


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_gives_baselines_bits(baseline, policy):
    base, feed, loss = baseline
    names = {n.layer.name for n in base.graph.nodes}
    assert np.isfinite(loss)
    assert {"mvn1", "swish1", "log1", "tile1", "crop", "unpool1", "interp2", "norm1", "spp1"} <= names
    net = load_net(NET, policy=policy)
    assert net.forward_backward(feed) == loss
    for name in base.learnable_names:
        assert np.abs(base.grad(name)).max() > 0, name
        np.testing.assert_array_equal(net.grad(name), base.grad(name), err_msg=f"{policy}: {name}")
    assert net.peak_bytes == net.plans["train"].peak_bytes  # plan equals run
    if policy in ("recompute", "superneurons"):
        assert net.peak_bytes < base.peak_bytes


def test_training_steps_are_the_same_under_superneurons(baseline):
    base, feed, _ = baseline
    nets = {p: Net(base.spec, policy=p, optimizer=make_optimizer(SolverConfig())) for p in ("baseline", "superneurons")}
    steps = {p: [net.train_step(feed, it) for it in range(3)] for p, net in nets.items()}
    assert steps["superneurons"] == steps["baseline"] and len(set(steps["baseline"])) == 3
    for name in nets["baseline"].learnable_names:
        np.testing.assert_array_equal(nets["superneurons"].param(name), nets["baseline"].param(name))


@pytest.mark.parametrize("policy, placement", [("liveness", "planned"), ("superneurons", "dynamic"),
                                               ("gist", "dynamic")])
def test_what_the_kernels_touched_is_what_the_plan_said(monkeypatch, policy, placement):
    # the witness of test_plan_equals_run.py: every kernel's operands, offsets and reads
    from test_plan_equals_run import test_what_the_kernels_touched_is_what_the_plan_said as witnessed
    witnessed(monkeypatch, NET, policy, placement)
