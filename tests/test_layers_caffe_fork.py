"""Fork layers (layers/caffe_fork.py): Interp against PyTorch's bilinear resizing with aligned
corners, Normalize against autograd, Upsample with a MAX Pooling's mask against PyTorch's
max_unpool2d; float64 finite-difference gradients; errors."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from layer_harness import backward, build, forward, gradcheck
from one_line import raises_one_line

from superneuron.errors import LayerError


@pytest.mark.parametrize("cfg, shapes, out", [
    (dict(height=9, width=13), [(2, 3, 5, 7)], (9, 13)),
    (dict(zoom_factor=4), [(2, 3, 5, 7)], (17, 25)),
    (dict(shrink_factor=2), [(2, 3, 5, 7)], (3, 4)),
    ({}, [(2, 3, 5, 7), (1, 1, 8, 6)], (8, 6)),
])
def test_interp_is_bilinear_with_aligned_corners(rng, cfg, shapes, out):
    layer, params = build("Interp", shapes, **cfg)
    assert layer.top_shapes[0] == (2, 3) + out
    x = rng.standard_normal(shapes[0])
    bottoms = [x] + [np.zeros(s) for s in shapes[1:]]
    (y,) = forward(layer, bottoms, params)
    tx = torch.tensor(x, requires_grad=True)
    ty = F.interpolate(tx, size=out, mode="bilinear", align_corners=True)
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-13)
    dy = rng.standard_normal(y.shape)
    ty.backward(torch.tensor(dy))
    (dx, *_), _ = backward(layer, bottoms, [y], [dy], params)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-12, atol=1e-13)


def test_interp_crops_with_negative_pads(rng):
    layer, params = build("Interp", [(1, 2, 7, 7)], height=5, width=5, pad_beg=-1, pad_end=-1)
    x = rng.standard_normal((1, 2, 7, 7))
    (y,) = forward(layer, [x], params)
    want = F.interpolate(torch.tensor(x[:, :, 1:6, 1:6]), size=(5, 5), mode="bilinear", align_corners=True)
    np.testing.assert_allclose(y, want.numpy(), rtol=1e-12)
    gradcheck(layer, [x], params)


@pytest.mark.parametrize("cfg", [{}, dict(across_spatial=False), dict(channel_shared=False),
                                 dict(across_spatial=False, channel_shared=False)])
def test_normalize_matches_autograd(rng, cfg):
    layer, params = build("Normalize", [(2, 3, 4, 5)], **cfg)
    x = rng.standard_normal((2, 3, 4, 5))
    gradcheck(layer, [x], params)
    (y,) = forward(layer, [x], params)
    tx, ts = torch.tensor(x, requires_grad=True), torch.tensor(params["scale"], requires_grad=True)
    dims = (1, 2, 3) if cfg.get("across_spatial", True) else (1,)
    ty = tx / (tx.pow(2).sum(dims, keepdim=True) + 1e-10).sqrt() * ts.reshape(1, -1, 1, 1)
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12)
    dy = rng.standard_normal(y.shape)
    ty.backward(torch.tensor(dy))
    (dx,), pg = backward(layer, [x], [y], [dy], params)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(pg["scale"], ts.grad.numpy(), rtol=1e-10)


def test_pooling_mask_and_upsample_are_max_unpool(rng):
    pool, pparams = build("Pooling", [(2, 3, 8, 6)], n_tops=2, pool="MAX", kernel_size=2, stride=2)
    x = rng.standard_normal((2, 3, 8, 6))
    top, mask = forward(pool, [x], pparams)
    tp, ti = F.max_pool2d(torch.tensor(x), 2, 2, return_indices=True)
    np.testing.assert_array_equal(top, tp.numpy())
    np.testing.assert_array_equal(mask, ti.numpy())  # PyTorch's indices are Caffe's h * W + w
    up, uparams = build("Upsample", [(2, 3, 4, 3), (2, 3, 4, 3)], scale=2)
    (y,) = forward(up, [top, mask], uparams)
    np.testing.assert_array_equal(y, F.max_unpool2d(tp, ti, 2, 2, output_size=(8, 6)).numpy())
    gradcheck(up, [top, mask], uparams)


def test_pooling_mask_with_padding_and_odd_sizes(rng):
    pool, pparams = build("Pooling", [(1, 2, 7, 7)], n_tops=2, pool="MAX", kernel_size=3, stride=2, pad=1)
    x = rng.standard_normal((1, 2, 7, 7))
    top, mask = forward(pool, [x], pparams)
    tp, ti = F.max_pool2d(torch.tensor(x), 3, 2, 1, return_indices=True, ceil_mode=True)
    np.testing.assert_array_equal(top, tp.numpy())
    np.testing.assert_array_equal(mask, ti.numpy())


@pytest.mark.parametrize("name, shapes, cfg, message", [
    ("Interp", [(2, 3, 5, 7)], {}, "give height and width, zoom_factor, shrink_factor"),
    ("Interp", [(2, 3, 5, 7)], dict(height=4, width=4, pad_beg=1), "pad_beg and pad_end crop the input"),
    ("Upsample", [(2, 3, 4, 4), (2, 3, 4, 5)], {}, "a mask of its shape"),
    ("Normalize", [(6,)], {}, "at least 2 dims"),
])
def test_errors(name, shapes, cfg, message):
    with raises_one_line(LayerError, match=message):
        build(name, shapes, **cfg)


def test_ave_pooling_has_no_mask():
    with raises_one_line(LayerError, match="a second top \\(the mask\\) is MAX pooling's only"):
        build("Pooling", [(1, 2, 4, 4)], n_tops=2, pool="AVE", kernel_size=2, stride=2)
