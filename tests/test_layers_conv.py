"""Convolution, Pooling and InnerProduct: finite-difference gradients, agreement between the
convolution algorithms, agreement with torch.nn.functional, declared workspaces and memory."""

import numpy as np
import pytest
import torch.nn.functional as F
from layer_harness import (
    assert_workspace_exact,
    backward,
    build,
    check_grad_inplace,
    forward,
    gradcheck,
    only,
    peak_allocation,
    torch_grads,
)
from one_line import raises_one_line

from superneuron.errors import LayerError
from superneuron.layers import im2col as im2col_module
from superneuron.layers import parallel
from superneuron.layers.base import Context

KIB = 1024


# -- Convolution -------------------------------------------------------------------------------

CONV_CASES = [
    ((2, 3, 7, 6), dict(num_output=4, kernel_size=3)),
    ((2, 4, 9, 8), dict(num_output=6, kernel_size=3, stride=2, pad=1)),
    ((2, 3, 9, 9), dict(num_output=2, kernel_size=3, dilation=2, pad=2)),
    ((2, 4, 7, 8), dict(num_output=6, kernel_size=[2, 3], stride=[2, 1], pad=[1, 0],
                        dilation=[1, 2], group=2)),
    ((1, 6, 6, 6), dict(num_output=6, kernel_size=3, group=3, pad=2, stride=3, bias_term=False)),
    ((2, 4, 5, 5), dict(num_output=3, kernel_size=1)),            # pointwise: no column buffer
    ((2, 4, 5, 5), dict(num_output=3, kernel_size=1, stride=2)),
    ((2, 2, 1, 1), dict(num_output=3, kernel_size=3, dilation=3, pad=3)),  # outer taps: padding only
    # im2col's dx as a convolution of dy (stride 1, same size): groups, dilated, uneven pads
    ((2, 4, 8, 7), dict(num_output=4, kernel_size=3, pad=[2, 1], dilation=[2, 1], group=2)),
    ((2, 4, 6, 5), dict(num_output=4, kernel_size=1, pad=1)),     # stride 1, pad past the kernel: scattered
    ((2, 2, 8, 8), dict(num_output=2, kernel_size=3, pad=1)),
]


def random_conv_cases(count=6, seed=7):
    """Small random convolutions (groups, stride, pad, dilation, rectangular kernels)."""
    rng = np.random.default_rng(seed)
    cases = []
    while len(cases) < count:
        g = int(rng.integers(1, 3))
        kernel, stride, pad, dil = ([int(v) for v in rng.integers(lo, hi, 2)]
                                    for lo, hi in ((1, 4), (1, 3), (0, 3), (1, 3)))
        hw = [int(v) for v in rng.integers(1, 9, 2)]
        if any(n + 2 * p < d * (k - 1) + 1 for n, p, d, k in zip(hw, pad, dil, kernel, strict=True)):
            continue
        cfg = dict(num_output=g * int(rng.integers(1, 4)), kernel_size=kernel, stride=stride,
                   pad=pad, dilation=dil, group=g, bias_term=bool(rng.integers(0, 2)))
        cases.append(((int(rng.integers(1, 3)), g * int(rng.integers(1, 3)), *hw), cfg))
    return cases


def torch_conv(layer):
    return lambda x, weight, bias=None: F.conv2d(x, weight, bias, stride=layer.stride, padding=layer.pad,
                                                 dilation=layer.dilation, groups=layer.cfg["group"])


