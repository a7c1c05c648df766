"""Flatten, Reshape, Slice, Silence, ArgMax, a Split written in a network file, EuclideanLoss and
SigmoidCrossEntropyLoss: finite-difference gradients, agreement with PyTorch, Caffe's errors,
the views that Flatten and Reshape are (no memory, gradients shared, in-place writes through
them checked), and a small net of them whose every policy computes baseline's results bit for
bit with the planned peak reached exactly."""

import pathlib
import re
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from layer_harness import backward, build, forward, gradcheck, peak_allocation
from one_line import raises_one_line
from test_memory_passes import check_copies

from superneuron.errors import LayerError, SpecError
from superneuron.graph import Graph
from superneuron.layers import layer_class
from superneuron.layers.base import Context
from superneuron.net import Net, load_net
from superneuron.netfile.spec import loads_spec
from superneuron.scheduler.lower import lower

KIB = 1024
RNG_SEED = 23  # the seed of each test's own generator (the rng fixture, conftest.py)
NET = pathlib.Path(__file__).parent / "nets" / "shape.yaml"


def randn(rng, *shape):
    return rng.standard_normal(shape)


def torch_grads(fn, inputs, dys, grad):
    """Outputs of ``fn(*inputs)`` (a tensor or a tuple) and the gradients of sum <dy, out> for
    the inputs indexed in ``grad`` (a ``dy`` of None leaves that output out)."""
    ts = [torch.tensor(x, requires_grad=i in grad) for i, x in enumerate(inputs)]
    out = fn(*ts)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    total = sum((o * torch.as_tensor(dy)).sum() for o, dy in zip(outs, dys) if dy is not None)
    total.backward()
    return [o.detach().numpy() for o in outs], [ts[i].grad.numpy() for i in grad]


# -- gradient checks (float64) -----------------------------------------------------------------

GRAD_CASES = [
    ("Flatten", [(2, 3, 4, 5)], 1, {}),
    ("Flatten", [(2, 3, 4, 5)], 1, dict(axis=2)),
    ("Flatten", [(2, 3, 4, 5)], 1, dict(axis=1, end_axis=2)),
    ("Flatten", [(2, 3, 4, 5)], 1, dict(axis=-3, end_axis=-2)),
    ("Reshape", [(2, 3, 4)], 1, dict(shape=[0, -1])),
    ("Reshape", [(2, 3, 4)], 1, dict(shape=[4, 0, 2], axis=0)),
    ("Reshape", [(2, 3, 4)], 1, dict(shape=[2, 2], axis=2)),
    ("Reshape", [(2, 6)], 1, dict(shape=[1, 1], axis=-1, num_axes=0)),
    ("Slice", [(3, 6, 2)], 3, {}),
    ("Slice", [(3, 6, 2)], 3, dict(slice_point=[1, 4])),
    ("Slice", [(4, 3, 2)], 2, dict(slice_dim=0, slice_point=[3])),
    ("Slice", [(3, 2, 5)], 2, dict(axis=-1, slice_point=[2])),
    ("Slice", [(3, 4)], 1, {}),
    ("Silence", [(2, 3), (4,)], 0, {}),
    ("EuclideanLoss", [(3, 4), (3, 4)], 1, {}),
    ("EuclideanLoss", [(3, 4), (3, 2, 2)], 1, {}),
    ("EuclideanLoss", [(5,), (5,)], 1, {}),
    ("SigmoidCrossEntropyLoss", [(3, 4), (3, 4)], 1, {}),
    ("SigmoidCrossEntropyLoss", [(3, 2, 2), (3, 4)], 1, dict(normalization="FULL")),
    ("SigmoidCrossEntropyLoss", [(4, 3), (4, 3)], 1, dict(normalization="VALID", ignore_label=2)),
    ("SigmoidCrossEntropyLoss", [(4, 3), (4, 3)], 1, dict(normalization="NONE", ignore_label=-1)),
    ("SigmoidCrossEntropyLoss", [(4, 3), (4, 3)], 1, dict(normalize=True)),
]


def grad_inputs(rng, type_name, shapes):
    xs = [randn(rng, *s) for s in shapes]
    if type_name == "SigmoidCrossEntropyLoss":
        xs[0] *= 3
        xs[1] = rng.integers(-1, 3, shapes[1]).astype(np.float64)  # some ignored when asked
        xs[1][xs[1] >= 0] = rng.uniform(0, 1, int(np.sum(xs[1] >= 0)))  # soft targets too
        xs[1].flat[:2] = 2.0
    return xs


