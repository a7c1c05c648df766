"""Stock Caffe layers of layers/caffe_misc.py and DummyData: float64 finite-difference gradients
(and in-place runs where a layer may run in place), values against PyTorch, and errors."""

import numpy as np
import pytest
import torch
from layer_harness import backward, build, forward, gradcheck, peak_allocation
from one_line import raises_one_line

from superneuron.errors import LayerError

GRAD_CASES = [
    ("Exp", [(3, 4, 2)], {}),
    ("Exp", [(3, 4, 2)], dict(base=2.0, scale=0.5, shift=1.0)),
    ("Log", [(3, 4, 2)], dict(shift=3.0)),
    ("Log", [(3, 4, 2)], dict(base=10.0, scale=2.0, shift=5.0)),
    ("Clip", [(3, 4, 2)], dict(min=-0.5, max=0.7)),
    ("Swish", [(3, 4, 2)], {}),
    ("Swish", [(3, 4, 2)], dict(beta=2.5)),
    ("Bias", [(2, 3, 4)], {}),
    ("Bias", [(2, 3, 4, 5)], dict(axis=1, num_axes=2)),
    ("Bias", [(2, 3, 4, 5), (3, 4)], {}),
    ("Bias", [(2, 3, 4, 5), (2,)], dict(axis=0)),
    ("MVN", [(2, 3, 4, 5)], {}),
    ("MVN", [(2, 3, 4, 5)], dict(across_channels=True)),
    ("MVN", [(2, 3, 4, 5)], dict(normalize_variance=False)),
    ("Reduction", [(2, 3, 4)], {}),
    ("Reduction", [(2, 3, 4)], dict(operation="ASUM", axis=1, coeff=0.5)),
    ("Reduction", [(2, 3, 4)], dict(operation="SUMSQ", axis=2)),
    ("Reduction", [(2, 3, 4)], dict(operation="MEAN", axis=-1, coeff=-2.0)),
    ("Tile", [(2, 3, 4)], dict(tiles=3)),
    ("Tile", [(2, 3, 4)], dict(axis=2, tiles=2)),
    ("Crop", [(2, 3, 8, 9), (2, 5, 5, 6)], dict(offset=[1, 2])),
    ("Crop", [(2, 3, 8, 9), (2, 5, 5, 6)], {}),
    ("Crop", [(4, 3, 8, 9), (2, 2, 5, 6)], dict(axis=0, offset=1)),
]


def _inputs(rng, name, shapes):
    xs = [rng.uniform(-2, 2, s) for s in shapes]
    if name == "Crop":
        xs[1] = np.zeros(shapes[1])  # its values are never read
    return xs


@pytest.mark.parametrize("name, shapes, cfg", GRAD_CASES)
def test_gradcheck(rng, name, shapes, cfg):
    layer, params = build(name, shapes, **cfg)
    gradcheck(layer, _inputs(rng, name, shapes), params)


def test_batch_reindex_gradient_adds_repeated_samples(rng):
    layer, params = build("BatchReindex", [(4, 3, 2), (5,)])
    x = rng.standard_normal((4, 3, 2))
    order = np.array([3, 0, 3, 1, 3], dtype=np.float64)
    gradcheck(layer, [x, order], params)
    (y,) = forward(layer, [x, order], params)
    np.testing.assert_array_equal(y, x[[3, 0, 3, 1, 3]])
    dy = rng.standard_normal(y.shape)
    (dx, _), _ = backward(layer, [x, order], [y], [dy], params)
    want = torch.zeros(4, 3, 2, dtype=torch.float64).index_add_(0, torch.tensor([3, 0, 3, 1, 3]), torch.tensor(dy))
    np.testing.assert_allclose(dx, want.numpy(), rtol=1e-14)