@pytest.mark.parametrize("shape,cfg", CONV_CASES + random_conv_cases())
def test_conv_gradients_algorithms_and_torch(shape, cfg):
    layer, params = build("Convolution", [shape], **cfg)
    x = np.random.default_rng(1).standard_normal(shape)
    gradcheck(layer, [x], params)  # also checks that every algorithm agrees
    names = [a.name for a in layer.algorithms("forward")]
    assert names == [a.name for a in layer.algorithms("backward")]
    portable = [n for n in names if n != "winograd"]  # Winograd: in its place by speed (test_winograd.py)
    assert portable[:2] == ["im2col", "im2col_chunked"] and portable[2:] in ([], ["direct"])
    dy = np.random.default_rng(2).standard_normal(layer.top_shapes[0])
    y, dx, dp = torch_grads(torch_conv(layer), x, params, dy)
    for name in names:
        algo = [a for a in layer.algorithms("forward") if a.name == name][0]
        np.testing.assert_allclose(forward(layer, [x], params, algo=algo)[0], y, atol=1e-12)
        algo = [a for a in layer.algorithms("backward") if a.name == name][0]
        bg, pg = backward(layer, [x], [y], [dy], params, algo=algo)
        np.testing.assert_allclose(bg[0], dx, atol=1e-12, err_msg=name)
        for k in params:
            np.testing.assert_allclose(pg[k], dp[k], atol=1e-12, err_msg=f"{name} {k}")


@pytest.mark.parametrize("shape,cfg", CONV_CASES[1:6])
def test_conv_workspace_declared_exactly(shape, cfg):
    layer, params = build("Convolution", [shape], **cfg)
    assert_workspace_exact(layer, np.random.default_rng(0).standard_normal(shape), params)


def test_conv_workspaces_ordered():
    layer, _ = build("Convolution", [(4, 8, 10, 10)], np.float32, num_output=8, kernel_size=3, pad=1)
    for phase in ("forward", "backward"):
        ws = {a.name: a.workspace for a in layer.algorithms(phase)}
        assert ws["im2col"] > ws["im2col_chunked"] > ws["direct"] > 0, (phase, ws)
    pointwise, _ = build("Convolution", [(4, 8, 10, 10)], np.float32, num_output=8, kernel_size=1)
    assert [a.workspace for a in pointwise.algorithms("forward")][1] == 0


@pytest.mark.parametrize("case", [3, 1, 8, 10])
def test_conv_skips_bottom_gradient_when_not_needed(case):
    # the first convolution of a net: dw alone, in the workspace declared for dw and dx
    shape, cfg = CONV_CASES[case]
    layer, params = build("Convolution", [shape], **cfg)
    x = np.random.default_rng(0).standard_normal(shape)
    dy = np.random.default_rng(1).standard_normal(layer.top_shapes[0])
    ref = backward(layer, [x], [None], [dy], params)[1]
    for algo in layer.algorithms("backward"):
        grads = {k: np.full_like(v, np.nan) for k, v in params.items()}
        ctx = Context(np, workspace=np.zeros(algo.workspace, np.uint8), algo=algo.name)
        layer.backward(ctx, [x], [None], [dy], [None], params, grads)
        for k in params:
            np.testing.assert_allclose(grads[k], ref[k], atol=1e-12, err_msg=algo.name)


def test_im2col_paths_are_all_tested():
    """The cases above reach both ways im2col takes the data gradient: a convolution of dy
    (stride 1, same size), or the columns' gradient scattered back (a stride, a pad past the
    kernel, a change of size or channels)."""
    paths = set()
    for shape, cfg in CONV_CASES + random_conv_cases():
        layer, _ = build("Convolution", [shape], **cfg)
        paths.add(im2col_module._spans(layer)[1] is None)
    assert paths == {True, False}
    for case, gathered in ((8, True), (10, True), (0, False), (1, False), (2, False), (9, False)):
        layer, _ = build("Convolution", [CONV_CASES[case][0]], **CONV_CASES[case][1])
        assert (im2col_module._spans(layer)[1] is not None) == gathered, case


@pytest.mark.parametrize("case", [0, 2, 8, 9, 10])
def test_im2col_workspace_declared_exactly(case):
    shape, cfg = CONV_CASES[case]
    layer, params = build("Convolution", [shape], **cfg)
    assert_workspace_exact(layer, np.random.default_rng(0).standard_normal(shape), params)