@pytest.mark.parametrize("type_name, shapes, n_tops, cfg", GRAD_CASES)
def test_gradcheck(rng, type_name, shapes, n_tops, cfg):
    layer, params = build(type_name, shapes, n_tops=n_tops, **cfg)
    tops, bgrads, _ = gradcheck(layer, grad_inputs(rng, type_name, shapes), params)
    for i, g in enumerate(bgrads):
        if i not in layer.LABEL_BOTTOMS:
            assert np.all(np.isfinite(g)), "every bottom gradient written"


# -- Flatten, Reshape: values, shapes and gradients against PyTorch ------------------------------

@pytest.mark.parametrize("shape, cfg, start, end", [
    ((2, 3, 4, 5), {}, 1, -1),
    ((2, 3, 4, 5), dict(axis=0, end_axis=1), 0, 1),
    ((2, 3, 4, 5), dict(axis=-2), -2, -1),
    ((6, 7), dict(axis=1), 1, -1),
])
def test_flatten_matches_torch(rng, shape, cfg, start, end):
    layer, params = build("Flatten", [shape], **cfg)
    x, dy = randn(rng, *shape), randn(rng, *layer.top_shapes[0])
    (want,), (dx_want,) = torch_grads(lambda t: torch.flatten(t, start, end), [x], [dy], (0,))
    (y,) = forward(layer, [x], params)
    (dx,), _ = backward(layer, [x], [y], [dy], params)
    assert y.shape == want.shape
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(dx, dx_want)


def test_flatten_end_before_axis_inserts_a_dim_of_one_as_caffe():
    layer, _ = build("Flatten", [(2, 3, 4)], axis=2, end_axis=1)
    assert layer.top_shapes == [(2, 3, 1, 4)]


@pytest.mark.parametrize("shape, cfg, want", [
    ((2, 3, 4), dict(shape=[0, -1]), (2, 12)),
    ((2, 3, 4), dict(shape=[-1]), (24,)),
    ((2, 3, 4), dict(shape=[0, 0, 2, 2]), (2, 3, 2, 2)),
    ((2, 3, 4), dict(shape=[2, -1], axis=1), (2, 2, 6)),
    ((2, 3, 4), dict(shape=[6, 2], axis=1, num_axes=-1), (2, 6, 2)),
    ((2, 12), dict(shape=[1, 1], axis=-1), (2, 12, 1, 1)),     # axis -1: after the last dim
    ((2, 3, 4), dict(shape=[1, -1], axis=0, num_axes=1), (1, 2, 3, 4)),
    ((2, 3, 4), dict(shape=[3, 1], axis=1, num_axes=1), (2, 3, 1, 4)),
])
def test_reshape_shapes_values_and_gradients_match_torch(rng, shape, cfg, want):
    layer, params = build("Reshape", [shape], **cfg)
    assert layer.top_shapes == [want]
    x, dy = randn(rng, *shape), randn(rng, *want)
    (y_want,), (dx_want,) = torch_grads(lambda t: t.reshape(want), [x], [dy], (0,))
    (y,) = forward(layer, [x], params)
    (dx,), _ = backward(layer, [x], [y], [dy], params)
    np.testing.assert_array_equal(y, y_want)
    np.testing.assert_array_equal(dx, dx_want)


def test_views_skip_their_copies_when_the_arrays_are_one(rng):
    """In the runtime top and bottom (and the gradients) share memory: nothing is copied."""
    layer, params = build("Flatten", [(2, 3, 4)])
    x = randn(rng, 2, 3, 4)
    y = x.reshape(2, 12)
    sentinel = x.copy()
    layer.forward(Context(np), [x], [y], params)
    np.testing.assert_array_equal(x, sentinel)
    dy = randn(rng, 2, 12)
    dx = dy.reshape(2, 3, 4)
    layer.backward(Context(np), [None], [None], [dy], [dx], params, {})
    np.testing.assert_array_equal(dx, dy.reshape(2, 3, 4))
    assert layer.ALIAS_TOPS and layer.ALIAS_GRADS and layer.backward_reads() == ((), ())