def _torch_of(name, cfg, t):
    """The layer's top in PyTorch, from the tensor ``t``."""
    if name == "Exp":
        base = np.e if cfg.get("base", -1) == -1 else cfg["base"]
        return torch.pow(torch.tensor(base, dtype=t.dtype), cfg.get("shift", 0) + cfg.get("scale", 1) * t)
    if name == "Log":
        y = torch.log(cfg.get("shift", 0) + cfg.get("scale", 1) * t)
        return y if cfg.get("base", -1) == -1 else y / np.log(cfg["base"])
    if name == "Swish":
        return t * torch.sigmoid(cfg.get("beta", 1.0) * t)
    if name == "Clip":
        return torch.clamp(t, cfg["min"], cfg["max"])
    if name == "Threshold":
        return (t > cfg.get("threshold", 0)).to(t.dtype)
    if name == "MVN":
        dims = (1, 2, 3) if cfg.get("across_channels") else (2, 3)
        centred = t - t.mean(dims, keepdim=True)
        if cfg.get("normalize_variance", True) is False:
            return centred
        return centred / (centred.pow(2).mean(dims, keepdim=True).sqrt() + cfg.get("eps", 1e-9))
    if name == "Reduction":
        axis = cfg.get("axis", 0) % t.dim()
        op = {"SUM": lambda v: v, "ASUM": torch.abs, "SUMSQ": lambda v: v * v, "MEAN": lambda v: v}
        flat = op[cfg.get("operation", "SUM")](t).reshape(*t.shape[:axis], -1)
        out = flat.mean(-1) if cfg.get("operation") == "MEAN" else flat.sum(-1)
        return out * cfg.get("coeff", 1.0)
    if name == "Tile":
        axis = cfg.get("axis", 1)
        reps = [1] * t.dim()
        reps[axis] = cfg["tiles"]
        return t.repeat(*reps)
    raise AssertionError(name)


