"""No host synchronisation inside a training iteration: every place where a device value would
become a host value calls Backend.host_sync (counted on the CPU too, where it costs nothing),
and a training iteration under the main policies reaches none before its end, apart from
reading back the losses' finiteness before the first Update (which ``finite_losses = False``
turns off, and which a GPU's one-kernel SGD update reads as a device flag instead). Labels
are checked on the host when fed, the gradient norm for clipping stays on the device, and
NCCL's sums are waited for by the device (the deadline polled once, at the end)."""

import collections

import numpy as np
import pytest
import torch
from test_memory_passes import CHAIN, feed_of, graph_of, params_of
from test_net import feed_for, small_net

from superneuron.backend import Backend
from superneuron.errors import SNError
from superneuron.layers.base import Context
from superneuron.runtime.executor import Runtime
from superneuron.scheduler.lower import lower
from superneuron.scheduler.policy import apply_policy
from superneuron.scheduler.simulate import simulate
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig

FINITE = "the losses' finiteness, before the update"
END = "the outputs, at the end of the iteration"


# test_memory_passes' chain of blocks with an Accuracy too (so the labels fan out through a Split)
NET = CHAIN + "  - {name: accuracy, type: Accuracy, bottom: [fc, label], top: accuracy}\n"


def _runtime(policy, **solver):
    graph, optimizer = graph_of(NET), make_optimizer(SolverConfig(**solver))
    schedule = apply_policy(lower(graph, optimizer=optimizer), policy)
    assert any(s.kind == "update" for s in schedule.steps)
    runtime = Runtime([schedule], Backend(), capacity=simulate(schedule).arena_bytes)
    for name, value in params_of(graph).items():
        runtime.resident[name][...] = value
    return runtime, schedule, optimizer


@pytest.mark.parametrize("policy", ["baseline", "liveness", "recompute", "offload", "superneurons"])
def test_an_iteration_reads_nothing_back_before_its_end(policy):
    runtime, schedule, optimizer = _runtime(policy, clip_gradients=0.5, momentum=0.9)
    feed, backend = feed_of(schedule.graph), runtime.backend
    assert any(n.layer.type == "Split" for n in schedule.graph.nodes)
    for it in range(2):
        before = backend.syncs.copy()
        runtime.run(schedule, feed, iteration=it, optimizer=optimizer)
        assert runtime.syncs_inside == collections.Counter({FINITE: 1}), runtime.syncs_inside
        assert backend.syncs - before == collections.Counter({FINITE: 1, END: 1})
    runtime.finite_losses = False  # no guard: nothing at all before the end
    runtime.run(schedule, feed, iteration=2, optimizer=optimizer)
    assert runtime.syncs_inside == collections.Counter()


def test_turning_the_guard_off_changes_no_bit_of_a_finite_iteration():
    (a, schedule, opt_a), (b, _, opt_b) = _runtime("liveness", momentum=0.9), _runtime("liveness", momentum=0.9)
    b.finite_losses = False
    feed = feed_of(schedule.graph)
    for it in range(2):
        assert a.run(schedule, feed, it, opt_a) == b.run(schedule, feed, it, opt_b)
    for name in a.resident:
        np.testing.assert_array_equal(a.to_host(name), b.to_host(name), err_msg=name)


class _GuardsOnDevice(type(make_optimizer())):
    """The optimiser as a GPU's one-kernel SGD is: it takes the losses' finiteness as a flag."""

    def guards_on_device(self, xp):
        return True


def test_an_update_that_guards_itself_takes_a_flag_and_no_sync():
    """Where the optimiser skips itself on the device, the Runtime hands it the losses'
    finiteness as a device value instead of reading it back: no sync, the same bits, and a NaN
    loss still leaves the parameters as they were."""
    (a, schedule, _), (b, _, _) = _runtime("liveness"), _runtime("liveness")
    opt_a = make_optimizer(SolverConfig(momentum=0.9))
    opt_b = _GuardsOnDevice(SolverConfig(momentum=0.9))
    feed = feed_of(schedule.graph)
    for it in range(2):
        assert a.run(schedule, feed, it, opt_a) == b.run(schedule, feed, it, opt_b)
        assert b.syncs_inside == collections.Counter()
    for name in a.resident:
        np.testing.assert_array_equal(a.to_host(name), b.to_host(name), err_msg=name)
    before = {name: b.to_host(name) for name in b.resident if name in schedule.graph.tensors
              and schedule.graph.tensors[name].kind == "param"}
    assert before
    bad = dict(feed)
    data = next(k for k in bad if bad[k].ndim > 1)
    bad[data] = np.full_like(bad[data], np.nan)
    assert not np.isfinite(b.run(schedule, bad, 2, opt_b)["loss"])
    assert b.syncs_inside == collections.Counter()
    for name, value in before.items():
        np.testing.assert_array_equal(b.to_host(name), value, err_msg=name)