# -- Slice ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, n_tops, cfg, sizes, dim", [
    ((3, 6, 2), 3, {}, [2, 2, 2], 1),
    ((3, 6, 2), 3, dict(slice_point=[1, 4]), [1, 3, 2], 1),
    ((5, 3), 2, dict(slice_dim=0, slice_point=[2]), [2, 3], 0),
    ((5, 3), 2, dict(slice_dim=0, axis=1, slice_point=[2]), [2, 3], 0),  # slice_dim wins
    ((2, 3, 8), 4, dict(axis=-1), [2, 2, 2, 2], -1),
])
def test_slice_matches_torch_split(rng, shape, n_tops, cfg, sizes, dim):
    layer, params = build("Slice", [shape], n_tops=n_tops, **cfg)
    x = randn(rng, *shape)
    dys = [randn(rng, *s) for s in layer.top_shapes]
    dys[1] = None  # a part nothing reads: zeros in the bottom's gradient
    want, (dx_want,) = torch_grads(lambda t: torch.split(t, sizes, dim), [x], dys, (0,))
    tops = forward(layer, [x], params)
    (dx,), _ = backward(layer, [x], tops, dys, params)
    assert [t.shape for t in tops] == [w.shape for w in want]
    for t, w in zip(tops, want):
        np.testing.assert_array_equal(t, w)
    np.testing.assert_array_equal(dx, dx_want)
    assert np.all(np.take(dx, range(sizes[0], sizes[0] + sizes[1]), axis=dim) == 0)


# -- Silence --------------------------------------------------------------------------------------

def test_silence_has_no_tops_and_its_backward_writes_zeros(rng):
    layer, params = build("Silence", [(2, 3), (4, 5, 6)])
    assert layer.top_shapes == [] and layer.TOPS == (0, 0)
    xs = [randn(rng, 2, 3), randn(rng, 4, 5, 6)]
    assert forward(layer, xs, params) == []
    bgrads, _ = backward(layer, xs, [], [], params)  # the harness fills them with NaN first
    assert all(np.array_equal(g, np.zeros_like(g)) for g in bgrads)


# -- ArgMax -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, cfg", [
    ((4, 7), {}),
    ((4, 7), dict(top_k=3)),
    ((3, 4, 2, 2), dict(top_k=5, out_max_val=True)),
    ((3, 5, 2), dict(axis=1, top_k=2)),
    ((3, 5, 2), dict(axis=-1)),
    ((3, 5, 4), dict(axis=2, top_k=3, out_max_val=True)),
    ((6,), dict(axis=0, top_k=6)),
])
def test_argmax_matches_torch_topk(rng, shape, cfg):
    layer, params = build("ArgMax", [shape], **cfg)
    assert not layer.BACKWARD
    x, k = randn(rng, *shape), cfg.get("top_k", 1)
    t = torch.tensor(x)
    (y,) = forward(layer, [x], params)
    if "axis" in cfg:
        values, indices = t.topk(k, dim=cfg["axis"])
        want = values if cfg.get("out_max_val") else indices.double()
    else:  # Caffe's (N, 1 or 2, k) padded with 1s to the bottom's dims: indices, then values
        values, indices = t.flatten(1).topk(k, dim=1)
        rows = [indices.double(), values] if cfg.get("out_max_val") else [indices.double()]
        want = torch.stack(rows, 1).reshape((shape[0], len(rows), k) + (1,) * (len(shape) - 3))
    assert y.shape == tuple(want.shape)
    np.testing.assert_array_equal(y, want.numpy())


def test_argmax_ties_go_to_the_higher_index_as_caffe_and_never_repeat():
    layer, params = build("ArgMax", [(3, 5)], top_k=4, out_max_val=True)
    x = np.array([[1.0, 3, 3, 0, 3],
                  [-np.inf, -np.inf, 2, -np.inf, -np.inf],
                  [0.5, 0.5, 0.5, 0.5, 0.5]])
    (y,) = forward(layer, [x], params)
    # Caffe sorts (value, index) pairs descending: equal values go to the higher index first.
    np.testing.assert_array_equal(y[:, 0], [[4, 2, 1, 0], [2, 4, 3, 1], [4, 3, 2, 1]])
    np.testing.assert_array_equal(y[:, 1], [[3, 3, 3, 1], [2, -np.inf, -np.inf, -np.inf], [0.5] * 4])
    assert int(torch.tensor(x[0]).argmax()) == 1  # PyTorch takes the first: Caffe's rule is ours


