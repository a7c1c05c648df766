"""Caffe's other losses (layers/caffe_loss.py) and SoftmaxWithLoss's normalization modes over
spatial outputs: values against PyTorch (or Caffe's formula written out in NumPy), gradients
by float64 finite differences, and errors."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from layer_harness import backward, build, forward, gradcheck
from one_line import raises_one_line

from superneuron.errors import LayerError


def _loss(layer, bottoms, params):
    (top,) = forward(layer, bottoms, params)
    return float(top)


def test_multinomial_logistic_loss(rng):
    layer, params = build("MultinomialLogisticLoss", [(5, 4), (5,)])
    p = torch.softmax(torch.tensor(rng.standard_normal((5, 4))), 1).numpy()
    labels = np.array([0, 3, 1, 1, 2], dtype=np.float64)
    want = F.nll_loss(torch.log(torch.tensor(p)), torch.tensor(labels).long()).item()
    assert np.isclose(_loss(layer, [p, labels], params), want, rtol=1e-13)
    gradcheck(layer, [p, labels], params)
    p[1, 3] = 0.0  # Caffe clamps at 1e-20: a finite loss
    picked = p[np.arange(5), labels.astype(int)]
    picked[1] = 1e-20
    assert np.isclose(_loss(layer, [p, labels], params), -np.log(picked).sum() / 5, rtol=1e-13)


@pytest.mark.parametrize("norm", ["L1", "L2"])
def test_hinge_loss_is_caffes(rng, norm):
    layer, params = build("HingeLoss", [(6, 5), (6,)], norm=norm)
    x = rng.standard_normal((6, 5))
    labels = rng.integers(0, 5, 6).astype(np.float64)
    sign = -np.ones((6, 5))
    sign[np.arange(6), labels.astype(int)] = 1
    margins = np.maximum(0, 1 - sign * x)
    want = (margins if norm == "L1" else margins ** 2).sum() / 6
    assert np.isclose(_loss(layer, [x, labels], params), want, rtol=1e-13)
    # torch's multilabel soft margins differ; MultiMarginLoss is another loss: the formula is the oracle
    gradcheck(layer, [x, labels], params)


@pytest.mark.parametrize("legacy", [False, True])
def test_contrastive_loss(rng, legacy):
    layer, params = build("ContrastiveLoss", [(6, 3), (6, 3), (6,)], margin=1.5, legacy_version=legacy)
    a, b = rng.standard_normal((6, 3)) * 0.6, rng.standard_normal((6, 3)) * 0.6
    y = np.array([1, 0, 0, 1, 0, 0], dtype=np.float64)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    d2 = ((ta - tb) ** 2).sum(1)
    hinge = torch.clamp(1.5 - d2, min=0) if legacy else torch.clamp(1.5 - d2.sqrt(), min=0) ** 2
    ty = (torch.tensor(y) * d2 + (1 - torch.tensor(y)) * hinge).sum() / 12
    assert np.isclose(_loss(layer, [a, b, y], params), ty.item(), rtol=1e-13)
    ty.backward()
    (top,) = forward(layer, [a, b, y], params)
    (da, db, _), _ = backward(layer, [a, b, y], [top], [np.array(1.0)], params)
    np.testing.assert_allclose(da, ta.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(db, tb.grad.numpy(), rtol=1e-12)
    gradcheck(layer, [a, b, y], params)


def test_infogain_loss_with_identity_is_cross_entropy(rng):
    layer, params = build("InfogainLoss", [(5, 4), (5,), (4, 4)])
    x = rng.standard_normal((5, 4))
    labels = np.array([0, 3, 1, 1, 2], dtype=np.float64)
    want = F.cross_entropy(torch.tensor(x), torch.tensor(labels).long()).item()
    assert np.isclose(_loss(layer, [x, labels, np.eye(4)], params), want, rtol=1e-13)


def test_infogain_loss_weighs_the_classes(rng):
    layer, params = build("InfogainLoss", [(5, 4), (5,), (1, 1, 4, 4)])
    x = rng.standard_normal((5, 4))
    labels = np.array([0, 3, 1, 1, 2], dtype=np.float64)
    h = rng.uniform(0, 1, (1, 1, 4, 4))
    logp = torch.log_softmax(torch.tensor(x), 1).numpy()
    want = -(h[0, 0][labels.astype(int)] * logp).sum() / 5
    assert np.isclose(_loss(layer, [x, labels, h], params), want, rtol=1e-13)
    gradcheck(layer, [x, labels, h], params)


@pytest.mark.parametrize("mode", ["VALID", "FULL", "BATCH_SIZE", "NONE"])
def test_softmax_with_loss_normalization_over_pixels(rng, mode):
    # a segmentation head: scores (N, C, H, W), a label per pixel, some ignored (255)
    layer, params = build("SoftmaxWithLoss", [(2, 5, 3, 4), (2, 1, 3, 4)], ignore_label=255, normalization=mode)
    x = rng.standard_normal((2, 5, 3, 4))
    labels = rng.integers(0, 5, (2, 1, 3, 4)).astype(np.float64)
    labels[0, 0, 1, :2] = 255
    labels[1, 0, 2, 3] = 255
    t = torch.tensor(labels[:, 0]).long()
    total = F.cross_entropy(torch.tensor(x), t, ignore_index=255, reduction="sum").item()
    divisor = {"VALID": (labels != 255).sum(), "FULL": 24, "BATCH_SIZE": 2, "NONE": 1}[mode]
    assert np.isclose(_loss(layer, [x, labels], params), total / divisor, rtol=1e-13)
    gradcheck(layer, [x, labels], params)


def test_softmax_with_loss_normalize_false_is_batch_size():
    a, _ = build("SoftmaxWithLoss", [(2, 3, 2, 2), (2, 2, 2)], normalize=False)
    b, _ = build("SoftmaxWithLoss", [(2, 3, 2, 2), (2, 2, 2)], normalize=True, normalization="BATCH_SIZE")
    assert a.mode == b.mode == "BATCH_SIZE"


@pytest.mark.parametrize("name, shapes, cfg, message", [
    ("HingeLoss", [(6, 5), (5,)], {}, "labels .* must hold one value per sample"),
    ("ContrastiveLoss", [(6, 3), (6, 4), (6,)], {}, "expected two features of one shape"),
    ("InfogainLoss", [(5, 4), (5,)], dict(source="H.binaryproto"), "a 'source' .binaryproto is not read"),
    ("InfogainLoss", [(5, 4), (5,), (3, 3)], {}, "H must be 4x4 for 4 classes"),
])
def test_errors(name, shapes, cfg, message):
    with raises_one_line(LayerError, match=message):
        build(name, shapes, **cfg)


def test_a_label_out_of_range_is_named():
    layer, params = build("MultinomialLogisticLoss", [(2, 3), (2,)])
    with raises_one_line(LayerError, match="label 3 is out of range for 3 classes"):
        forward(layer, [np.full((2, 3), 1 / 3), np.array([0.0, 3.0])], params)
