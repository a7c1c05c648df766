"""Winograd F(2x2, 3x3) (layers/winograd.py): against PyTorch in float64, its float32 rounding
against im2col's, its workspace declared to the byte, where it is offered and refused, how the
cost model and the workspace pass choose it, and, on a net where it is chosen, policy
invariance and plan equals run."""

import numpy as np
import pytest
import torch
from layer_harness import assert_workspace_exact, backward, build, forward
from test_net import feed_for

from superneuron.layers import winograd
from superneuron.layers.base import Context
from superneuron.net import Net
from superneuron.netfile.spec import loads_spec
from superneuron.runtime.profile import relative_error  # --profile's float64 check measures so
from superneuron.scheduler.cost import CostModel
from superneuron.scheduler.workspace import choose

# (bottom shape, Convolution keys): pads 0 to 2, batch 1, odd and non-square maps, C != K
CASES = [((1, 3, 5, 7), dict(num_output=4, kernel_size=3, pad=1)),
         ((3, 2, 8, 8), dict(num_output=5, kernel_size=3)),
         ((2, 4, 9, 6), dict(num_output=3, kernel_size=3, pad=[2, 1])),
         ((1, 5, 3, 3), dict(num_output=2, kernel_size=3, pad=2, bias_term=False)),
         ((2, 6, 11, 4), dict(num_output=7, kernel_size=3, pad=1)),
         # 64 tiles a sample: chunks of 16 samples, the last one short, in three slots
         ((36, 1, 16, 15), dict(num_output=2, kernel_size=3, pad=1))]


def by_name(layer, phase, name):
    return next(a for a in layer.algorithms(phase) if a.name == name)


def torch_reference(x, params, pad, dy):
    """y, dx and dw of the convolution by torch autograd, in float64."""
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(params["weight"], requires_grad=True)
    tb = torch.tensor(params["bias"]) if "bias" in params else None
    y = torch.nn.functional.conv2d(tx, tw, tb, padding=tuple(pad))
    y.backward(torch.tensor(dy))
    return y.detach().numpy(), tx.grad.numpy(), tw.grad.numpy()


@pytest.mark.parametrize("shape,cfg", CASES)
def test_winograd_matches_torch_in_float64(shape, cfg):
    layer, params = build("Convolution", [shape], **cfg)
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal(shape), rng.standard_normal(layer.top_shapes[0])
    y_ref, dx_ref, dw_ref = torch_reference(x, params, layer.pad, dy)
    wf, wb = by_name(layer, "forward", "winograd"), by_name(layer, "backward", "winograd")
    (y,) = forward(layer, [x], params, algo=wf)
    (dx,), grads = backward(layer, [x], [y], [dy], params, algo=wb)
    for got, want in ((y, y_ref), (dx, dx_ref), (grads["weight"], dw_ref)):
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11 * np.abs(want).max())


@pytest.mark.parametrize("m", [2, 4])
def test_both_tilings_correlate_as_torch_does(m):
    """F(4x4, 3x3), measured and not offered, is kept correct too (tools/bench_winograd.py)."""
    rng = np.random.default_rng(2)
    for (n, c, h, w, k, pad) in ((2, 3, 7, 10, 4, (1, 1)), (1, 2, 13, 5, 3, (3, 0))):
        x, wt = rng.standard_normal((n, c, h, w)), rng.standard_normal((k, c, 3, 3))
        plan = winograd.Tiling(m, n, c, h, w, k, pad)
        y = np.empty((n, k, plan.ho, plan.wo))
        winograd.convolve(np, plan, [np.empty(s, d) for s, d in plan.workspace_shapes(np.float64)], wt, x, y)
        ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(wt), padding=pad).numpy()
        np.testing.assert_allclose(y, ref, rtol=1e-11, atol=1e-11 * np.abs(ref).max())


# The float32 rounding measured below (max |error| / max |exact| over the output, the exact
# value in float64; worst of 5 seeds; 4x32x12x12, 32 filters, 2026-11-28): forward im2col
# 8.3e-7, F(2x2, 3x3) 3.3e-7 (its sums run over C alone, im2col's over 9C), F(4x4, 3x3) 4.9e-6;
# data gradient im2col 2.1e-7, F(2x2, 3x3) 2.6e-7. The bounds, against im2col's, leave room.
ROUNDING = {"winograd": 4.0, "winograd4": 15.0}