# -- the losses against PyTorch --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_euclidean_loss_matches_torch_mse(rng, dtype):
    a, b = randn(rng, 4, 3, 2).astype(dtype), randn(rng, 4, 6).astype(dtype)
    layer, params = build("EuclideanLoss", [a.shape, b.shape], dtype)
    assert layer.top_shapes == [()] and layer.LOSS and layer.LABEL_BOTTOMS == ()
    w = np.asarray(1.7, dtype)  # the loss weight, as the runtime hands it
    (want,), (da_want, db_want) = torch_grads(
        lambda p, q: F.mse_loss(p, q.reshape(p.shape), reduction="sum") / (2 * 4), [a, b], [w], (0, 1))
    (y,) = forward(layer, [a, b], params)
    (da, db), _ = backward(layer, [a, b], [y], [w], params)
    tol = dict(rtol=1e-12) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(y, want, **tol)
    np.testing.assert_allclose(da, da_want, **tol)
    np.testing.assert_allclose(db, db_want, **tol)
    # One bottom's gradient alone (the other an input): the same values, written directly.
    only_b = [None, np.full(b.shape, np.nan, dtype)]
    layer.backward(Context(np), [a, b], [None], [w], only_b, params, {})
    np.testing.assert_allclose(only_b[1], db_want, **tol)


SIGMOID_CASES = [
    ({}, "sum_over_n"),
    (dict(normalization="BATCH_SIZE"), "sum_over_n"),
    (dict(normalization="FULL"), "mean"),
    (dict(normalization="NONE"), "sum"),
    (dict(normalization="VALID"), "mean"),                      # nothing ignored: all count
    (dict(normalize=False), "sum_over_n"),
    (dict(normalize=True, ignore_label=-1), "valid"),
    (dict(normalization="VALID", normalize=False, ignore_label=-1), "valid"),  # normalization wins
    (dict(ignore_label=-1), "sum_over_n"),
]


@pytest.mark.parametrize("cfg, reduce", SIGMOID_CASES)
def test_sigmoid_cross_entropy_matches_torch(rng, cfg, reduce):
    n, c = 5, 7
    x = 4 * randn(rng, n, c)
    t = rng.uniform(0, 1, (n, c))
    t[rng.uniform(size=(n, c)) < 0.3] = -1.0  # ignored where ignore_label is -1
    layer, params = build("SigmoidCrossEntropyLoss", [(n, c), (n * c,)], **cfg)
    assert layer.LOSS and layer.LABEL_BOTTOMS == (1,)
    keep = (t != -1) if "ignore_label" in cfg else np.ones_like(t, dtype=bool)
    denom = {"sum_over_n": n, "mean": n * c, "sum": 1, "valid": keep.sum()}[reduce]
    w = np.asarray(0.8)
    (want,), (dx_want,) = torch_grads(
        lambda s: F.binary_cross_entropy_with_logits(s, torch.tensor(t), weight=torch.tensor(keep * 1.0),
                                                     reduction="sum") / denom, [x], [w], (0,))
    (y,) = forward(layer, [x, t.reshape(-1)], params)
    (dx, dt), _ = backward(layer, [x, t.reshape(-1)], [y], [w], params)
    np.testing.assert_allclose(y, want, rtol=1e-12)
    np.testing.assert_allclose(dx, dx_want, rtol=1e-10, atol=1e-15)
    assert dt is None  # the targets are never differentiated


def test_sigmoid_cross_entropy_is_stable_for_large_scores():
    x = np.array([[-300.0, 300.0, 80.0, -80.0]], np.float32)
    t = np.array([[1.0, 0.0, 0.0, 1.0]], np.float32)
    layer, params = build("SigmoidCrossEntropyLoss", [x.shape, t.shape], np.float32)
    (want,), (dx_want,) = torch_grads(
        lambda s: F.binary_cross_entropy_with_logits(s, torch.tensor(t), reduction="sum"), [x], [np.float32(1)], (0,))
    with np.errstate(over="raise", invalid="raise"):  # no overflow anywhere
        (y,) = forward(layer, [x, t], params)
        (dx, _), _ = backward(layer, [x, t], [y], [np.asarray(1, np.float32)], params)
    assert y == pytest.approx(760.0) and y == pytest.approx(float(want), rel=1e-6)
    np.testing.assert_allclose(dx, dx_want, atol=1e-6)


def test_sigmoid_ignore_label_compares_the_integer_part_as_caffe():
    """Caffe casts each target to int: with ignore_label 0, targets in (-1, 1) are all ignored."""
    layer, params = build("SigmoidCrossEntropyLoss", [(1, 4), (1, 4)], ignore_label=0, normalization="VALID")
    x, t = np.array([[1.0, -2.0, 0.5, 3.0]]), np.array([[0.0, 0.7, -0.5, 1.0]])
    (y,) = forward(layer, [x, t], params)
    assert y == pytest.approx(np.logaddexp(0, 3.0) - 3.0)  # only the last counts, over 1


