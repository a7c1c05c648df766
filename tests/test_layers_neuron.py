"""Sigmoid, TanH, ELU, PReLU, Power, AbsVal and BNLL (layers/neuron.py): finite-difference
gradients (and in-place runs where a layer may run in place), agreement with PyTorch at
float32 and float64, Caffe's special cases, errors, memory, and a net of them that computes
bit for bit the same under the baseline and superneurons policies."""

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from layer_harness import backward, build, forward, gradcheck, peak_allocation
from one_line import raises_one_line
from test_layers_misc import KIB, run_phase, torch_run
from test_memory_passes import names
from test_net import feed_for

from superneuron.errors import LayerError
from superneuron.layers import layer_class
from superneuron.net import Net, load_net
from superneuron.netfile.spec import loads_spec

NET = "tests/nets/neuron.yaml"
RNG_SEED = 23  # the seed of each test's own generator (the rng fixture, conftest.py)


def run(layer, x, params, dy):
    """Our top, bottom gradient and parameter gradients for top gradient ``dy``."""
    tops = forward(layer, [x], params)
    (dx,), pgrads = backward(layer, [x], tops, [dy], params)
    return tops[0], dx, pgrads


# -- gradient checks (float64), with in-place runs where allowed -------------------------------

GRAD_CASES = [
    ("Sigmoid", (3, 4, 2, 3), {}),
    ("Sigmoid", (5, 3), {}),
    ("TanH", (3, 4, 2, 3), {}),
    ("ELU", (3, 4, 2, 3), {}),
    ("ELU", (5, 3), dict(alpha=0.3)),
    ("ELU", (3, 4, 2, 3), dict(alpha=2.5)),
    ("ELU", (3, 4, 2, 3), dict(alpha=0.0)),
    ("ELU", (3, 4, 2, 3), dict(alpha=-0.5)),  # reads its bottom: checked out of place only
    ("PReLU", (3, 4, 2, 3), {}),
    ("PReLU", (5, 3), {}),
    ("PReLU", (3, 4, 2, 3), dict(channel_shared=True)),
    ("Power", (3, 4, 2, 3), dict(power=2.5, scale=0.5, shift=4)),  # base in [3, 5]
    ("Power", (3, 4, 2, 3), dict(power=-1.5, scale=-0.5, shift=3)),
    ("Power", (3, 4, 2, 3), dict(power=2, scale=-1.5, shift=0.5)),
    ("Power", (3, 4, 2, 3), dict(power=3, scale=2)),
    ("Power", (3, 4, 2, 3), dict(power=1, scale=-2, shift=1)),  # affine: in place
    ("Power", (3, 4, 2, 3), dict(power=0, scale=3)),  # constant: in place
    ("AbsVal", (3, 4, 2, 3), {}),
    ("BNLL", (3, 4, 2, 3), {}),
]


@pytest.mark.parametrize("type_name, shape, cfg", GRAD_CASES)
def test_gradcheck(rng, type_name, shape, cfg):
    layer, params = build(type_name, [shape], **cfg)
    x = rng.uniform(-2, 2, shape)
    gradcheck(layer, [x], params)  # and check_inplace where layer.INPLACE


@pytest.mark.parametrize("type_name, cfg, inplace, reads", [
    ("Sigmoid", {}, True, ((), (0,))),
    ("TanH", {}, True, ((), (0,))),
    ("ELU", {}, True, ((), (0,))),
    ("ELU", dict(alpha=0.0), True, ((), (0,))),
    ("ELU", dict(alpha=-0.5), False, ((0,), (0,))),
    ("PReLU", {}, False, ((0,), ())),
    ("PReLU", dict(channel_shared=True), False, ((0,), ())),
    ("Power", dict(power=2), False, ((0,), ())),
    ("Power", dict(power=1, scale=3, shift=1), True, ((), ())),
    ("Power", dict(power=0), True, ((), ())),
    ("Power", dict(power=2, scale=0, shift=3), True, ((), ())),
    ("AbsVal", {}, False, ((0,), ())),
    ("BNLL", {}, False, ((0,), ())),
])
def test_inplace_and_backward_reads(type_name, cfg, inplace, reads):
    layer, _ = build(type_name, [(2, 3, 4)], **cfg)
    assert layer.CHEAP and layer.INPLACE == inplace and layer.backward_reads() == reads


