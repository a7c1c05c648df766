"""What Caffe model-zoo files write beyond the basics: non-square windows (``kernel_h``,
``pad_w``, ...) for Convolution and Pooling, Pooling's ``ceil_mode``, LRN WITHIN_CHANNEL, and a
whole net of them (with a Deconvolution) against PyTorch. Expected values come from torch with
the window written out by hand, so a wrong reading of the keys fails."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from layer_harness import backward, build, forward, gradcheck, peak_allocation, torch_grads
from one_line import raises_one_line
from torch_ref import lrn_within_channel, run_torch

from superneuron import load_net
from superneuron.errors import LayerError, SpecError

# (bottom, keys, torch's stride, padding, dilation, groups)
CONV_CASES = [
    ((2, 3, 7, 9), dict(num_output=4, kernel_h=3, kernel_w=1, pad_h=1, pad_w=0), (1, 1), (1, 0), 1, 1),
    ((2, 4, 9, 8), dict(num_output=4, kernel_h=1, kernel_w=5, stride_h=2, stride_w=3, pad=[0, 2], group=2),
     (2, 3), (0, 2), 1, 2),
    ((1, 2, 8, 7), dict(num_output=3, kernel_size=[2, 3], stride_h=3, stride_w=1, pad_h=1, pad_w=2,
                        dilation=[2, 1]), (3, 1), (1, 2), (2, 1), 1),
    ((2, 2, 5, 6), dict(num_output=2, kernel_h=1, kernel_w=1, stride_h=1, stride_w=2), (1, 2), 0, 1, 1),
]


@pytest.mark.parametrize("shape,cfg,stride,pad,dilation,groups", CONV_CASES)
def test_nonsquare_convolution_gradients_and_torch(shape, cfg, stride, pad, dilation, groups):
    layer, params = build("Convolution", [shape], **cfg)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    gradcheck(layer, [x], params)  # and every algorithm agrees
    dy = rng.standard_normal(layer.top_shapes[0])
    y, dx, dp = torch_grads(lambda x, weight, bias: F.conv2d(x, weight, bias, stride, pad, dilation, groups),
                            x, params, dy)
    np.testing.assert_allclose(forward(layer, [x], params)[0], y, atol=1e-12)
    bg, pg = backward(layer, [x], [y], [dy], params)
    np.testing.assert_allclose(bg[0], dx, atol=1e-12)
    for k in params:
        np.testing.assert_allclose(pg[k], dp[k], atol=1e-12, err_msg=k)


# (bottom, keys, torch's kernel, stride, padding)
POOL_CASES = [
    ((2, 2, 7, 9), dict(kernel_h=3, kernel_w=2, stride_h=2, stride_w=3, pad_h=1, pad_w=0), (3, 2), (2, 3), (1, 0)),
    ((1, 3, 6, 5), dict(kernel_h=2, kernel_w=4, stride=[2, 1]), (2, 4), (2, 1), 0),
    ((2, 2, 8, 7), dict(kernel_size=3, stride_h=2, stride_w=2, pad_h=1, pad_w=1, ceil_mode=False), 3, 2, 1),
    ((2, 2, 8, 7), dict(kernel_h=2, kernel_w=3, stride=[3, 2], ceil_mode=False), (2, 3), (3, 2), 0),
]


@pytest.mark.parametrize("pool", ["MAX", "AVE"])
@pytest.mark.parametrize("shape,cfg,kernel,stride,pad", POOL_CASES)
def test_nonsquare_pooling_gradients_and_torch(pool, shape, cfg, kernel, stride, pad):
    layer, params = build("Pooling", [shape], pool=pool, **cfg)
    rng = np.random.default_rng(0)
    gradcheck(layer, [rng.standard_normal(shape)], params)
    ceil = cfg.get("ceil_mode", True)
    if pool == "MAX":
        def fn(x):
            return F.max_pool2d(x, kernel, stride, pad, ceil_mode=ceil)
    else:
        def fn(x):
            return F.avg_pool2d(x, kernel, stride, pad, ceil_mode=ceil, count_include_pad=True)
    x = rng.integers(-2, 3, shape).astype(np.float64)  # ties: the first maximum takes the gradient
    dy = rng.standard_normal(layer.top_shapes[0])
    y, dx, _ = torch_grads(fn, x, {}, dy)
    np.testing.assert_allclose(forward(layer, [x], params)[0], y, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(backward(layer, [x], [y], [dy], params)[0][0], dx, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("pool", ["MAX", "AVE"])
def test_pooling_ceil_mode_false_rounds_down(pool):
    # H=W=6, k=3, s=2: Caffe's ceil gives 3 windows per axis, the last hanging over; floor gives
    # the first 2 of them, unchanged
    x = np.random.default_rng(0).standard_normal((1, 2, 6, 6))
    ceil, _ = build("Pooling", [x.shape], pool=pool, kernel_size=3, stride=2)
    floor, _ = build("Pooling", [x.shape], pool=pool, kernel_size=3, stride=2, ceil_mode=False)
    assert ceil.top_shapes == [(1, 2, 3, 3)] and floor.top_shapes == [(1, 2, 2, 2)]
    np.testing.assert_array_equal(forward(floor, [x], {})[0], forward(ceil, [x], {})[0][..., :2, :2])


@pytest.mark.parametrize("type_name,cfg,message", [
    ("Convolution", dict(num_output=2, kernel_size=3, kernel_h=3, kernel_w=3),
     r"kernel_size and kernel_h/kernel_w are two spellings of one setting; write either "
     r"kernel_size: \[3, 3\] or kernel_h: 3 and kernel_w: 3"),
    ("Convolution", dict(num_output=2, kernel_h=3), r"kernel_h needs kernel_w too \(or write kernel_size: \[h, w\]\)"),
    ("Convolution", dict(num_output=2, kernel_w=3), "kernel_w needs kernel_h too"),
    ("Convolution", dict(num_output=2, kernel_size=3, pad=1, pad_h=1, pad_w=0),
     r"write either pad: \[1, 0\] or pad_h: 1 and pad_w: 0"),
    ("Convolution", dict(num_output=2, kernel_size=3, stride_w=2), "stride_w needs stride_h too"),
    ("Convolution", dict(num_output=2), r"missing kernel_size \(or kernel_h and kernel_w\)"),
    ("Deconvolution", dict(num_output=2, kernel_size=2, stride=2, stride_h=1, stride_w=1),
     "stride and stride_h/stride_w are two spellings"),
    ("Pooling", dict(kernel_h=2), "kernel_h needs kernel_w too"),
    ("Pooling", dict(kernel_size=2, kernel_h=2, kernel_w=2), "two spellings"),
    ("Pooling", dict(kernel_size=3, pad_h=1), "pad_h needs pad_w too"),
    ("Pooling", dict(), r"missing kernel_size \(or kernel_h and kernel_w, or global_pooling: true\)"),
    ("Pooling", dict(global_pooling=True, kernel_h=2, kernel_w=2), "global_pooling takes its window"),
    ("Pooling", dict(global_pooling=True, stride_h=2, stride_w=1), "global_pooling needs stride 1"),
    ("Pooling", dict(kernel_h=3, kernel_w=2, pad_h=0, pad_w=2),
     r"pad \[0, 2\] must be smaller than kernel_size \[3, 2\]"),
])
def test_window_key_errors(type_name, cfg, message):
    with raises_one_line(LayerError, match=message):
        build(type_name, [(1, 2, 8, 8)], **cfg)


# -- LRN WITHIN_CHANNEL ------------------------------------------------------------------------

@pytest.mark.parametrize("shape,size,alpha,beta", [
    ((2, 3, 5, 4), 3, 1.5, 0.75),
    ((1, 2, 3, 6), 5, 2.0, 0.6),   # the window is taller than the map
    ((2, 2, 3, 3), 1, 0.5, 1.0),
])
def test_lrn_within_channel_gradients_and_torch(shape, size, alpha, beta):
    layer, params = build("LRN", [shape], norm_region="WITHIN_CHANNEL", local_size=size, alpha=alpha,
                          beta=beta)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    gradcheck(layer, [x], params)
    dy = rng.standard_normal(shape)
    y, dx, _ = torch_grads(lambda t: lrn_within_channel(t, size, alpha, beta), x, {}, dy)
    np.testing.assert_allclose(forward(layer, [x], params)[0], y, rtol=1e-12)
    np.testing.assert_allclose(backward(layer, [x], [y], [dy], params)[0][0], dx, rtol=1e-10, atol=1e-13)


def test_lrn_within_channel_by_hand_and_k_ignored():
    # ones on a 3x3 map, n=3, alpha=9, beta=1: the centre's window holds 9 ones, so
    # y = 1 / (1 + 9/9 * 9) = 1/10; an edge's 6 give 1/7, a corner's 4 give 1/5.
    # Caffe's WITHIN_CHANNEL has no k (its power layer shifts by 1): k=7 changes nothing.
    x = np.ones((1, 1, 3, 3))
    want = np.array([[1 / 5, 1 / 7, 1 / 5], [1 / 7, 1 / 10, 1 / 7], [1 / 5, 1 / 7, 1 / 5]])
    for k in (1.0, 7.0):
        layer, params = build("LRN", [x.shape], norm_region="WITHIN_CHANNEL", local_size=3, alpha=9.0,
                              beta=1.0, k=k)
        np.testing.assert_allclose(forward(layer, [x], params)[0][0, 0], want, rtol=1e-15)
    across, params = build("LRN", [x.shape], local_size=3, alpha=9.0, beta=1.0)  # still the default
    np.testing.assert_allclose(forward(across, [x], params)[0], np.full(x.shape, 1 / 4), rtol=1e-15)


def test_lrn_within_channel_errors_and_memory():
    with raises_one_line(LayerError, match=r"needs a 4-D bottom \(N, C, H, W\) within a channel"):
        build("LRN", [(2, 3, 4)], norm_region="WITHIN_CHANNEL")
    with raises_one_line(LayerError, match="expected one of ACROSS_CHANNELS, WITHIN_CHANNEL"):
        build("LRN", [(2, 3, 4, 4)], norm_region="SPATIAL")
    shape = (8, 16, 64, 64)  # 2 MiB of float32: the kernels work in their declared workspace
    layer, params = build("LRN", [shape], np.float32, norm_region="WITHIN_CHANNEL", local_size=5)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    assert peak_allocation(layer, [x], params) < 256 * 1024


# -- a whole net of them -----------------------------------------------------------------------

ZOO_NET = """\
name: zoo
input: {data: [2, 3, 9, 10], label: [2]}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_h: 3, kernel_w: 1,
     pad_h: 1, pad_w: 0, stride_h: 1, stride_w: 2}
  - {name: norm1, type: LRN, bottom: conv1, top: norm1, norm_region: WITHIN_CHANNEL, local_size: 3,
     alpha: 0.5, beta: 0.75}
  - {name: pool1, type: Pooling, bottom: norm1, top: pool1, pool: MAX, kernel_h: 3, kernel_w: 2,
     stride_h: 2, stride_w: 1}
  - {name: up, type: Deconvolution, bottom: pool1, top: up, num_output: 4, kernel_size: 4, stride: 2,
     pad: 1, group: 2}
  - {name: pool2, type: Pooling, bottom: up, top: pool2, pool: AVE, kernel_size: 3, stride: 2, ceil_mode: false}
  - {name: fc, type: InnerProduct, bottom: pool2, top: fc, num_output: 5}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