# -- memory: kernels allocate nothing the size of their operands, and use exactly their workspace --

MEMORY_CASES = [
    ("Slice", [(8, 16, 64, 64)], 2, {}),
    ("Flatten", [(8, 16, 64, 64)], 1, {}),
    ("ArgMax", [(8, 16, 64, 64)], 1, dict(axis=1, top_k=3)),
    ("ArgMax", [(8, 16, 64, 64)], 1, dict(top_k=3, out_max_val=True)),
    ("EuclideanLoss", [(8, 16, 64, 64)] * 2, 1, {}),
    ("SigmoidCrossEntropyLoss", [(8, 16, 64, 64)] * 2, 1, dict(ignore_label=1, normalization="VALID")),
]


def run_phase(layer, phase, nbytes, xs, params):
    """Run one phase of ``layer`` with a workspace of exactly ``nbytes``."""
    ctx = Context(np, workspace=np.zeros(nbytes, np.uint8) if nbytes else None)
    tops = [np.zeros(s, np.float32) for s in layer.top_shapes]
    if phase == "forward":
        return layer.forward(ctx, xs, tops, params)
    bg = [None if i in layer.LABEL_BOTTOMS else np.zeros_like(x) for i, x in enumerate(xs)]
    layer.backward(ctx, xs, tops, [np.ones_like(t) for t in tops], bg, params, {})


@pytest.mark.parametrize("type_name, shapes, n_tops, cfg", MEMORY_CASES)
def test_peak_allocation_and_exact_workspace(type_name, shapes, n_tops, cfg):
    layer, params = build(type_name, shapes, np.float32, n_tops=n_tops, **cfg)
    xs = [np.random.default_rng(0).standard_normal(s).astype(np.float32) for s in shapes]
    assert peak_allocation(layer, xs, params) < 256 * KIB  # the operands are 2 MiB each
    for phase in ("forward", "backward") if layer.BACKWARD else ("forward",):
        need = layer.algorithms(phase)[0].workspace
        run_phase(layer, phase, need, xs, params)
        if need:
            with pytest.raises(AssertionError, match="exceeds workspace"):
                run_phase(layer, phase, need - 1, xs, params)


# -- errors: Caffe's checks, as one clear line each --------------------------------------------------

ERROR_CASES = [
    ("Flatten", [(2, 3)], 1, dict(axis=2), "axis 2 is out of range for the 2-D bottom (2,3)"),
    ("Flatten", [(2, 3, 4)], 1, dict(axis=2, end_axis=0), "end_axis 0 comes before axis 2 in the bottom (2,3,4)"),
    ("Reshape", [(2, 3, 4)], 1, dict(shape=[-1, -1]), "shape [-1, -1]: at most one dim may be -1"),
    ("Reshape", [(2, 3, 4)], 1, dict(shape=[2, -2]), "a dim is positive, 0 (copy the bottom's) or -1"),
    ("Reshape", [(2, 3, 4)], 1, dict(shape=[5, -1]), "has 24 values, not a multiple of the other dims' 5"),
    ("Reshape", [(2, 3, 4)], 1, dict(shape=[5, 5]), "gives (5,5) of 25 values, but the bottom (2,3,4) has 24"),
    ("Reshape", [(2, 12)], 1, dict(shape=[0, 0, 0]), "dim 2 is 0, but the bottom (2,12) has no dim 2 to copy"),
    ("Reshape", [(2, 12)], 1, dict(shape=[24], axis=3), "axis 3 is out of range for the 2-D bottom"),
    ("Reshape", [(2, 12)], 1, dict(shape=[24], axis=-4), "axis -4 is out of range for the 2-D bottom"),
    ("Reshape", [(2, 12)], 1, dict(shape=[24], num_axes=-2), "num_axes must be >= 0, or -1 for all, got -2"),
    ("Reshape", [(2, 12)], 1, dict(shape=[24], axis=1, num_axes=2), "axis + num_axes = 3 is out of range"),
    ("Slice", [(2, 6)], 3, dict(slice_point=[2]), "1 slice_point(s) for 3 tops: give 2"),
    ("Slice", [(2, 6)], 3, dict(slice_point=[4, 2]), "slice_point [4, 2] must rise strictly, above 0 and below 6"),
    ("Slice", [(2, 6)], 2, dict(slice_point=[6]), "slice_point [6] must rise strictly"),
    ("Slice", [(2, 6)], 2, dict(slice_point=[0]), "slice_point [0] must rise strictly"),
    ("Slice", [(2, 6)], 4, {}, "has 6 entries: 4 tops do not cut it in equal parts"),
    ("Slice", [(2, 6)], 2, dict(slice_dim=2), "slice_dim 2 is out of range for the 2-D bottom"),
    ("Slice", [(2, 6)], 2, dict(slice_dim=-1), "slice_dim -1 is out of range"),
    ("Slice", [(2, 6)], 2, dict(axis=-3), "axis -3 is out of range"),
    ("ArgMax", [(2, 6)], 1, dict(top_k=0), "top_k must be at least 1, got 0"),
    ("ArgMax", [(2, 3, 2)], 1, dict(top_k=7), "top_k 7 is more than the 6 values of each sample"),
    ("ArgMax", [(2, 3, 2)], 1, dict(top_k=3, axis=2), "top_k 3 is more than the 2 values along axis 2"),
    ("ArgMax", [(2, 3)], 1, dict(axis=2), "axis 2 is out of range for the 2-D bottom"),
    ("EuclideanLoss", [(2, 6), (2, 5)], 1, {}, "bottoms (2,6) and (2,5) differ in count per sample"),
    ("EuclideanLoss", [(4, 6), (6, 4)], 1, {}, "differ in count per sample"),
    ("EuclideanLoss", [(2, 6), (3, 6)], 1, {}, "bottoms (2,6) and (3,6) differ in batch size"),
    ("SigmoidCrossEntropyLoss", [(2, 6), (2, 5)], 1, {},
     "targets (2,5) hold 10 values, but scores (2,6) have 12: they must have the same count"),
]