def test_registered_under_caffe_names():
    for name in ("Sigmoid", "TanH", "ELU", "PReLU", "Power", "AbsVal", "BNLL"):
        assert layer_class(name).type == name


# -- against PyTorch ---------------------------------------------------------------------------

def elu(alpha):
    return lambda t: F.elu(t, alpha)


def power(p, scale, shift):
    return lambda t: (shift + scale * t) ** p


# Inputs with a few extremes, where an unstable formula overflows or loses precision.
EXTREMES = np.array([-100.0, -40.0, -20.0, -1e-8, 0.0, 1e-8, 20.0, 40.0])

TORCH_CASES = [
    ("Sigmoid", {}, torch.sigmoid, "extremes"),
    ("TanH", {}, torch.tanh, "extremes"),
    ("ELU", {}, elu(1.0), "extremes"),
    ("ELU", dict(alpha=0.3), elu(0.3), "normal"),
    ("ELU", dict(alpha=2.0), elu(2.0), "normal"),
    ("ELU", dict(alpha=-0.5), elu(-0.5), "normal"),
    ("AbsVal", {}, torch.abs, "normal"),
    # threshold 40: below it torch computes log(1 + exp(x)) in full, above it x, as we do
    ("BNLL", {}, lambda t: F.softplus(t, threshold=40), "extremes"),
    ("Power", dict(power=2.5, scale=0.5, shift=4), power(2.5, 0.5, 4), "normal"),
    ("Power", dict(power=-0.5, scale=2, shift=9), power(-0.5, 2, 9), "normal"),
    ("Power", dict(power=3, scale=-1.5, shift=0.5), power(3, -1.5, 0.5), "normal"),
    ("Power", dict(power=2, scale=1.5), power(2, 1.5, 0), "normal"),
    ("Power", dict(power=1, scale=-2, shift=0.25), power(1, -2, 0.25), "normal"),
]
TOLERANCE = {np.float64: dict(rtol=1e-12, atol=1e-15), np.float32: dict(rtol=2e-6, atol=1e-6)}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("type_name, cfg, fn, inputs", TORCH_CASES)
def test_vs_torch(rng, type_name, cfg, fn, inputs, dtype):
    """Values and gradients against PyTorch's in float64, for our float64 and float32 runs."""
    shape = (4, 3, 5, 2)
    x = rng.uniform(-2, 2, shape) if inputs == "normal" else rng.standard_normal(shape) * 5
    if inputs == "extremes":
        x.flat[:len(EXTREMES)] = EXTREMES
    dy = rng.standard_normal(shape)
    layer, params = build(type_name, [shape], dtype, **cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow or invalid value on the way
        y, dx, _ = run(layer, x.astype(dtype), params, dy.astype(dtype))
    ty, (tdx,) = torch_run(fn, [x], dy)
    scale = np.abs(ty).max(), np.abs(tdx).max()
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(y, ty, rtol=tol["rtol"], atol=tol["atol"] * scale[0])
    np.testing.assert_allclose(dx, tdx, rtol=tol["rtol"], atol=tol["atol"] * scale[1])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape, shared", [((4, 3, 5, 2), False), ((6, 5), False), ((4, 3, 5, 2), True)])
def test_prelu_vs_torch(rng, shape, shared, dtype):
    layer, params = build("PReLU", [shape], dtype, channel_shared=shared)
    assert params["weight"].shape == ((1,) if shared else (shape[1],))
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    y, dx, pg = run(layer, x.astype(dtype), params, dy.astype(dtype))
    ty, (tdx, tdw) = torch_run(F.prelu, [x, params["weight"].astype(np.float64)], dy, grad=(0, 1))
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(y, ty, rtol=tol["rtol"], atol=tol["atol"])
    np.testing.assert_allclose(dx, tdx, rtol=tol["rtol"], atol=tol["atol"])
    np.testing.assert_allclose(pg["weight"], tdw, rtol=tol["rtol"] * 10, atol=tol["atol"] * 10)


# -- Caffe's special cases ---------------------------------------------------------------------

def test_prelu_default_weight_is_caffes_quarter():
    layer = layer_class("PReLU")("p", ["x"], ["y"], layer_class("PReLU").config({}))
    layer.setup([(2, 3, 4)])
    (spec,) = layer.param_specs()
    assert spec.shape == (3,) and spec.learnable
    assert spec.filler == {"type": "constant", "value": 0.25}


@pytest.mark.parametrize("cfg, value", [(dict(power=0, scale=2, shift=-3), 1.0),
                                        (dict(power=3, scale=0, shift=-2), -8.0),
                                        (dict(power=0.5, scale=0, shift=4), 2.0)])
def test_power_constant_output_has_zero_gradient(rng, cfg, value):
    """Caffe: power 0 gives 1 and scale 0 gives shift^power everywhere (NaN, inf and 0 inputs
    included), with a zero gradient."""
    layer, params = build("Power", [(2, 5)], **cfg)
    x = np.array([[0.0, -1.0, np.inf, np.nan, 3.0]] * 2)
    y, dx, _ = run(layer, x, params, rng.standard_normal((2, 5)))
    np.testing.assert_array_equal(y, value)
    np.testing.assert_array_equal(dx, 0.0)


def test_power_gradient_where_the_base_is_zero():
    """Caffe's power * y / x is 0/0 at x = 0; the derivative itself is 0 for power 3, and
    scale * dy for power 1."""
    x, dy = np.array([[0.0, 1.0, -2.0]]), np.array([[5.0, 1.0, 1.0]])
    layer, params = build("Power", [(1, 3)], power=3, scale=2)
    y, dx, _ = run(layer, x, params, dy)
    np.testing.assert_array_equal(y, [[0.0, 8.0, -64.0]])
    np.testing.assert_array_equal(dx, [[0.0, 24.0, 96.0]])  # 3 * 2 * (2x)^2 * dy
    layer, params = build("Power", [(1, 3)], power=1, scale=-3, shift=1)
    y, dx, _ = run(layer, x, params, dy)
    np.testing.assert_array_equal(y, [[1.0, -2.0, 7.0]])
    np.testing.assert_array_equal(dx, -3.0 * dy)


@pytest.mark.parametrize("type_name, cfg, factor", [
    ("ELU", dict(alpha=0.7), 0.7),       # Caffe's x > 0 test: x = 0 takes the alpha side
    ("ELU", dict(alpha=-0.4), -0.4),
    ("PReLU", {}, None),                  # x = 0 takes the weight: Caffe's x <= 0
    ("AbsVal", {}, 0.0),                  # sign(0) = 0
    ("BNLL", {}, 0.5),
    ("Sigmoid", {}, 0.25),
    ("TanH", {}, 1.0),
])
def test_gradient_at_zero(type_name, cfg, factor):
    layer, params = build(type_name, [(1, 3)], **cfg)
    if factor is None:
        factor = params["weight"]  # one per channel (a column here)
    y, dx, _ = run(layer, np.zeros((1, 3)), params, np.array([[1.0, -2.0, 3.0]]))
    np.testing.assert_array_equal(dx, factor * np.array([[1.0, -2.0, 3.0]]))


def test_elu_identity_on_positives_and_saturation():
    layer, params = build("ELU", [(1, 4)], alpha=1.5)
    x = np.array([[3.0, 1e-300, -1e-300, -800.0]])
    y, dx, _ = run(layer, x, params, np.ones((1, 4)))
    np.testing.assert_array_equal(y[0, :2], x[0, :2])  # exactly x where x > 0
    assert y[0, 2] == -1.5e-300 and y[0, 3] == -1.5  # expm1: no cancellation near 0
    np.testing.assert_array_equal(dx, [[1.0, 1.0, 1.5, 0.0]])


@pytest.mark.parametrize("type_name", ["Sigmoid", "BNLL", "TanH"])
def test_huge_inputs_stay_finite_without_warnings(type_name):
    layer, params = build(type_name, [(1, 4)], np.float32)
    x = np.array([[-1e4, -100.0, 100.0, 1e4]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y, dx, _ = run(layer, x, params, np.ones((1, 4), np.float32))
    expect = {"Sigmoid": ([0, 0, 1, 1], [0, 0, 0, 0]), "TanH": ([-1, -1, 1, 1], [0, 0, 0, 0]),
              "BNLL": ([0, 0, 100, 1e4], [0, 0, 1, 1])}[type_name]
    np.testing.assert_allclose(y, [expect[0]], rtol=1e-7, atol=1e-30)
    np.testing.assert_allclose(dx, [expect[1]], rtol=1e-7, atol=1e-30)


# -- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("type_name, shapes, cfg, message", [
    ("ELU", [(2, 3)], dict(alpah=1.0), "unknown key 'alpah'; did you mean 'alpha'"),
    ("ELU", [(2, 3)], dict(alpha="one"), "'alpha': expected a number"),
    ("Sigmoid", [(2, 3)], dict(negative_slope=0.1), "unknown key 'negative_slope'"),
    ("PReLU", [(6,)], {}, r"needs a bottom of at least 2 dims \(N, C, ...\), got 1-D \(6,\)"),
    ("PReLU", [(2, 3)], dict(channel_shared=1), "'channel_shared': expected true or false"),
    ("PReLU", [(2, 3)], dict(filler={"type": "constant", "sdt": 1}),
     "filler 'constant' has no option 'sdt'; did you mean 'std'"),
    ("Power", [(2, 3)], dict(powr=2), "unknown key 'powr'; did you mean 'power'"),
    ("Power", [(2, 3)], dict(scale=0, shift=-8, power=0.5),
     r"constant shift\^power = -8.0\^0.5, which is not a finite real number"),
    ("Power", [(2, 3)], dict(scale=0, shift=0, power=-1), "not a finite real number"),
])
def test_errors(type_name, shapes, cfg, message):
    with raises_one_line(LayerError, match=message):
        build(type_name, shapes, **cfg)


HEAD = """\
name: t
input: {data: [2, 3, 4, 4], label: [2]}
layers:
  - {name: conv, type: Convolution, bottom: data, top: conv, num_output: 3, kernel_size: 1}
"""


@pytest.mark.parametrize("layer, ok", [
    ("{name: n, type: ELU, bottom: conv, top: conv, alpha: -0.5}", False),
    ("{name: n, type: PReLU, bottom: conv, top: conv}", False),
    ("{name: n, type: Power, bottom: conv, top: conv, power: 2}", False),
    ("{name: n, type: AbsVal, bottom: conv, top: conv}", False),
    ("{name: n, type: BNLL, bottom: conv, top: conv}", False),
    ("{name: n, type: ELU, bottom: conv, top: conv, alpha: 0.5}", True),
    ("{name: n, type: Power, bottom: conv, top: conv, scale: 2, shift: 1}", True),
    ("{name: n, type: ELU, bottom: conv, top: own, alpha: -0.5}", True),
])
def test_in_place_requests_in_a_net(layer, ok):
    """As in Caffe, every in-place request is accepted; a layer whose backward reads its bottom
    gets a top of its own (the bottom is kept for it), the others write over their bottom."""
    net = Net(loads_spec(HEAD + f"  - {layer}\n"))
    node = net.graph.node("n")
    if "top: own" in layer:
        assert not node.inplace and node.kept is None
    elif ok:
        assert node.inplace and net.graph.root(node.tops[0]) == "conv"
    else:
        assert not node.inplace and node.kept == "keeps 'conv', read by the backward of 'n'"
        assert net.graph.root(node.tops[0]) == "conv@n"


# -- workspace and memory ----------------------------------------------------------------------

MEMORY_CASES = [("Sigmoid", {}), ("TanH", {}), ("ELU", {}), ("ELU", dict(alpha=-1.0)), ("PReLU", {}),
                ("PReLU", dict(channel_shared=True)), ("Power", dict(power=2.5, shift=5)),
                ("Power", dict(power=1, scale=2)), ("AbsVal", {}), ("BNLL", {})]


@pytest.mark.parametrize("type_name, cfg", MEMORY_CASES)
def test_peak_allocation(rng, type_name, cfg):
    """Kernels on 2 MiB tensors allocate nothing of their size outside their workspace."""
    shape = (8, 16, 64, 64)
    layer, params = build(type_name, [shape], np.float32, **cfg)
    x = rng.standard_normal(shape).astype(np.float32)
    assert peak_allocation(layer, [x], params) < 256 * KIB


@pytest.mark.parametrize("type_name, cfg", MEMORY_CASES)
def test_workspace_is_exact(rng, type_name, cfg):
    """Each phase runs in the workspace it declares and fails with one byte less."""
    layer, params = build(type_name, [(4, 3, 5)], np.float32, **cfg)
    xs = [rng.standard_normal((4, 3, 5)).astype(np.float32)]
    tops = [np.zeros((4, 3, 5), np.float32)]
    for phase in ("forward", "backward"):
        need = layer.algorithms(phase)[0].workspace
        run_phase(layer, phase, need, xs, tops, params)
        if need:
            with pytest.raises(AssertionError, match="exceeds workspace"):
                run_phase(layer, phase, need - 1, xs, tops, params)


def test_cost_counts_every_pass():
    """ELU's forward makes five passes, four of them through its scratch array."""
    layer, _ = build("ELU", [(4, 3, 5)], np.float32)
    cost = layer.cost()
    assert (cost.fwd_bytes, cost.bwd_bytes) == (11 * 60 * 4, 10 * 60 * 4)


# -- a net of them under two policies ----------------------------------------------------------

def test_net_is_bit_identical_under_baseline_and_superneurons():
    """Losses and every parameter gradient are the same bits under superneurons (offload and
    recomputation of the cheap neuron layers) as under baseline, and so are three training
    steps; plan equals run for both."""
    from superneuron.train.optim import make_optimizer
    from superneuron.train.solver_config import SolverConfig
    nets = {p: load_net(NET, policy=p) for p in ("baseline", "superneurons")}
    feed = feed_for(nets["baseline"])
    losses = {p: net.forward_backward(feed) for p, net in nets.items()}
    assert np.isfinite(losses["baseline"]) and losses["superneurons"] == losses["baseline"]
    base, other = nets["baseline"], nets["superneurons"]
    assert {"prelu1/weight", "prelu2/weight"} <= set(base.learnable_names)
    for name in base.learnable_names:
        assert np.abs(base.grad(name)).max() > 0, name
        np.testing.assert_array_equal(other.grad(name), base.grad(name), err_msg=name)
    # the neuron layers were recomputed, the in-place ones in place
    recomputed = set(names(other.schedules["train"], "recompute"))
    assert {"elu1", "tanh2", "abs2", "bnll2", "affine2", "prelu2"} <= recomputed
    tensors = base.graph.tensors
    in_place = {"prelu1@elu1", "conv2@sigmoid2", "square2@tanh2", "bnll2@affine2"}
    assert {t.name for t in tensors.values() if t.kind == "data" and t.alias} == in_place
    assert all(tensors[t.split("@")[0] + ".grad"].alias == t + ".grad" for t in in_place)
    assert other.peak_bytes < base.peak_bytes
    for net in nets.values():
        assert net.peak_bytes == net.plans["train"].peak_bytes
    trained = {p: Net(net.spec, policy=p, optimizer=make_optimizer(SolverConfig())) for p, net in nets.items()}
    steps = {p: [net.train_step(feed, it) for it in range(3)] for p, net in trained.items()}
    assert steps["superneurons"] == steps["baseline"] and len(set(steps["baseline"])) == 3
    for name in base.learnable_names:
        np.testing.assert_array_equal(trained["superneurons"].param(name), trained["baseline"].param(name))