def test_float32_rounding_against_im2col():
    shape, cfg = (4, 32, 12, 12), dict(num_output=32, kernel_size=3, pad=1, bias_term=False)
    errors = {"im2col": [], "winograd": [], "winograd4": [], "im2col dx": [], "winograd dx": []}
    for seed in range(5):
        layer, params = build("Convolution", [shape], np.float32, seed=seed, **cfg)
        rng = np.random.default_rng(seed)
        x = rng.standard_normal(shape).astype(np.float32)
        dy = rng.standard_normal(layer.top_shapes[0]).astype(np.float32)
        y64, dx64, _ = torch_reference(x.astype(np.float64), {"weight": params["weight"].astype(np.float64)},
                                       layer.pad, dy.astype(np.float64))
        for name in ("im2col", "winograd"):
            (y,) = forward(layer, [x], params, algo=by_name(layer, "forward", name))
            errors[name].append(relative_error(y, y64))
            (dx,), _ = backward(layer, [x], [y], [dy], params, algo=by_name(layer, "backward", name))
            errors[f"{name} dx"].append(relative_error(dx, dx64))
        plan = winograd.Tiling(4, *shape, 32, (1, 1))
        y4 = np.empty_like(y64, np.float32)
        winograd.convolve(np, plan, [np.empty(s, d) for s, d in plan.workspace_shapes(np.float32)],
                          params["weight"], x, y4)
        errors["winograd4"].append(relative_error(y4, y64))
    worst = {k: max(v) for k, v in errors.items()}
    assert worst["im2col"] < 2e-6 and worst["im2col dx"] < 2e-6, worst
    assert worst["winograd"] <= ROUNDING["winograd"] * worst["im2col"], worst
    assert worst["winograd dx"] <= ROUNDING["winograd"] * worst["im2col dx"], worst
    assert worst["winograd4"] <= ROUNDING["winograd4"] * worst["im2col"], worst
    assert worst["winograd4"] > worst["winograd"], worst  # its larger coefficients round more


def test_the_many_chunks_case_has_many_chunks():
    layer, _ = build("Convolution", [CASES[5][0]], **CASES[5][1])
    plan = winograd.tiling(layer, "x")
    assert (plan.size, plan.count, plan.slots) == (16, 3, 3)


@pytest.mark.parametrize("case", [0, 2, 3, 5])
def test_winograd_workspace_declared_exactly(case):
    shape, cfg = CASES[case]
    layer, params = build("Convolution", [shape], **cfg)
    assert_workspace_exact(layer, np.random.default_rng(0).standard_normal(shape), params)