@pytest.mark.parametrize("type_name, shapes, n_tops, cfg, message", ERROR_CASES)
def test_bad_configurations_fail_clearly(type_name, shapes, n_tops, cfg, message):
    with raises_one_line(LayerError, match=re.escape(message)):
        build(type_name, shapes, n_tops=n_tops, **cfg)


@pytest.mark.parametrize("type_name, raw, message", [
    ("Reshape", {"shape": [2, "x"]}, "'shape': expected an integer or a list of integers"),
    ("Slice", {"slice_point": 1.5}, "'slice_point': expected an integer or a list of integers"),
    ("SigmoidCrossEntropyLoss", {"normalization": "MEAN"}, "expected one of FULL, VALID, BATCH_SIZE, NONE"),
    ("Flatten", {"end_axes": 2}, "unknown key 'end_axes'; did you mean 'end_axis'"),
])
def test_bad_keys_fail_clearly(type_name, raw, message):
    with raises_one_line(LayerError, match=message):
        layer_class(type_name).config(raw)


def test_split_is_a_type_files_may_write():
    with pytest.raises(KeyError, match="did you mean 'Split'"):
        layer_class("Splt")
    assert layer_class("Slice").TOPS == (1, None) and layer_class("Silence").TOPS == (0, 0)


# -- the graph: views, in-place writes through them, Splits written in the file ---------------------

HEAD = """\
name: t
input: {data: [2, 3, 4, 4], label: [2, 5]}
layers:
"""


def graph(text):
    return Graph(loads_spec(HEAD + textwrap.dedent(text)))


def errors(text):
    with raises_one_line(SpecError) as e:
        graph(text)
    return str(e.value)


FLAT = """\
  - {name: conv, type: Convolution, bottom: data, top: conv, num_output: 2, kernel_size: 1}
  - {name: flat, type: Flatten, bottom: conv, top: flat}
  - {name: fc, type: InnerProduct, bottom: flat, top: fc, num_output: 5}
  - {name: loss, type: EuclideanLoss, bottom: [fc, label], top: loss}
"""
DIRECT = FLAT.replace("  - {name: flat, type: Flatten, bottom: conv, top: flat}\n", "").replace(
    "bottom: flat", "bottom: conv")


def test_flatten_and_reshape_are_views_without_memory(rng):
    g = graph(FLAT)
    assert g.tensors["flat"].alias == "conv" and g.tensors["flat"].shape == (2, 32)
    assert g.tensors["conv.grad"].alias == "flat.grad" and g.tensors["conv.grad"].shape == (2, 2, 4, 4)
    assert g.root("conv.grad") == "flat.grad" and g.node("flat").backward
    allocated = {s.tensor for s in lower(g).steps if s.kind == "alloc"}
    assert "flat" not in allocated and "conv.grad" not in allocated and "conv" in allocated
    # InnerProduct flattens by itself: the net without the Flatten is the same net, to the byte.
    for policy in ("baseline", "liveness"):
        feed = {"data": randn(rng, 2, 3, 4, 4).astype(np.float32), "label": randn(rng, 2, 5).astype(np.float32)}
        nets = [Net(loads_spec(HEAD + text), policy=policy) for text in (FLAT, DIRECT)]
        losses = [net.forward_backward(feed) for net in nets]
        assert losses[0] == losses[1]
        for name in nets[0].learnable_names:
            np.testing.assert_array_equal(nets[0].grad(name), nets[1].grad(name))
        assert nets[0].peak_bytes == nets[1].peak_bytes == nets[0].plans["train"].peak_bytes


