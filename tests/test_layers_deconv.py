"""Deconvolution: finite-difference gradients, agreement between its algorithms and with
torch's conv_transpose2d, the adjoint of Convolution, declared workspaces, memory and errors."""

import numpy as np
import pytest
import torch.nn.functional as F
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
from one_line import raises_one_line

from superneuron.errors import LayerError

DECONV_CASES = [
    ((2, 3, 4, 5), dict(num_output=4, kernel_size=3)),
    ((2, 4, 3, 4), dict(num_output=6, kernel_size=3, stride=2, pad=1)),
    ((2, 2, 3, 3), dict(num_output=2, kernel_size=3, dilation=2, pad=2)),
    ((2, 4, 3, 4), dict(num_output=6, kernel_h=3, kernel_w=2, stride_h=2, stride_w=3, pad_h=1, pad_w=0,
                        dilation=[1, 2], group=2)),
    ((1, 6, 3, 3), dict(num_output=3, kernel_size=2, stride=3, group=3, bias_term=False)),  # gaps
    ((2, 2, 4, 4), dict(num_output=4, kernel_size=4, stride=2, pad=1, group=2)),  # FCN's 2x upsampling
    ((2, 4, 4, 4), dict(num_output=3, kernel_size=1)),                            # pointwise
    ((2, 4, 3, 3), dict(num_output=2, kernel_size=1, stride=2)),
]


def torch_deconv(layer):
    return lambda x, weight, bias=None: F.conv_transpose2d(
        x, weight, bias, layer.stride, layer.pad, 0, layer.cfg["group"], layer.dilation)


@pytest.mark.parametrize("shape,cfg", DECONV_CASES)
def test_deconv_gradients_algorithms_and_torch(shape, cfg):
    layer, params = build("Deconvolution", [shape], **cfg)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape)
    gradcheck(layer, [x], params)  # also checks that every algorithm agrees
    names = [a.name for a in layer.algorithms("forward")]
    assert names == [a.name for a in layer.algorithms("backward")]
    assert names == (["im2col", "im2col_chunked"] if layer._pointwise else ["im2col", "im2col_chunked", "direct"])
    dy = rng.standard_normal(layer.top_shapes[0])
    y, dx, dp = torch_grads(torch_deconv(layer), x, params, dy)
    assert y.shape == layer.top_shapes[0]
    for name in names:
        algo = [a for a in layer.algorithms("forward") if a.name == name][0]
        np.testing.assert_allclose(forward(layer, [x], params, algo=algo)[0], y, atol=1e-12, err_msg=name)
        algo = [a for a in layer.algorithms("backward") if a.name == name][0]
        bg, pg = backward(layer, [x], [y], [dy], params, algo=algo)
        np.testing.assert_allclose(bg[0], dx, atol=1e-12, err_msg=name)
        for k in params:
            np.testing.assert_allclose(pg[k], dp[k], atol=1e-12, err_msg=f"{name} {k}")


@pytest.mark.parametrize("shape,cfg", DECONV_CASES[1:5])
def test_deconv_is_the_adjoint_of_convolution(shape, cfg):
    """<deconv(x), z> = <x, conv(z)> with the same weight and keys (and no bias)."""
    cfg = dict(cfg, bias_term=False)
    deconv, params = build("Deconvolution", [shape], **cfg)
    conv, _ = build("Convolution", [deconv.top_shapes[0]], **dict(cfg, num_output=shape[1]))
    assert conv.top_shapes == [shape]
    rng = np.random.default_rng(2)
    x, z = rng.standard_normal(shape), rng.standard_normal(deconv.top_shapes[0])
    lhs = np.sum(forward(deconv, [x], params)[0] * z)
    rhs = np.sum(x * forward(conv, [z], params)[0])
    assert lhs == pytest.approx(rhs, rel=1e-12)


