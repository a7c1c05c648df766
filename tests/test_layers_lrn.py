"""LRN's ``chunked`` algorithm (layers/lrn.py): the batch a few samples at a time, with the
temporaries of one chunk for workspace. The same bits as ``default`` (every window lies in
one sample), PyTorch's values and gradients, finite differences in float64, its workspace
exact, nothing big allocated; chosen where ``default``'s workspace does not fit, which brings
GoogLeNet at batch 32 under 1/2 of liveness's arena; and the plan is still the run."""

import numpy as np
import pytest
import torch.nn.functional as F
from kernel_trace import KernelTrace
from layer_harness import (
    assert_workspace_exact,
    backward,
    build,
    forward,
    gradcheck,
    only,
    peak_allocation,
    torch_grads,
)
from test_net import feed_for
from torch_ref import lrn_within_channel

from superneuron import planning
from superneuron.graph import Graph
from superneuron.layers.base import workspace_bytes
from superneuron.layers.lrn import LRN
from superneuron.net import Net
from superneuron.netfile.spec import load_spec, loads_spec
from superneuron.scheduler.allocator import aligned
from superneuron.scheduler.cost import CostModel
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig

RNG_SEED = 23

# (bottom shape, configuration): five samples, so chunks of two leave a last one of one
CASES = [((5, 7, 4, 3), dict(local_size=5, alpha=1.5, beta=0.75, k=2.0)),
         ((5, 3, 2), dict(local_size=3, alpha=0.7, beta=0.6)),  # 3-D, window wider than nothing
         ((5, 3, 5, 4), dict(local_size=3, alpha=1.5, beta=0.75, norm_region="WITHIN_CHANNEL"))]
IDS = ["across", "across-3d", "within"]


@pytest.fixture
def two_samples(monkeypatch):
    """``chunked`` takes two samples of the cases' at a time (one temporary's bytes)."""
    def set_for(shape, dtype):
        monkeypatch.setattr(LRN, "CHUNK_BYTES", 2 * int(np.prod(shape[1:])) * np.dtype(dtype).itemsize)
    return set_for


def lrn(shape, dtype, two_samples, **cfg):
    two_samples(shape, dtype)
    return build("LRN", [shape], dtype, **cfg)