VIEW_THEN_RELU = """\
  - {name: conv, type: Convolution, bottom: data, top: conv, num_output: 2, kernel_size: 1}
  - {name: flat, type: Flatten, bottom: conv, top: flat}
  - {name: relu, type: ReLU, bottom: conv, top: RELU_TOP}
  - {name: fc, type: InnerProduct, bottom: flat, top: fc, num_output: 5}
  - {name: fc2, type: InnerProduct, bottom: RELU_TOP, top: fc2, num_output: 5}
  - {name: sum, type: Eltwise, bottom: [fc, fc2], top: sum}
  - {name: loss, type: EuclideanLoss, bottom: [sum, label], top: loss}
"""


def test_in_place_after_a_view_keeps_what_the_view_still_reads(rng):
    """An in-place write is checked through views of the same memory: where it would change a
    view still read (by a later forward, or a backward), the layer gets memory of its own, and
    the net computes what it computes with a top of its own."""
    g = graph(VIEW_THEN_RELU.replace("RELU_TOP", "conv"))
    assert not g.node("relu").inplace
    assert g.node("relu").kept == "keeps 'flat', read by the backward of 'fc' and read later by 'fc'"
    feed = {"data": randn(rng, 2, 3, 4, 4).astype(np.float32), "label": randn(rng, 2, 5).astype(np.float32)}
    nets = [Net(loads_spec(HEAD + VIEW_THEN_RELU.replace("RELU_TOP", top)), policy="liveness")
            for top in ("conv", "r")]
    assert nets[0].forward_backward(feed) == nets[1].forward_backward(feed)
    for name in nets[0].learnable_names:
        np.testing.assert_array_equal(nets[0].grad(name), nets[1].grad(name))
    # ReLU in place on one top of a written Split would change the other, which fc reads
    g = graph("""\
      - {name: conv, type: Convolution, bottom: data, top: conv, num_output: 2, kernel_size: 1}
      - {name: fork, type: Split, bottom: conv, top: [a, b]}
      - {name: relu, type: ReLU, bottom: a, top: a}
      - {name: fc, type: InnerProduct, bottom: [b], top: fc, num_output: 5}
      - {name: fc2, type: InnerProduct, bottom: a, top: fc2, num_output: 5}
      - {name: sum, type: Eltwise, bottom: [fc, fc2], top: sum}
      - {name: loss, type: EuclideanLoss, bottom: [sum, label], top: loss}
    """)
    assert g.node("relu").kept == "keeps 'b', read by the backward of 'fc' and read later by 'fc'"
    # ReLU in place on a view of Softmax's top, which Softmax's backward reads
    g = graph("""\
      - {name: conv, type: Convolution, bottom: data, top: conv, num_output: 2, kernel_size: 1}
      - {name: prob, type: Softmax, bottom: conv, top: prob}
      - {name: flat, type: Reshape, bottom: prob, top: flat, shape: [0, -1]}
      - {name: relu, type: ReLU, bottom: flat, top: flat}
      - {name: fc, type: InnerProduct, bottom: flat, top: fc, num_output: 5}
      - {name: loss, type: EuclideanLoss, bottom: [fc, label], top: loss}
    """)
    assert g.node("relu").kept == "keeps 'prob', read by the backward of 'prob'"


WRITTEN_SPLIT = """\
  - {name: ip0, type: InnerProduct, bottom: data, top: h, num_output: 5}
  - {name: h_split, type: Split, bottom: h, top: [h_split_0, h_split_1]}
  - {name: ip1, type: InnerProduct, bottom: h, top: k, num_output: 5}
  - {name: sum, type: Eltwise, bottom: [h_split_0, h_split_1, k], top: sum, coeff: [1, 2, 1]}
  - {name: loss, type: EuclideanLoss, bottom: [sum, label], top: loss}
"""