@pytest.mark.parametrize("shape,cfg", DECONV_CASES[3:])
def test_deconv_workspace_declared_exactly(shape, cfg):
    layer, params = build("Deconvolution", [shape], **cfg)
    assert_workspace_exact(layer, np.random.default_rng(0).standard_normal(shape), params)


def test_deconv_declarations_and_cost():
    layer, params = build("Deconvolution", [(2, 4, 5, 6)], num_output=6, kernel_h=3, kernel_w=2,
                          stride=2, pad=1, group=2)
    assert layer.top_shapes == [(2, 6, 9, 10)]  # 2*(5-1)+3-2, 2*(6-1)+2-2
    specs = {p.name: p for p in layer.param_specs()}
    assert specs["weight"].shape == (4, 3, 3, 2)  # Caffe's (C, K/g, kh, kw)
    assert specs["weight"].fan_in == 3 * 3 * 2 and specs["weight"].fan_out == 4 * 3 * 2
    assert specs["bias"].shape == (6,)
    assert layer.backward_reads() == ((0,), ()) and not layer.INPLACE and not layer.CHEAP
    cost = layer.cost()
    assert cost.fwd_flops == 2 * 2 * 4 * 5 * 6 * 3 * 3 * 2 and cost.bwd_flops == 2 * cost.fwd_flops
    f32, _ = build("Deconvolution", [(2, 4, 5, 6)], np.float32, num_output=6, kernel_size=3)
    before = [(a.name, a.workspace) for p in ("forward", "backward") for a in f32.algorithms(p)]
    f32.kernels = object()  # a device's cuDNN: Deconvolution has no cuDNN path and ignores it
    assert [(a.name, a.workspace) for p in ("forward", "backward") for a in f32.algorithms(p)] == before


def test_deconv_allocates_nothing_big():
    shape = (4, 16, 32, 32)  # 2x upsampling to a 1 MiB float32 top
    layer, params = build("Deconvolution", [shape], np.float32, num_output=16, kernel_size=4,
                          stride=2, pad=1)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for algo in [a.name for a in layer.algorithms("forward")]:
        assert peak_allocation(only(layer, algo), [x], params) < 256 * 1024, algo


@pytest.mark.parametrize("shape,cfg,message", [
    ((1, 1, 1, 1), dict(num_output=1, kernel_size=1, pad=1), r"pad \[1, 1\] leaves no output \(-1x-1\)"),
    ((1, 3, 4, 4), dict(num_output=4, kernel_size=3, group=2), "3 input channels are not divisible by group 2"),
    ((1, 4, 4, 4), dict(num_output=3, kernel_size=3, group=2), "num_output 3 is not divisible by group 2"),
    ((1, 4, 4), dict(num_output=3, kernel_size=3), "expects a 4-D bottom"),
])
def test_deconv_errors(shape, cfg, message):
    with raises_one_line(LayerError, match=message):
        build("Deconvolution", [shape], **cfg)


@pytest.mark.parametrize("case", [0, 1, 2, 5])
def test_deconv_im2col_in_chunks_against_torch(case):
    """At 16 samples im2col goes chunk by chunk (both phases): still torch's transpose."""
    from superneuron.layers import im2col
    shape, cfg = DECONV_CASES[case]
    shape = (16,) + shape[1:]
    layer, params = build("Deconvolution", [shape], **cfg)
    assert im2col.chunking(layer, {"dx"}, np) and im2col.chunking(layer, {"y", "dw"}, np)
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal(shape), rng.standard_normal(layer.top_shapes[0])
    y, dx, dp = torch_grads(torch_deconv(layer), x, params, dy)
    np.testing.assert_allclose(forward(layer, [x], params, algo=layer.algorithms("forward")[0])[0], y, atol=1e-12)
    bg, pg = backward(layer, [x], [y], [dy], params, algo=layer.algorithms("backward")[0])
    np.testing.assert_allclose(bg[0], dx, atol=1e-12)
    for k in params:
        np.testing.assert_allclose(pg[k], dp[k], atol=1e-12, err_msg=k)