"""


def test_zoo_net_matches_pytorch(tmp_path):
    path = tmp_path / "zoo.yaml"
    path.write_text(ZOO_NET)
    net = load_net(str(path))
    # conv1 9x(10-1)/2+1 = 9x5; pool1 ceil: 4x4; up: 2*3+4-2 = 8; pool2 floor: (8-3)//2+1 = 3
    shapes = {n: net.graph.tensors[n].shape for n in ("conv1", "pool1", "up", "pool2")}
    assert shapes == {"conv1": (2, 4, 9, 5), "pool1": (2, 4, 4, 4), "up": (2, 4, 8, 8), "pool2": (2, 4, 3, 3)}
    rng = np.random.default_rng(0)
    feed = {"data": rng.standard_normal((2, 3, 9, 10)).astype(np.float32),
            "label": np.array([1.0, 3.0], dtype=np.float32)}
    loss = net.forward_backward(feed)
    ref_loss, ref_grads, _ = run_torch(net, feed, dtype=torch.float64)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert set(ref_grads) == set(net.learnable_names) and "up/weight" in ref_grads
    for name, r in ref_grads.items():
        np.testing.assert_allclose(net.grad(name), r, rtol=0, atol=1e-4 * max(np.abs(r).max(), 1e-3),
                                   err_msg=name)


def test_window_key_error_in_a_file_names_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(ZOO_NET.replace("kernel_h: 3, kernel_w: 1,", "kernel_h: 3,"))
    with raises_one_line(SpecError) as e:
        load_net(str(path))
    assert f"{path}:4:" in str(e.value) and "layer 'conv1' (Convolution): kernel_h needs kernel_w too" in str(e.value)