def test_first_layer_backward_takes_dw_alone():
    layer, params = build("Convolution", [CASES[4][0]], **CASES[4][1])
    rng = np.random.default_rng(3)
    x, dy = rng.standard_normal(CASES[4][0]), rng.standard_normal(layer.top_shapes[0])
    _, _, dw_ref = torch_reference(x, params, layer.pad, dy)
    algo = by_name(layer, "backward", "winograd")
    grads = {k: np.full_like(v, np.nan) for k, v in params.items()}
    layer.backward(Context(np, workspace=np.zeros(algo.workspace, np.uint8), algo=algo.name),
                   [x], [None], [dy], [None], params, grads)
    np.testing.assert_allclose(grads["weight"], dw_ref, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("type_name,shape,cfg,offered", [
    ("Convolution", (2, 4, 8, 8), dict(num_output=4, kernel_size=3, pad=1), {"forward", "backward"}),
    ("Convolution", (2, 4, 8, 8), dict(num_output=4, kernel_size=3, pad=3), {"forward"}),  # dx's pad -1
    ("Convolution", (2, 4, 8, 8), dict(num_output=4, kernel_size=3, stride=2), set()),
    ("Convolution", (2, 4, 8, 8), dict(num_output=4, kernel_size=3, dilation=2), set()),
    ("Convolution", (2, 4, 8, 8), dict(num_output=4, kernel_size=3, group=2), set()),
    ("Convolution", (2, 4, 8, 8), dict(num_output=4, kernel_size=5), set()),
    ("Convolution", (2, 4, 8, 8), dict(num_output=4, kernel_size=[3, 1], pad=[1, 0]), set()),
    ("Deconvolution", (2, 4, 8, 8), dict(num_output=4, kernel_size=3, pad=1), set()),
])
def test_where_winograd_is_offered(type_name, shape, cfg, offered):
    layer, _ = build(type_name, [shape], **cfg)
    got = {p for p in ("forward", "backward") if any(a.name == "winograd" for a in layer.algorithms(p))}
    assert got == offered
    for phase in ("forward", "backward"):  # fastest first: the default before the passes choose
        speeds = [a.speed for a in layer.algorithms(phase)]
        assert speeds == sorted(speeds, reverse=True)


def test_small_maps_and_odd_sizes_count_against_it():
    """The filters' transform is paid per call: on a few tiles (VGG-16's 2x2 maps at 32x32)
    Winograd measured slower than im2col, and its estimate says so."""
    def speed(shape):
        layer, _ = build("Convolution", [shape], np.float32, num_output=shape[1], kernel_size=3, pad=1)
        return winograd.speed(layer, "forward")
    assert speed((16, 512, 2, 2)) < 0.6 < 1.0 < speed((16, 512, 8, 8))
    assert speed((16, 256, 7, 7)) < speed((16, 256, 8, 8))


def test_cost_model_prefers_it_on_wide_layers_on_the_cpu_only():
    wide, _ = build("Convolution", [(32, 256, 14, 14)], np.float32, num_output=256, kernel_size=3, pad=1)
    narrow, _ = build("Convolution", [(64, 16, 32, 32)], np.float32, num_output=16, kernel_size=3, pad=1)
    cpu, gpu = CostModel("cpu"), CostModel("gpu")
    for phase in ("forward", "backward"):
        seconds = {a.name: cpu.algo_seconds(wide, phase, a) for a in cpu.algorithms(wide, phase)}
        # the backward (dw by im2col, dx by Winograd) measured no faster than im2col's
        assert min(seconds, key=seconds.get) == ("winograd" if phase == "forward" else "im2col"), seconds
        assert seconds["winograd"] < seconds["im2col_chunked"], (phase, seconds)
        seconds = {a.name: cpu.algo_seconds(narrow, phase, a) for a in cpu.algorithms(narrow, phase)}
        assert min(seconds, key=seconds.get) == "im2col", (phase, seconds)
        assert "winograd" not in [a.name for a in gpu.algorithms(wide, phase)]


def test_workspace_pass_refuses_it_where_its_workspace_does_not_fit():
    wide, _ = build("Convolution", [(32, 256, 14, 14)], np.float32, num_output=256, kernel_size=3, pad=1)
    model = CostModel("cpu")
    algos = model.algorithms(wide, "forward")
    wino = by_name(wide, "forward", "winograd")

    def seconds(a):
        return model.algo_seconds(wide, "forward", a)
    assert choose(algos, seconds, room=None).name == "winograd"
    assert choose(algos, seconds, room=wino.workspace + 64).name == "winograd"
    under = choose(algos, seconds, room=wino.workspace - 1)
    assert under.name != "winograd" and under.workspace < wino.workspace
    assert choose(algos, seconds, limit=wino.workspace - 1).name != "winograd"


# Two wide 3x3 convolutions (where the CPU's cost model chooses Winograd), BatchNorm between
WIDE = """\
name: wide
input: {data: [4, 256, 16, 16], label: [4]}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 256, kernel_size: 3, pad: 1}
  - {name: bn1, type: BatchNorm, bottom: conv1, top: conv1}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: conv2, type: Convolution, bottom: conv1, top: conv2, num_output: 256, kernel_size: 3, pad: 1}
  - {name: pool, type: Pooling, bottom: conv2, top: pool, pool: AVE, global_pooling: true}
  - {name: fc, type: InnerProduct, bottom: pool, top: fc, num_output: 5}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
"""


def gradients(policy, **options):
    net = Net(loads_spec(WIDE), policy=policy, **options)
    loss = net.forward_backward(feed_for(net))
    grads = {name: net.grad(name) for name in net.learnable_names}
    return net, loss, grads


def test_policies_give_baselines_bits_and_plan_equals_run_where_it_is_chosen():
    base, loss, grads = gradients("baseline")
    chosen = winograd_steps(base)
    assert chosen == {("conv1", "forward"), ("conv2", "forward")}, chosen
    for policy in ("liveness", "recompute", "superneurons"):
        net, other_loss, other = gradients(policy)
        assert winograd_steps(net) == chosen, policy
        assert other_loss == loss, policy
        for k in grads:
            assert np.array_equal(other[k], grads[k]), (policy, k)
        assert net.peak_bytes == net.plans["train"].peak_bytes, policy


def winograd_steps(net):
    schedule = net.schedules["train"]
    return {(schedule.graph.nodes[s.node].layer.name, s.kind) for s in schedule.steps if s.algorithm == "winograd"}


def test_a_budget_its_workspace_does_not_fit_gets_another_algorithm():
    """One byte under the peak that Winograd's workspace sets, the step that set it takes
    another algorithm (the plan fits); under a workspace limit below it, no step takes it."""
    free, loss, _ = gradients("liveness")
    wino = free.plans["train"].peak_bytes
    tight, tight_loss, _ = gradients("liveness", memory=wino - 1)
    assert winograd_steps(tight) < winograd_steps(free)
    assert tight.plans["train"].peak_bytes <= wino - 1 and tight.peak_bytes == tight.plans["train"].peak_bytes
    assert tight_loss == pytest.approx(loss, rel=1e-5)  # another algorithm: float32 rounding apart
    conv = free.graph.node("conv2").layer
    limit = next(a for a in conv.algorithms("forward") if a.name == "winograd").workspace - 1
    limited, _, _ = gradients("liveness", workspace_limit=limit)
    assert winograd_steps(limited) == set()