def test_a_written_split_and_the_graphs_own_splits_keep_apart(rng):
    """The file writes a Split and names it and its tops as the graph would name its Split of
    ``h``, which h's two readers need: the graph's takes other names, and the sums stay right."""
    g = graph(WRITTEN_SPLIT)
    names = [n.name for n in g.nodes]
    assert len(names) == len(set(names)) and "h#split" in names
    assert g.node("h#split").tops == ["h#0", "h#1"] and g.node("h#split").bottoms == ["h"]
    assert g.node("h_split").bottoms == ["h#0"] and g.node("ip1").bottoms == ["h#1"]
    for t in ("h_split_0", "h_split_1", "h#0"):
        assert g.root(t) == "h"
    net = Net(loads_spec(HEAD + WRITTEN_SPLIT), dtype="float64", policy="liveness")
    x, label = randn(rng, 2, 3, 4, 4), randn(rng, 2, 5)
    loss = net.forward_backward({"data": x, "label": label})
    w0, b0, w1, b1 = (torch.tensor(net.param(n), requires_grad=True)
                      for n in ("ip0/weight", "ip0/bias", "ip1/weight", "ip1/bias"))
    h = F.linear(torch.tensor(x).flatten(1), w0, b0)
    want = F.mse_loss(3 * h + F.linear(h, w1, b1), torch.tensor(label), reduction="sum") / 4
    want.backward()
    assert loss == pytest.approx(want.item(), rel=1e-12)
    np.testing.assert_allclose(net.grad("ip0/weight"), w0.grad.numpy(), rtol=1e-10)


# -- a net of them: every policy computes baseline's results, and the plan's peak is the run's -----

def net_feed(dtype=np.float32, seed=3):
    rng = np.random.default_rng(seed)
    return {"data": rng.standard_normal((4, 3, 4, 4)).astype(dtype),
            "label": rng.uniform(0, 1, (4, 6)).astype(dtype)}


def test_shape_net_policies_agree_bit_for_bit_and_plans_equal_runs():
    feed = net_feed()
    results = {}
    for policy, placement in [("baseline", "dynamic"), ("liveness", "dynamic"),
                              ("superneurons", "dynamic"), ("superneurons", "planned")]:
        net = load_net(NET, policy=policy, placement=placement)
        loss = net.forward_backward(feed)
        grads = {name: net.grad(name) for name in net.learnable_names}
        plan = net.plans["train"]
        assert np.isfinite(loss) and len(grads) == 4
        assert net.peak_bytes == plan.peak_bytes and net.runtime.arena_bytes == plan.arena_bytes
        assert net.runtime.stalls == 0 and net.host_bytes == plan.host_bytes
        check_copies(net.schedules["train"])
        results[policy, placement] = loss, grads, plan.peak_bytes
    base_loss, base_grads, base_peak = results["baseline", "dynamic"]
    for policy, (loss, grads, _) in results.items():
        assert loss == base_loss, policy
        for name, g in base_grads.items():
            np.testing.assert_array_equal(grads[name], g, err_msg=f"{policy} {name}")
    assert results["liveness", "dynamic"][2] < base_peak
    assert results["superneurons", "dynamic"][2] < base_peak


def test_shape_net_matches_torch():
    """The whole net in float64 against the same computation written in PyTorch."""
    feed = net_feed(np.float64)
    net = load_net(NET, dtype="float64")
    loss = net.forward_backward(feed)
    p = {name: torch.tensor(net.param(name), requires_grad=True) for name in net.learnable_names}
    x, label = torch.tensor(feed["data"]), torch.tensor(feed["label"])
    conv = F.relu(F.conv2d(x, p["conv1/weight"], p["conv1/bias"], padding=1))
    s0, s1, s2 = torch.split(conv, [2, 2, 2], 1)
    flat = F.relu(torch.cat([s0 * s1, s2], 1).flatten(1))
    fc3 = F.linear(flat, p["fc/weight"], p["fc/bias"]).reshape(4, 2, 6)
    p0, p1 = (h.flatten(1) for h in torch.split(fc3, 1, 1))
    want = (F.mse_loss(p0, label, reduction="sum") / (2 * 4)
            + 0.5 * F.binary_cross_entropy_with_logits(p1, label, reduction="sum") / 4)
    want.backward()
    assert loss == pytest.approx(want.item(), rel=1e-12)
    for name, t in p.items():
        np.testing.assert_allclose(net.grad(name), t.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)
    best = fc3.detach().topk(2, dim=2)[1].double().numpy()
    np.testing.assert_array_equal(net.blob("best"), best)
    silence = net.graph.node("silence")
    assert silence.tops == [] and not silence.backward and net.graph.node("argmax").bottom_grads == [None]