def run(layer, params, x, dy, algo):
    """``(top, bottom gradient)`` under the algorithm named ``algo``."""
    a = {p: next(a for a in layer.algorithms(p) if a.name == algo) for p in ("forward", "backward")}
    y = forward(layer, [x], params, algo=a["forward"])[0]
    return y, backward(layer, [x], [y], [dy], params, algo=a["backward"])[0][0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, cfg", CASES, ids=IDS)
def test_chunked_gives_the_default_bits(rng, two_samples, shape, cfg, dtype):
    layer, params = lrn(shape, dtype, two_samples, **cfg)
    assert [a.name for a in layer.algorithms("backward")] == ["default", "chunked"]
    x, dy = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    y, dx = run(layer, params, x, dy, "default")
    cy, cdx = run(layer, params, x, dy, "chunked")
    np.testing.assert_array_equal(cy, y)
    np.testing.assert_array_equal(cdx, dx)


@pytest.mark.parametrize("algo", ["default", "chunked"])
@pytest.mark.parametrize("shape, cfg", CASES, ids=IDS)
def test_the_backward_works_the_top_out_from_the_bottom_with_the_forwards_bits(rng, two_samples, shape, cfg, algo):
    """The backward reads the bottom alone: its bits are those of the formula on the top the
    forward wrote (the kernel before the top was dropped from its reads, written out here)."""
    layer, params = lrn(shape, np.float32, two_samples, **cfg)
    assert layer.backward_reads() == ((0,), ())
    x, dy = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    y, dx = run(layer, params, x, dy, algo)
    beta, view = layer.cfg["beta"], layer.view
    xs, ys, dys = x.reshape(view), y.reshape(view), dy.reshape(view)
    scale, sq = np.empty_like(xs), np.empty_like(xs)
    layer._scale(np, xs, sq, scale)
    tmp = dys * ys
    tmp /= scale
    first = np.power(scale, -beta)
    first *= dys
    want = np.empty_like(xs)
    layer._window_sum(np, tmp, want)
    want *= xs
    want *= -2.0 * layer.cfg["alpha"] * beta / layer.window
    want += first
    np.testing.assert_array_equal(dx.reshape(view).view(np.uint32), want.view(np.uint32))


def test_an_lrn_top_a_max_pooling_relieves_is_not_stashed():
    """LRN → max pooling under gist: the pooling keeps its argmax, and the LRN's backward needs
    only its bottom, so the LRN's top goes after the forward, and training matches baseline."""
    from test_memory_passes import assert_same_results, graph_of

    from superneuron.scheduler.lower import lower
    from superneuron.scheduler.policy import apply_policy
    g = graph_of(LRN_NET)
    s = apply_policy(lower(g), "gist")
    first_backward = next(i for i, x in enumerate(s.steps) if x.kind == "backward")
    frees = [i for i, x in enumerate(s.steps) if x.kind == "free" and x.tensor == "norm2"]
    assert "pool1#argmax" in {x.encoded for x in s.steps if x.kind == "forward"}
    assert frees and frees[0] < first_backward
    live = apply_policy(lower(g), "liveness")
    assert not any(x.kind == "free" and x.tensor == "norm2" and i < next(
        j for j, y in enumerate(live.steps) if y.kind == "backward") for i, x in enumerate(live.steps))
    assert_same_results(g, s)


@pytest.mark.parametrize("shape, cfg", CASES, ids=IDS)
def test_chunked_against_pytorch_and_finite_differences(rng, two_samples, shape, cfg):
    layer, params = lrn(shape, np.float64, two_samples, **cfg)
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    size, alpha, beta = cfg["local_size"], cfg["alpha"], cfg["beta"]
    if cfg.get("norm_region") == "WITHIN_CHANNEL":
        ty, tdx, _ = torch_grads(lambda t: lrn_within_channel(t, size, alpha, beta), x, {}, dy)
    else:  # torch divides the window's sum of squares by size, as Caffe's alpha/n does
        ty, tdx, _ = torch_grads(lambda t: F.local_response_norm(t, size, alpha, beta, cfg.get("k", 1.0)), x, {}, dy)
    y, dx = run(layer, params, x, dy, "chunked")
    np.testing.assert_allclose(y, ty, rtol=1e-10)
    np.testing.assert_allclose(dx, tdx, rtol=1e-9, atol=1e-12)
    gradcheck(layer, [x], params)  # the default's gradient; every algorithm agrees with it


@pytest.mark.parametrize("shape, cfg", CASES, ids=IDS)
def test_chunked_workspace_is_one_chunks_and_exact(rng, two_samples, shape, cfg):
    layer, params = lrn(shape, np.float32, two_samples, **cfg)
    chunk = (2 * shape[1] if cfg.get("norm_region") == "WITHIN_CHANNEL" else 2,) + layer.view[1:]
    for phase, count in (("forward", 1), ("backward", 3)):
        default, chunked = layer.algorithms(phase)
        assert default.workspace == workspace_bytes(*[(layer.view, np.float32)] * count)
        assert chunked.workspace == workspace_bytes(*[(chunk, np.float32)] * count) < default.workspace
        assert chunked.speed < default.speed  # a little slower: the workspace pass weighs it so
    assert_workspace_exact(layer, rng.standard_normal(shape).astype(np.float32), params)


def test_chunk_is_whole_samples_within_its_bytes_and_offered_only_below_the_batch(monkeypatch):
    shape = (32, 192, 56, 56)  # GoogLeNet's conv2_norm2 at batch 32: 2.3 MiB a sample
    layer, _ = build("LRN", [shape], np.float32)
    assert layer.chunk_rows == LRN.CHUNK_BYTES // (192 * 56 * 56 * 4) == 3
    assert layer.algorithms("backward")[1].workspace < layer.algorithms("backward")[0].workspace / 10
    layer, _ = build("LRN", [(2, 4, 8, 8)], np.float32)  # the whole batch fits one chunk
    assert [a.name for a in layer.algorithms("backward")] == ["default"]
    monkeypatch.setattr(LRN, "CHUNK_BYTES", 1)  # a sample over the bytes: one at a time
    layer, _ = build("LRN", [(3, 4, 8, 8)], np.float32, norm_region="WITHIN_CHANNEL")
    assert layer.chunk_rows == 4 and layer._spans("chunked") == [(0, 4), (4, 8), (8, 12)]


def test_chunked_allocates_nothing_big(two_samples):
    shape = (8, 16, 64, 64)  # 2 MiB of float32
    layer, params = lrn(shape, np.float32, two_samples, local_size=5)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    assert peak_allocation(only(layer, "chunked"), [x], params) < 256 * 1024


# -- in a plan -----------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["superneurons", "optimal"])
def test_googlenet_fits_half_of_liveness_arena_with_the_chunked_lrn(policy):
    # The LRN backward of conv2_norm2 needed 147 MiB of workspace, its bound 521.1 MiB, over
    # 1/2 of liveness's arena (470.9 MiB); chunked it needs 13.8 MiB and the bound was 387.9 MiB,
    # with its gradient in place (Layer.grad_inplace) another step's, 361.9 MiB, and with the max
    # poolings' chunked backward (layers/pool.py), 336.6 MiB
    spec = load_spec("nets/googlenet.yaml", batch=32)
    model = CostModel("gpu")
    base = planning.lowered(Graph(spec, kernels=planning.planning_kernels("gpu")),
                            optimizer=make_optimizer(SolverConfig(momentum=0.9)), device="gpu")
    free, live = planning.plan(base, "liveness", cost=model)
    assert {s.algorithm for s in free.steps if s.node is not None
            and free.graph.nodes[s.node].layer.type == "LRN"} == {"default"}  # no budget: the fastest
    budget = round(live.arena_bytes / 2)
    schedule, plan = planning.plan(base, policy, budget=budget, cost=model, solver_seconds=2)
    assert plan.fits(budget) and plan.lower_bound_bytes < budget < 521 << 20
    # optimal updates each parameter after its backward (scheduler/update.py): no gradient resident;
    # where its plan keeps a max pooling's argmax and a ReLU's signs, its steps hold less still
    grads = sum(aligned(base.tensors[t].nbytes) for t in base.resident if base.tensors[t].kind == "param_grad")
    assert plan.resident_bytes == base.resident_bytes - (grads if policy == "optimal" else 0)
    bound = round((plan.lower_bound_bytes + (grads if policy == "optimal" else 0)) / 2**20, 1)
    assert bound == 336.6 if policy == "superneurons" else bound <= 336.6
    norm2 = [s for s in schedule.steps if s.kind == "backward"
             and schedule.graph.nodes[s.node].name == "conv2_norm2"]
    if policy == "superneurons":  # (optimal's may pack its tensors so as to leave the default's 220 MiB)
        assert [s.algorithm for s in norm2] == ["chunked"]


LRN_NET = """\
name: lrn
input: {data: [4, 3, 8, 8], label: [4]}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 16, kernel_size: 3, pad: 1}
  - {name: norm1, type: LRN, bottom: conv1, top: norm1, local_size: 5, alpha: 0.5, beta: 0.75}
  - {name: relu1, type: ReLU, bottom: norm1, top: norm1}
  - {name: norm2, type: LRN, bottom: norm1, top: norm2, norm_region: WITHIN_CHANNEL, local_size: 3}
  - {name: pool1, type: Pooling, bottom: norm2, top: pool1, pool: MAX, kernel_size: 2, stride: 2}
  - {name: fc, type: InnerProduct, bottom: pool1, top: fc, num_output: 5}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
"""


@pytest.mark.parametrize("policy, placement", [("liveness", "dynamic"), ("recompute", "planned")])
def test_plan_equals_run_with_the_chunked_lrn(monkeypatch, policy, placement):
    monkeypatch.setattr(LRN, "CHUNK_BYTES", 16 * 8 * 8 * 4)  # one sample at a time
    spec = loads_spec(LRN_NET)
    free = Net(spec, policy=policy, placement=placement)
    ref_loss = free.forward_backward(feed_for(free))
    ref = {p: free.grad(p).copy() for p in free.learnable_names}
    # a budget the fastest algorithms do not fit: the LRN backwards take their chunks
    budget = free.plans["train"].arena_bytes - 1
    net = Net(spec, policy=policy, placement=placement, memory=budget)
    algos = {net.graph.nodes[s.node].name: s.algorithm for s in net.schedules["train"].steps
             if s.kind == "backward" and net.graph.nodes[s.node].layer.type == "LRN"}
    assert "chunked" in algos.values(), algos
    trace = KernelTrace(net, resident_params=True)
    with monkeypatch.context() as m:
        trace.install(m)
        loss = net.forward_backward(feed_for(net))
    plan = net.plans["train"]
    assert trace.locate().nbytes == net.arena_bytes  # the budget's block, the plan in it
    assert plan.arena_bytes <= budget and plan.peak_bytes <= budget
    assert trace.high_water <= plan.arena_bytes and net.peak_bytes == plan.peak_bytes
    if policy == "liveness":
        assert trace.live_peak() == plan.peak_bytes
    assert trace.clashes() == [] and trace.violations == []
    # the same bits as the run without a budget, where the convolution kept its algorithm
    assert loss == ref_loss
    for p, g in ref.items():
        np.testing.assert_array_equal(net.grad(p), g, err_msg=p)