def _trained(policy):
    net = small_net("nets/lenet.yaml", policy=policy, optimizer=make_optimizer(SolverConfig()))
    return net, feed_for(net)


def test_fed_labels_out_of_range_are_refused_before_the_iteration_without_a_sync():
    net, feed = _trained("liveness")
    feed[net.input_names[1]][0] = 1000.0
    with pytest.raises(SNError, match="label 1000 is out of range"):
        net.train_step(feed, 0)


def test_a_label_not_fed_is_read_back_and_counted():
    """A loss whose labels were not checked when fed (computed by a layer) still checks them,
    on the device: one counted sync."""
    net, feed = _trained("liveness")
    node = net.graph.losses[0]
    layer, backend = node.layer, net.runtime.backend
    n, c, l = layer.ncl
    ctx = Context(np, workspace=np.zeros(1 << 16, np.uint8), backend=backend)
    before = backend.syncs.copy()
    layer._labels(ctx, np.zeros(n * l, np.float32))
    assert sum((backend.syncs - before).values()) == 1
    ctx = Context(np, workspace=np.zeros(1 << 16, np.uint8), backend=backend)
    with pytest.raises(SNError, match=f"label {c} is out of range"):
        layer._labels(ctx, np.full(n * l, c, np.float32))


@pytest.mark.parametrize("clip", [0.05, 100.0], ids=["clipped", "under"])
def test_clipping_on_the_device_is_torchs(clip):
    """The GPU's clipping (the norm a device scalar, never read back) run on NumPy arrays:
    torch.nn.utils.clip_grad_norm_'s result."""
    rng = np.random.default_rng(3)
    grads = [rng.standard_normal(s).astype(np.float32) for s in [(4, 3), (7,), (2, 2, 2)]]
    ref = [torch.tensor(g.astype(np.float64)) for g in grads]
    params = [torch.zeros_like(g, requires_grad=True) for g in ref]
    for p, g in zip(params, ref):
        p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(params, clip)
    opt = make_optimizer(SolverConfig(clip_gradients=clip))
    mine = [g.copy() for g in grads]
    opt._clip_on_device(np, mine)
    for m, p, g in zip(mine, params, grads):
        np.testing.assert_allclose(m, p.grad.numpy(), rtol=2e-7)
        if clip == 100.0:
            np.testing.assert_array_equal(m, g)  # a factor of 1: untouched bits
    assert float(opt.grad_norm) == pytest.approx(np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads)))


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["liveness", "offload", "superneurons"])
def test_on_the_gpu_an_iteration_reads_nothing_back_before_its_end(policy):
    """The same on a GPU with CuPy, the one-kernel SGD update and cuDNN: the host queues the
    whole iteration without waiting once; the update reads the losses' finiteness as a device
    flag, and a NaN loss still leaves the parameters as they were."""
    net = small_net("nets/resnet.yaml", device="gpu", policy=policy,
                    optimizer=make_optimizer(SolverConfig(momentum=0.9, weight_decay=5e-4, clip_gradients=10.0)))
    feed = feed_for(net)
    for it in range(2):
        net.train_step(feed, it)
        assert net.runtime.syncs_inside == collections.Counter(), net.runtime.syncs_inside
    assert net.optimizer._fused, net.optimizer.fused_missing
    assert net.runtime.stalls == 0
    before = {name: net.param(name) for name in net.param_names}
    feed[net.input_names[0]] = np.full_like(feed[net.input_names[0]], np.nan)
    assert not np.isfinite(net.train_step(feed, 2))
    assert net.runtime.syncs_inside == collections.Counter()
    for name, value in before.items():
        np.testing.assert_array_equal(net.param(name), value, err_msg=name)