def run_at_threads(layer, params, algorithms, counts, shape):
    """Every output of ``layer``'s ``algorithms`` (forward with backward), at each thread count."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(layer.top_shapes[0]).astype(np.float32)
    before, results = parallel.threads(), []
    try:
        for count in counts:
            parallel.set_threads(count)
            out = []
            for f_algo, b_algo in algorithms:
                y = forward(layer, [x], params, algo=f_algo)[0]
                bg, pg = backward(layer, [x], [y], [dy], params, algo=b_algo)
                out += [y, bg[0], *pg.values()]
            results.append(out)
    finally:
        parallel.set_threads(before)
    return results


@pytest.mark.parametrize("type_name", ["Convolution", "Deconvolution"])
@pytest.mark.parametrize("case", [0, 1, 8, 10])
def test_conv_threads_agree(monkeypatch, type_name, case):
    """Copies and GEMMs split over two threads (every split forced) give what one thread gives,
    to float32 rounding (a GEMM split by columns may sum in another order)."""
    shape, cfg = CONV_CASES[case]
    layer, params = build(type_name, [shape], np.float32, **cfg)
    monkeypatch.setattr(parallel, "MIN_CHUNK", 1)
    algos = list(zip(layer.algorithms("forward"), layer.algorithms("backward")))
    one, two = run_at_threads(layer, params, algos, (1, 2), shape)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(a).max())


@pytest.mark.parametrize("type_name", ["Convolution", "Deconvolution"])
@pytest.mark.parametrize("case", [0, 1, 8, 10])
def test_im2col_chunks_give_the_same_bits_on_any_thread_count(type_name, case):
    """With the batch in chunks, im2col's every product, the weight gradient's sum included,
    is the same bit for bit on one, two or three threads: each chunk's work and the order of
    the sums are fixed by the shapes alone."""
    shape, cfg = CONV_CASES[case]
    shape = (16,) + shape[1:]
    layer, params = build(type_name, [shape], np.float32, **cfg)
    algos = [(f, b) for f, b in zip(layer.algorithms("forward"), layer.algorithms("backward"))
             if f.name == "im2col"]
    for outputs in ({"y"}, {"dw", "dx"}):
        plan = im2col_module.chunking(layer, outputs, np)
        assert plan is not None and plan[1] > 1, (outputs, plan)
    one, two, three = run_at_threads(layer, params, algos, (1, 2, 3), shape)
    for a, b, c in zip(one, two, three, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("case", [0, 1, 3, 5, 8, 10])
def test_conv_gradient_over_its_bottom_in_chunks(case):
    """A convolution's bottom gradient written over its bottom (the in-place pass does so where
    nothing after the backward reads the bottom) gives the same bits under every algorithm,
    im2col's chunks of samples on several threads included: each sample's bottom is read
    before its gradient is written."""
    shape, cfg = CONV_CASES[case]
    shape = (16,) + shape[1:]
    layer, params = build("Convolution", [shape], np.float32, **cfg)
    assert layer.grad_over_bottom() == [0]
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    assert im2col_module.chunking(layer, {"dw", "dx"}, np) is not None
    check_grad_inplace(layer, [x], params)


def test_deconv_keeps_its_bottom_apart_from_its_gradient():
    layer, _ = build("Deconvolution", [CONV_CASES[0][0]], **CONV_CASES[0][1])
    assert layer.grad_over_bottom() == []


@pytest.mark.parametrize("kernel", [3, 1])
def test_conv_allocates_nothing_big(kernel):
    shape = (8, 16, 64, 64)  # 2 MiB of float32
    layer, params = build("Convolution", [shape], np.float32, num_output=16, kernel_size=kernel,
                          pad=kernel // 2)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for algo in [a.name for a in layer.algorithms("forward")]:
        assert peak_allocation(only(layer, algo), [x], params) < 256 * KIB, algo


def test_conv_declarations_and_cost():
    layer, params = build("Convolution", [(2, 4, 9, 8)], num_output=6, kernel_size=[3, 2],
                          stride=2, pad=1, group=2)
    assert layer.top_shapes == [(2, 6, 5, 5)]  # (9+2-3)//2+1, (8+2-2)//2+1
    specs = {p.name: p for p in layer.param_specs()}
    assert specs["weight"].shape == (6, 2, 3, 2) and specs["weight"].fan_in == 2 * 3 * 2
    assert specs["bias"].shape == (6,)
    assert layer.backward_reads() == ((0,), ()) and not layer.INPLACE and not layer.CHEAP
    cost = layer.cost()
    assert cost.fwd_flops == 2 * 2 * 6 * 5 * 5 * 2 * 3 * 2 and cost.bwd_flops == 2 * cost.fwd_flops
    no_bias, _ = build("Convolution", [(2, 4, 9, 8)], num_output=6, kernel_size=3, bias_term=False)
    assert [p.name for p in no_bias.param_specs()] == ["weight"]


@pytest.mark.parametrize("shape,cfg,message", [
    ((2, 6, 8, 8), dict(num_output=4, kernel_size=3, group=4),
     "6 input channels are not divisible by group 4"),
    ((2, 6, 8, 8), dict(num_output=4, kernel_size=3, group=3), "num_output 4 is not divisible by group 3"),
    ((2, 3, 2, 2), dict(num_output=4, kernel_size=3),
     r"input 2x2 \(pad \[0, 0\]\) is smaller than the kernel's extent 3x3"),
    ((2, 3, 4, 4), dict(num_output=4, kernel_size=3, dilation=2), "smaller than the kernel's extent 5x5"),
    ((2, 3, 8), dict(num_output=4, kernel_size=3), r"expects a 4-D bottom"),
])
def test_conv_errors(shape, cfg, message):
    with raises_one_line(LayerError, match=message):
        build("Convolution", [shape], **cfg)


# -- Pooling -----------------------------------------------------------------------------------

POOL_CASES = [
    ((2, 3, 6, 6), dict(kernel_size=3, stride=2)),          # ceil: the last window hangs over
    ((2, 3, 7, 7), dict(kernel_size=3, stride=2, pad=1)),
    ((2, 2, 5, 5), dict(kernel_size=2, stride=2, pad=1)),   # a window of padding only is dropped
    ((2, 3, 7, 6), dict(kernel_size=[3, 2], stride=[2, 1], pad=[1, 0])),
    ((2, 2, 5, 5), dict(kernel_size=2)),                    # overlapping windows
    ((2, 3, 5, 4), dict(global_pooling=True)),
    ((2, 3, 8, 6), dict(kernel_size=2, stride=2)),          # windows tiling the image
    ((2, 2, 6, 6), dict(kernel_size=[2, 3], stride=[2, 3])),
]


def torch_pool(layer):
    ceil = layer.cfg["ceil_mode"]
    if layer.cfg["pool"] == "MAX":
        return lambda x: F.max_pool2d(x, layer.kernel, layer.stride, layer.pad, ceil_mode=ceil)
    return lambda x: F.avg_pool2d(x, layer.kernel, layer.stride, layer.pad, ceil_mode=ceil,
                                  count_include_pad=True)


@pytest.mark.parametrize("pool", ["MAX", "AVE"])
@pytest.mark.parametrize("shape,cfg", POOL_CASES)
def test_pool_gradients_and_torch(pool, shape, cfg):
    layer, params = build("Pooling", [shape], pool=pool, **cfg)
    rng = np.random.default_rng(0)
    gradcheck(layer, [rng.standard_normal(shape)], params)
    # Small integers make ties in MAX windows: the gradient goes to the first, as in PyTorch.
    x = rng.integers(-2, 3, shape).astype(np.float64)
    dy = rng.standard_normal(layer.top_shapes[0])
    y, dx, _ = torch_grads(torch_pool(layer), x, {}, dy)
    assert y.shape == layer.top_shapes[0]
    np.testing.assert_allclose(forward(layer, [x], params)[0], y, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(backward(layer, [x], [y], [dy], params)[0][0], dx, rtol=1e-14, atol=1e-14)


def test_pool_caffe_rounding_by_hand():
    # H=W=4, k=3, s=2, p=1: Ho = ceil((4+2-3)/2)+1 = 3. Windows start at -1, 1, 3 and end at
    # min(start+3, H+p=5) = 2, 4, 5, so Caffe divides by 3, 3, 2 along each axis while the image
    # rows they cover number 2, 3, 1: on ones the output is the outer product of [2/3, 1, 1/2].
    layer, _ = build("Pooling", [(1, 1, 4, 4)], pool="AVE", kernel_size=3, stride=2, pad=1)
    ratio = np.array([2 / 3, 1, 1 / 2])
    np.testing.assert_allclose(forward(layer, [np.ones((1, 1, 4, 4))], {})[0][0, 0],
                               np.outer(ratio, ratio), rtol=1e-15)
    # H=5, k=2, s=2, p=1: ceil((5+2-2)/2)+1 = 4, but the 4th window would start at 6-1 = 5 = H,
    # all padding, so Caffe drops it: Ho = 3. Windows -1..0, 1..2, 3..4 divide by 2, 2, 2 and
    # see 1, 2, 2 pixels: on ones, the outer product of [1/2, 1, 1].
    layer, _ = build("Pooling", [(1, 1, 5, 5)], pool="AVE", kernel_size=2, stride=2, pad=1)
    assert layer.top_shapes == [(1, 1, 3, 3)]
    ratio = np.array([1 / 2, 1, 1])
    np.testing.assert_allclose(forward(layer, [np.ones((1, 1, 5, 5))], {})[0][0, 0],
                               np.outer(ratio, ratio), rtol=1e-15)
    # H=6, k=3, s=2, no pad: Ho = ceil(3/2)+1 = 3 (floor would give 2). On x[r, c] = 6r + c the
    # last window sees rows and cols 4..5 and divides by min(4+3, 6) - 4 = 2 per axis:
    # mean(28, 29, 34, 35) = 31.5, max 35; the first sees 0..2, mean 6+1 = 7, max 6*2+2 = 14.
    x = np.arange(36.0).reshape(1, 1, 6, 6)
    for pool, first, last in (("AVE", 7.0, 31.5), ("MAX", 14.0, 35.0)):
        layer, _ = build("Pooling", [x.shape], pool=pool, kernel_size=3, stride=2)
        y = forward(layer, [x], {})[0]
        assert y.shape == (1, 1, 3, 3) and y[0, 0, 0, 0] == first and y[0, 0, 2, 2] == last


def test_pool_max_ignores_padding():
    x = -1 - np.random.default_rng(0).random((1, 2, 5, 5))
    layer, _ = build("Pooling", [x.shape], pool="MAX", kernel_size=3, stride=2, pad=1)
    y = forward(layer, [x], {})[0]
    np.testing.assert_array_equal(y[:, :, 0, 0], x[:, :, :2, :2].max(axis=(2, 3)))
    assert (y < -1).all()


@pytest.mark.parametrize("pool,reduce", [("MAX", np.max), ("AVE", np.mean)])
def test_pool_global(pool, reduce):
    x = np.random.default_rng(0).standard_normal((2, 3, 5, 4))
    layer, _ = build("Pooling", [x.shape], pool=pool, global_pooling=True)
    assert layer.top_shapes == [(2, 3, 1, 1)]
    np.testing.assert_allclose(forward(layer, [x], {})[0], reduce(x, axis=(2, 3), keepdims=True),
                               rtol=1e-14)


def test_pool_declarations():
    mx, _ = build("Pooling", [(2, 3, 8, 8)], pool="MAX", kernel_size=2, stride=2)
    ave, _ = build("Pooling", [(2, 3, 8, 8)], pool="AVE", kernel_size=2, stride=2)
    assert mx.backward_reads() == ((0,), (0,)) and ave.backward_reads() == ((), ())
    assert mx.CHEAP and ave.CHEAP and not mx.INPLACE
    assert mx.param_specs() == [] and mx.algorithms("forward")[0].workspace == 0
    for layer in (mx, ave):
        x = np.random.default_rng(0).standard_normal((2, 3, 8, 8))
        assert_workspace_exact(layer, x, {})


@pytest.mark.parametrize("pool", ["MAX", "AVE"])
def test_pool_allocates_nothing_big(pool):
    shape = (8, 16, 64, 64)
    layer, _ = build("Pooling", [shape], np.float32, pool=pool, kernel_size=3, stride=2, pad=1)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    assert peak_allocation(layer, [x], {}) < 256 * KIB


@pytest.mark.parametrize("shape,cfg,message", [
    ((1, 1, 2, 2), dict(kernel_size=3), r"input 2x2 \(pad \[0, 0\]\) is smaller than the 3x3 window"),
    ((1, 1, 8, 8), dict(kernel_size=2, pad=2), r"pad \[2, 2\] must be smaller than kernel_size"),
    ((1, 1, 8, 8), dict(), "missing kernel_size"),
    ((1, 1, 8, 8), dict(global_pooling=True, kernel_size=2), "drop kernel_size"),
    ((1, 1, 8, 8), dict(global_pooling=True, stride=2), "global_pooling needs stride 1 and pad 0"),
])
def test_pool_errors(shape, cfg, message):
    with raises_one_line(LayerError, match=message):
        build("Pooling", [shape], **cfg)


# -- InnerProduct ------------------------------------------------------------------------------

IP_CASES = [
    ((3, 4, 2, 2), dict(num_output=5)),
    ((2, 3, 4), dict(num_output=5, axis=2)),
    ((2, 3, 4), dict(num_output=2, axis=-2)),
    ((4, 6), dict(num_output=3, bias_term=False)),
    ((2, 3), dict(num_output=4, axis=0)),
]


@pytest.mark.parametrize("shape,cfg", IP_CASES)
def test_inner_product_gradients_and_torch(shape, cfg):
    layer, params = build("InnerProduct", [shape], **cfg)
    x = np.random.default_rng(0).standard_normal(shape)
    gradcheck(layer, [x], params)
    axis = cfg.get("axis", 1) % len(shape)
    assert layer.top_shapes == [shape[:axis] + (cfg["num_output"],)]
    dy = np.random.default_rng(1).standard_normal(layer.top_shapes[0])

    def linear(x, weight, bias=None):
        return F.linear(x.reshape(*shape[:axis], -1), weight, bias)
    y, dx, dp = torch_grads(linear, x, params, dy)
    np.testing.assert_allclose(forward(layer, [x], params)[0], y, atol=1e-12)
    bg, pg = backward(layer, [x], [y], [dy], params)
    np.testing.assert_allclose(bg[0], dx, atol=1e-12)
    for k in params:
        np.testing.assert_allclose(pg[k], dp[k], atol=1e-12)


def test_inner_product_declarations_and_memory():
    shape = (64, 32, 16, 16)  # 2 MiB of float32
    layer, params = build("InnerProduct", [shape], np.float32, num_output=10)
    specs = {p.name: p for p in layer.param_specs()}
    assert specs["weight"].shape == (10, 32 * 16 * 16) and specs["weight"].fan_in == 32 * 16 * 16
    assert layer.backward_reads() == ((0,), ()) and not layer.CHEAP and not layer.INPLACE
    assert layer.cost().fwd_flops == 2 * 64 * 32 * 16 * 16 * 10
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    assert peak_allocation(layer, [x], params) < 256 * KIB


def test_inner_product_bad_axis():
    with raises_one_line(LayerError, match=r"axis 3 is out of range for the 3-D bottom \(2, 3, 4\)"):
        build("InnerProduct", [(2, 3, 4)], num_output=2, axis=3)


# im2col with the batch in chunks (16 samples: several chunks, several slots) and with the
# whole batch at once (weights too large beside the columns for the slots' sums and the
# weight in rows order)
CHUNKED = [((16,) + CONV_CASES[i][0][1:], CONV_CASES[i][1]) for i in (0, 1, 2, 3, 5, 6, 8, 9, 10)]
WHOLE = [((2, 16, 3, 3), dict(num_output=32, kernel_size=3, pad=1)),
         ((2, 16, 4, 4), dict(num_output=32, kernel_size=3, stride=2, pad=1))]


@pytest.mark.parametrize("shape,cfg,chunked", [c + (True,) for c in CHUNKED] + [c + (False,) for c in WHOLE])
def test_im2col_in_chunks_and_whole_against_torch(shape, cfg, chunked):
    layer, params = build("Convolution", [shape], **cfg)
    assert (im2col_module.chunking(layer, {"y"}, np) is not None) == chunked
    assert (im2col_module.chunking(layer, {"dw", "dx"}, np) is not None) == chunked
    x = np.random.default_rng(1).standard_normal(shape)
    dy = np.random.default_rng(2).standard_normal(layer.top_shapes[0])
    y, dx, dp = torch_grads(torch_conv(layer), x, params, dy)
    forward_algo, backward_algo = layer.algorithms("forward")[0], layer.algorithms("backward")[0]
    assert forward_algo.name == backward_algo.name == "im2col"
    np.testing.assert_allclose(forward(layer, [x], params, algo=forward_algo)[0], y, atol=1e-12)
    bg, pg = backward(layer, [x], [y], [dy], params, algo=backward_algo)
    np.testing.assert_allclose(bg[0], dx, atol=1e-12)
    for k in params:
        np.testing.assert_allclose(pg[k], dp[k], atol=1e-12, err_msg=k)
    # the first convolution of a net: dw alone
    grads = {k: np.full_like(v, np.nan) for k, v in params.items()}
    ctx = Context(np, workspace=np.zeros(backward_algo.workspace, np.uint8), algo="im2col")
    layer.backward(ctx, [x], [None], [dy], [None], params, grads)
    for k in params:
        np.testing.assert_allclose(grads[k], dp[k], atol=1e-12, err_msg=f"dw alone {k}")
    assert_workspace_exact(layer, x, params)


# -- depthwise (every channel its own group: MobileNet's) ----------------------------------------

DEPTHWISE_CASES = [
    ((2, 4, 9, 8), dict(num_output=4, group=4, kernel_size=3, pad=1)),
    ((2, 5, 11, 9), dict(num_output=5, group=5, kernel_size=[3, 5], stride=[2, 1], pad=[1, 0], dilation=[1, 2])),
    ((1, 3, 4, 4), dict(num_output=3, group=3, kernel_size=3, dilation=3, pad=3, bias_term=False)),
]


@pytest.mark.parametrize("shape,cfg", DEPTHWISE_CASES)
def test_depthwise_is_offered_first_and_agrees_with_torch_and_finite_differences(shape, cfg):
    layer, params = build("Convolution", [shape], **cfg)
    assert layer.algorithms("forward")[0].name == layer.algorithms("backward")[0].name == "depthwise"
    x = np.random.default_rng(3).standard_normal(shape)
    gradcheck(layer, [x], params)  # and every other algorithm agrees with it
    stride, pad = cfg.get("stride", 1), cfg.get("pad", 0)
    dil = cfg.get("dilation", 1)
    dy = np.random.default_rng(4).standard_normal(layer.top_shapes[0])

    def fn(x, weight, bias=None):
        return F.conv2d(x, weight, bias, stride, pad, dil, groups=shape[1])

    y, dx, dp = torch_grads(fn, x, params, dy)
    (ours,) = forward(layer, [x], params)
    (dx_ours,), dp_ours = backward(layer, [x], [ours], [dy], params)
    np.testing.assert_allclose(ours, y, atol=1e-12)
    np.testing.assert_allclose(dx_ours, dx, atol=1e-12)
    for k in params:
        np.testing.assert_allclose(dp_ours[k], dp[k], atol=1e-12)
    assert_workspace_exact(layer, x, params)


def test_depthwise_needs_one_map_of_workspace_where_im2col_needs_the_batchs_columns():
    layer, _ = build("Convolution", [(8, 16, 14, 14)], dtype=np.float32, num_output=16, group=16, kernel_size=3,
                     pad=1)
    work = {a.name: a.workspace for a in layer.algorithms("forward")}
    assert work["depthwise"] == 16 * 14 * 14 * 4 and work["im2col"] >= 9 * work["depthwise"]


def test_depthwise_is_not_offered_for_other_groupings():
    for cfg in (dict(num_output=8, group=4), dict(num_output=4, group=2), dict(num_output=4, group=4, kernel_size=1)):
        layer, _ = build("Convolution", [(1, 4, 6, 6)], **{"kernel_size": 3, **cfg})
        assert "depthwise" not in [a.name for a in layer.algorithms("forward")]