@pytest.mark.parametrize("name, cfg", [
    ("Exp", {}), ("Exp", dict(base=3.0, scale=-0.5, shift=0.25)), ("Log", dict(shift=2.5)),
    ("Log", dict(base=2.0, scale=3.0, shift=7.0)), ("Swish", dict(beta=0.7)), ("Clip", dict(min=-1.0, max=0.5)),
    ("Threshold", dict(threshold=0.3)), ("MVN", {}), ("MVN", dict(across_channels=True)),
    ("MVN", dict(normalize_variance=False)), ("Reduction", dict(operation="ASUM", axis=1)),
    ("Reduction", dict(operation="MEAN", axis=2, coeff=3.0)), ("Reduction", dict(operation="SUMSQ")),
    ("Tile", dict(tiles=3)), ("Tile", dict(axis=3, tiles=2)),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_values_and_gradients_match_pytorch(rng, name, cfg, dtype):
    shape = (2, 3, 4, 5)
    layer, params = build(name, [shape], dtype=dtype, **cfg)
    x = rng.uniform(-2, 2, shape).astype(dtype)
    (y,) = forward(layer, [x], params)
    t = torch.tensor(x, requires_grad=True)
    ty = _torch_of(name, cfg, t)
    tol = dict(rtol=2e-5, atol=2e-6) if dtype == np.float32 else dict(rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(y, ty.detach().numpy(), **tol)
    if name == "Threshold":
        return  # Caffe has no backward for it; ours is the zero derivative
    dy = rng.standard_normal(y.shape).astype(dtype)
    ty.backward(torch.tensor(dy))
    (dx,), _ = backward(layer, [x], [y], [dy], params)
    if name == "MVN" and cfg.get("normalize_variance", True) and dtype == np.float64:
        tol = dict(rtol=1e-7, atol=1e-9)  # Caffe's backward leaves eps (1e-9) out of std's share
    np.testing.assert_allclose(dx, t.grad.numpy(), **tol)


def test_bias_from_a_second_bottom_matches_pytorch(rng):
    layer, params = build("Bias", [(2, 3, 4, 5), (3,)])
    x, b = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal(3)
    (y,) = forward(layer, [x, b], params)
    tx, tb = torch.tensor(x, requires_grad=True), torch.tensor(b, requires_grad=True)
    ty = tx + tb.reshape(1, 3, 1, 1)
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-14)
    dy = rng.standard_normal(y.shape)
    ty.backward(torch.tensor(dy))
    (dx, db), _ = backward(layer, [x, b], [y], [dy], params)
    np.testing.assert_allclose(dx, tx.grad.numpy())
    np.testing.assert_allclose(db, tb.grad.numpy(), rtol=1e-12)


def test_crop_is_fcns_crop(rng):
    # FCN-32s: score (1, 21, 544, 544) cropped to the data (1, 3, 500, 500) at offset 19
    layer, params = build("Crop", [(1, 2, 44, 44), (1, 3, 20, 20)], offset=[19])
    x = rng.standard_normal((1, 2, 44, 44))
    (y,) = forward(layer, [x, np.zeros((1, 3, 20, 20))], params)
    assert y.shape == (1, 2, 20, 20)
    np.testing.assert_array_equal(y, x[:, :, 19:39, 19:39])


@pytest.mark.parametrize("fillers, check", [
    ([{"type": "constant", "value": 3}], lambda a: (a == 3).all()),
    ([{"type": "uniform", "min": 2, "max": 5}], lambda a: a.min() >= 2 and a.max() < 5 and abs(a.mean() - 3.5) < 0.1),
    ([{"type": "gaussian", "mean": 1, "std": 2}], lambda a: abs(a.mean() - 1) < 0.1 and abs(a.std() - 2) < 0.1),
])
def test_dummy_data_fills_its_tops(fillers, check):
    layer, params = build("DummyData", [], n_tops=2, shape=[[40, 50], [4000]], data_filler=fillers)
    a, b = forward(layer, [], params)
    assert a.shape == (40, 50) and b.shape == (4000,)
    assert check(a) and check(b)
    again = forward(layer, [], params)  # the same seed: the same numbers (recompute)
    np.testing.assert_array_equal(again[0], a)


def test_dummy_data_old_form_and_default():
    layer, params = build("DummyData", [], num=[2], channels=[3], height=[4], width=[5])
    (a,) = forward(layer, [], params)
    assert a.shape == (2, 3, 4, 5) and (a == 0).all()


@pytest.mark.parametrize("name, shapes, cfg, message", [
    ("Exp", [(2, 3)], dict(base=-2.0), "base must be positive"),
    ("Log", [(2, 3)], dict(base=1.0), "base must be positive and not 1"),
    ("Clip", [(2, 3)], dict(min=1.0, max=0.0), "min 1.0 is more than max 0.0"),
    ("Bias", [(2, 3, 4), (4,)], {}, r"the bias \(4\) does not match the bottom \(2,3,4\) from axis 1"),
    ("Tile", [(2, 3)], dict(tiles=0), "tiles must be at least 1"),
    ("Crop", [(2, 3, 8, 8), (2, 3, 5, 5)], dict(offset=[4]), "offset 4 and size 5 on dim 2 do not fit"),
    ("Crop", [(2, 3, 8, 8), (2, 3, 5, 5)], dict(offset=[1, 2, 3]), "3 offsets for 2 cropped dims"),
    ("MVN", [(6,)], {}, "needs a bottom of at least 2 dims"),
    ("BatchReindex", [(4, 3), (2, 2)], {}, "the indices must be 1-D"),
    ("DummyData", [], dict(shape=[[2, 3]], data_filler=[{"type": "xavier"}]), "data_filler 'xavier'"),
])
def test_errors(name, shapes, cfg, message):
    with raises_one_line(LayerError, match=message):
        build(name, shapes, **cfg)


def test_batch_reindex_refuses_an_index_out_of_range():
    layer, params = build("BatchReindex", [(4, 3), (2,)])
    with raises_one_line(LayerError, match=r"an index is outside \[0, 4\)"):
        forward(layer, [np.zeros((4, 3)), np.array([1.0, 4.0])], params)


@pytest.mark.parametrize("name, cfg, reads, inplace", [
    ("Exp", {}, ((), (0,)), True), ("Log", {}, ((0,), ()), False), ("Threshold", {}, ((), ()), True),
    ("Clip", dict(min=0, max=1), ((0,), ()), False), ("Swish", {}, ((0,), (0,)), False),
    ("Bias", {}, ((), ()), True), ("MVN", {}, ((0,), ()), False),
    ("MVN", dict(normalize_variance=False), ((), ()), True),
    ("Reduction", {}, ((), ()), False), ("Reduction", dict(operation="SUMSQ"), ((0,), ()), False),
    ("Tile", dict(tiles=2), ((), ()), False),
])
def test_what_the_backward_reads(name, cfg, reads, inplace):
    layer, _ = build(name, [(2, 3, 4)], **cfg)
    assert layer.backward_reads() == reads and layer.INPLACE == inplace


@pytest.mark.parametrize("name, cfg", [("Swish", {}), ("MVN", {}), ("Clip", dict(min=0, max=1)),
                                       ("Reduction", dict(operation="ASUM", axis=1))])
def test_kernels_allocate_little(rng, name, cfg):
    shape = (8, 16, 32, 32)
    layer, params = build(name, [shape], dtype=np.float32, **cfg)
    x = rng.standard_normal(shape).astype(np.float32)
    assert peak_allocation(layer, [x], params) < x.nbytes // 8


@pytest.mark.parametrize("height, size", [(3, (9, 7)), (2, (8, 8)), (1, (5, 6))])
def test_spp_is_caffes_pyramid_of_max_poolings(rng, height, size):
    shape = (2, 3) + size
    layer, params = build("SPP", [shape], pyramid_height=height)
    x = rng.standard_normal(shape)
    (y,) = forward(layer, [x], params)
    parts = []
    for level in range(height):  # Caffe's windows, written out: rows o*k - pad .. + k, clipped
        bins = 2 ** level
        k = [-(-d // bins) for d in size]
        pad = [(kk * bins - d + 1) // 2 for kk, d in zip(k, size)]
        outs = [-(-(d + 2 * p - kk) // kk) + 1 for d, p, kk in zip(size, pad, k)]
        outs = [o - 1 if (o - 1) * kk >= d + p else o for o, d, p, kk in zip(outs, size, pad, k)]
        level_out = np.empty((2, 3, *outs))
        for i in range(outs[0]):
            for j in range(outs[1]):
                r0, c0 = max(i * k[0] - pad[0], 0), max(j * k[1] - pad[1], 0)
                r1, c1 = min(i * k[0] - pad[0] + k[0], size[0]), min(j * k[1] - pad[1] + k[1], size[1])
                level_out[:, :, i, j] = x[:, :, r0:r1, c0:c1].max((2, 3))
        parts.append(torch.tensor(level_out.reshape(2, -1)))
    want = torch.cat(parts, 1).numpy()
    assert y.shape == (2, 3 * sum(4 ** level for level in range(height)))
    np.testing.assert_array_equal(y, want)
    gradcheck(layer, [x], params)


def test_spp_average(rng):
    layer, params = build("SPP", [(2, 3, 8, 8)], pyramid_height=3, pool="AVE")
    x = rng.standard_normal((2, 3, 8, 8))
    (y,) = forward(layer, [x], params)
    np.testing.assert_allclose(y[:, :3], x.mean((2, 3)), rtol=1e-13)  # level 0: the global mean
    np.testing.assert_allclose(y[:, 3 + 4 * 1], x[:, 1, :4, :4].mean((1, 2)), rtol=1e-13)  # level 1, bin 0 of channel 1
    gradcheck(layer, [x], params)
