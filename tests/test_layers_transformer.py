"""Embed, Parameter, LayerNorm, GELU, MatMul, Permute, causal Softmax, SoftmaxWithLoss over a
sequence and MultiHeadAttention: float64 finite differences (and every algorithm agreeing) by
the harness, and the values and gradients of torch.nn.functional (embedding, layer_norm, gelu,
softmax, cross_entropy, multi_head_attention_forward, scaled_dot_product_attention)."""

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from layer_harness import backward, build, forward, gradcheck, peak_allocation
from test_layers_misc import torch_run

from superneuron.errors import LayerError

RNG_SEED = 33


def run(layer, bottoms, params, dy, algo=None):
    """Our top, bottom gradients and parameter gradients for top gradient ``dy``."""
    f_algo = b_algo = None
    if algo is not None:
        f_algo = {a.name: a for a in layer.algorithms("forward")}.get(algo[0])
        b_algo = {a.name: a for a in layer.algorithms("backward")}.get(algo[1])
    tops = forward(layer, bottoms, params, algo=f_algo)
    bgrads, pgrads = backward(layer, bottoms, tops, [dy], params, algo=b_algo)
    return tops[0], bgrads, pgrads


# -- finite differences (float64) --------------------------------------------------------------

@pytest.mark.parametrize("type_name, shapes, cfg", [
    ("LayerNorm", [(2, 3, 5)], {}),
    ("LayerNorm", [(2, 3, 4)], dict(axis=1)),
    ("LayerNorm", [(4, 6)], dict(elementwise_affine=False)),
    ("GELU", [(3, 4, 5)], {}),
    ("GELU", [(3, 4, 5)], dict(approximate="tanh")),
    ("MatMul", [(2, 3, 4, 5), (2, 3, 5, 2)], {}),
    ("MatMul", [(2, 5, 4), (2, 3, 5)], dict(transpose_a=True, transpose_b=True)),
    ("MatMul", [(4, 5), (3, 5)], dict(transpose_b=True)),
    ("Permute", [(2, 3, 4, 5)], dict(order=[0, 2, 1, 3])),
    ("Softmax", [(2, 3, 4, 4)], dict(axis=-1, causal=True)),
    ("Softmax", [(2, 3, 6)], dict(axis=2, causal=True)),  # 3 queries over the last of 6 keys
    ("Parameter", [], dict(shape=[3, 4])),
    ("Parameter", [(5, 2)], dict(shape=[3, 4])),
    ("MultiHeadAttention", [(2, 7, 6)], dict(num_heads=2, query_block=3)),
    ("MultiHeadAttention", [(2, 7, 6)], dict(num_heads=3, causal=True, query_block=2)),
    ("MultiHeadAttention", [(1, 5, 4)], dict(num_heads=1, causal=True, bias_term=False)),
    ("MultiHeadAttention", [(2, 7, 6)], dict(num_heads=2, query_block=3, dropout_ratio=0.3)),
    ("MultiHeadAttention", [(1, 5, 4)], dict(num_heads=2, causal=True, query_block=2, dropout_ratio=0.5)),
])
def test_gradcheck(rng, type_name, shapes, cfg):
    layer, params = build(type_name, shapes, **cfg)
    bottoms = [rng.uniform(-2, 2, s) for s in shapes]
    gradcheck(layer, bottoms, params)  # every algorithm agrees; in place where declared


def test_embed_gradcheck(rng):
    layer, params = build("Embed", [(3, 5)], num_output=4, input_dim=7)
    ids = rng.integers(0, 7, (3, 5)).astype(np.float64)
    ids[0, :3] = 2  # a repeated id: its rows' gradients add up
    gradcheck(layer, [ids], params)


def test_embed_with_its_table_as_a_bottom_gradcheck(rng):
    """The table as a second bottom (a tied embedding): no weight of its own, the same rows
    looked up, and the table's gradient by finite differences."""
    layer, params = build("Embed", [(3, 5), (7, 4)], num_output=4, input_dim=7, bias_term=False)
    assert params == {}
    ids = rng.integers(0, 7, (3, 5)).astype(np.float64)
    ids[0, :3] = 2
    table = rng.standard_normal((7, 4))
    (y,) = forward(layer, [ids, table], params)
    np.testing.assert_array_equal(y, table[ids.astype(int)])
    gradcheck(layer, [ids, table], params)
    with pytest.raises(LayerError, match=r"the table \(bottom 2\) must be input_dim x num_output"):
        build("Embed", [(3, 5), (4, 7)], num_output=4, input_dim=7)


def test_softmax_with_loss_over_a_sequence_gradcheck(rng):
    layer, params = build("SoftmaxWithLoss", [(2, 5, 7), (2, 5)], axis=2)
    labels = rng.integers(-1, 7, (2, 5)).astype(np.float64)
    labels[0, 0] = 3
    gradcheck(layer, [rng.standard_normal((2, 5, 7)), labels], params)


# -- against PyTorch -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, tol", [(np.float32, 2e-5), (np.float64, 1e-12)])
def test_layer_norm_and_gelu_match_torch(rng, dtype, tol):
    x = rng.standard_normal((3, 4, 8)).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    layer, params = build("LayerNorm", [x.shape], dtype=dtype)
    y, (dx,), pg = run(layer, [x], params, dy)
    tx, tw, tb = (torch.tensor(v, requires_grad=True) for v in (x, params["weight"], params["bias"]))
    ty = F.layer_norm(tx, (8,), tw, tb, eps=1e-5)
    ty.backward(torch.tensor(dy))
    for ours, theirs in [(y, ty), (dx, tx.grad), (pg["weight"], tw.grad), (pg["bias"], tb.grad)]:
        np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=tol * 10, atol=tol * 10)
    for approximate in ("none", "tanh"):
        layer, params = build("GELU", [x.shape], dtype=dtype, approximate=approximate)
        y, (dx,), _ = run(layer, [x], params, dy)
        ty, (tdx,) = torch_run(functools.partial(F.gelu, approximate=approximate), [x], dy)
        np.testing.assert_allclose(y, ty, rtol=tol, atol=tol)
        np.testing.assert_allclose(dx, tdx, rtol=tol * 10, atol=tol * 10)


def test_embed_matches_torch(rng):
    layer, params = build("Embed", [(4, 6)], dtype=np.float32, num_output=5, input_dim=9)
    ids = rng.integers(0, 9, (4, 6)).astype(np.float32)
    dy = rng.standard_normal((4, 6, 5)).astype(np.float32)
    y, _, pg = run(layer, [ids], params, dy)
    w = torch.tensor(params["weight"], requires_grad=True)
    ty = F.embedding(torch.tensor(ids).long(), w) + torch.tensor(params["bias"])
    ty.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(pg["weight"], w.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pg["bias"], dy.sum((0, 1)), rtol=1e-5)


def test_embed_id_out_of_range_is_a_layer_error():
    layer, params = build("Embed", [(1, 2)], num_output=2, input_dim=3)
    with pytest.raises(LayerError, match=r"out of range \[0, 3\)"):
        forward(layer, [np.array([[0.0, 3.0]])], params)


def test_causal_softmax_and_sequence_loss_match_torch(rng):
    x = rng.standard_normal((2, 3, 5, 5))
    dy = rng.standard_normal(x.shape)
    layer, params = build("Softmax", [x.shape], axis=-1, causal=True)
    y, (dx,), _ = run(layer, [x], params, dy)
    mask = torch.ones(5, 5, dtype=torch.bool).triu(1)
    ty, (tdx,) = torch_run(lambda v: F.softmax(v.masked_fill(mask, float("-inf")), -1), [x], dy)
    np.testing.assert_allclose(y, ty, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(dx, tdx, rtol=1e-10, atol=1e-13)
    scores = rng.standard_normal((2, 6, 11))
    labels = rng.integers(0, 11, (2, 6)).astype(np.float64)
    labels[1, 2] = -1  # ignored
    layer, params = build("SoftmaxWithLoss", [scores.shape, labels.shape], axis=2)
    loss, (ds, _), _ = run(layer, [scores, labels], params, np.array(1.0))
    tl, (tds,) = torch_run(lambda s, lab: F.cross_entropy(s.transpose(1, 2), lab.long(), ignore_index=-1),
                           [scores, labels], np.array(1.0))
    np.testing.assert_allclose(loss, tl, rtol=1e-12)
    np.testing.assert_allclose(ds, tds, rtol=1e-10, atol=1e-13)


def test_causal_softmax_needs_the_last_axis():
    with pytest.raises(LayerError, match="causal needs the last axis"):
        build("Softmax", [(2, 4, 4)], axis=1, causal=True)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_torch_in_every_algorithm(rng, causal):
    n, t, d, h = 2, 9, 8, 2
    x = rng.standard_normal((n, t, d)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    layer, params = build("MultiHeadAttention", [x.shape], dtype=np.float32, num_heads=h,
                          causal=causal, query_block=4)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    tx = torch.tensor(x, requires_grad=True)
    # torch's reference: the projections by hand, scaled_dot_product_attention between them
    qkv = F.linear(tx, tp["in_weight"], tp["in_bias"]).view(n, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
    o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=causal)
    ty = F.linear(o.transpose(1, 2).reshape(n, t, d), tp["out_weight"], tp["out_bias"])
    ty.backward(torch.tensor(dy))
    # and torch.nn.MultiheadAttention's function, batch second
    tm, _ = F.multi_head_attention_forward(
        tx.detach().transpose(0, 1), tx.detach().transpose(0, 1), tx.detach().transpose(0, 1), d, h,
        tp["in_weight"].detach(), tp["in_bias"].detach(), None, None, False, 0.0,
        tp["out_weight"].detach(), tp["out_bias"].detach(), training=False, need_weights=False,
        attn_mask=torch.ones(t, t, dtype=torch.bool).triu(1) if causal else None)
    np.testing.assert_allclose(tm.transpose(0, 1).numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    algos = [(f, b) for f in ("full", "chunked") for b in ("full", "blocked")]
    assert [a.name for a in layer.algorithms("backward")] == ["full", "blocked"]
    for algo in algos:
        y, (dx,), pg = run(layer, [x], params, dy, algo=algo)
        np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=str(algo))
        np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=str(algo))
        for k in params:
            np.testing.assert_allclose(pg[k], tp[k].grad.numpy(), rtol=1e-4, atol=1e-4, err_msg=f"{algo} {k}")


def test_attention_blocked_algorithms_hold_no_square_of_the_sequence():
    layer, _ = build("MultiHeadAttention", [(4, 1024, 64)], dtype=np.float32, num_heads=4, query_block=64)
    full, blocked = layer.algorithms("backward")
    square = 4 * 4 * 1024 * 1024 * 4  # N * H * T^2 float32
    rows = 4 * 1024 * 64 * 4  # N * T * D float32
    assert full.workspace > 2 * square
    # two blocks of 64 queries' probabilities, and a dozen (N, T, D) arrays (q, k, v, their
    # gradients, the heads' outputs and gradients, dK and dV's block sums), the mask: no T^2 term
    assert blocked.workspace <= 2 * square * 64 // 1024 + 12 * rows + (1 << 17)
    assert layer.algorithms("forward")[1].workspace <= square * 64 // 1024 + 8 * rows + (1 << 17)


@pytest.mark.parametrize("type_name, shapes, cfg, message", [
    ("MatMul", [(2, 3, 4), (3, 4, 5)], {}, "differ in their stack dims"),
    ("MatMul", [(3, 4), (5, 6)], {}, "has 4 columns but op"),
    ("Permute", [(2, 3)], dict(order=[0, 0]), "not a permutation"),
    ("MultiHeadAttention", [(2, 3, 5)], dict(num_heads=2), "does not divide"),
    ("MultiHeadAttention", [(2, 5)], dict(num_heads=1), r"must be \(N, T, D\)"),
    ("LayerNorm", [(2, 3)], dict(axis=2), "out of range"),
    ("SoftmaxWithLoss", [(2, 3, 4), (2, 3)], dict(axis=3), "out of range"),
    ("SoftmaxWithLoss", [(2, 3, 4), (2, 4)], dict(axis=2), "hold 8 values"),
])
def test_bad_settings_are_layer_errors(type_name, shapes, cfg, message):
    with pytest.raises(LayerError, match=message):
        build(type_name, shapes, **cfg)


@pytest.mark.parametrize("type_name, shape, cfg, limit", [
    # attention: far below its (8, 4, 128, 128) probabilities (2 MiB), which live in the workspace
    ("MultiHeadAttention", (8, 128, 64), dict(num_heads=4, causal=True), 8 * 4 * 128 * 128 * 4 // 8),
    ("LayerNorm", (16, 256, 64), {}, 16 * 256 * 64 * 4 // 4),  # a quarter of the bottom
    ("GELU", (16, 256, 64), {}, 16 * 256 * 64 * 4 // 4),
])
def test_kernels_allocate_nothing_the_size_of_their_operands(rng, type_name, shape, cfg, limit):
    """Scratch comes from the workspace the algorithm declared: what the kernels allocate
    besides (tracemalloc) is bookkeeping."""
    layer, params = build(type_name, [shape], dtype=np.float32, **cfg)
    x = rng.standard_normal(shape).astype(np.float32)
    peak_allocation(layer, [x], params)  # first calls import and cache (SciPy's erf)
    assert peak_allocation(layer, [x], params) < limit


def test_attention_dropout_is_unbiased_and_off_in_testing(rng):
    """Dropout of the probabilities (a mask from the step's seed, every algorithm the same, as
    test_gradcheck checks): off in testing; in training a different output for each seed, whose
    mean over many seeds is the output without dropout (each kept weight is scaled by 1/(1-p))."""
    x = rng.standard_normal((2, 6, 4))
    plain, params = build("MultiHeadAttention", [x.shape], num_heads=2, query_block=4)
    layer, _ = build("MultiHeadAttention", [x.shape], num_heads=2, query_block=4, dropout_ratio=0.4)
    want = forward(plain, [x], params)[0]
    np.testing.assert_array_equal(forward(layer, [x], params, train=False)[0], want)
    runs = np.stack([forward(layer, [x], params, seed=s)[0] for s in range(600)])
    assert np.abs(runs[0] - runs[1]).max() > 0.1 and np.abs(runs[0] - want).max() > 0.1
    spread = runs.std(axis=0) / np.sqrt(len(runs))  # the mean's standard error
    assert np.all(np.abs(runs.mean(axis=0) - want) < 5 * spread + 1e-9)
    for algo in layer.algorithms("forward")[1:]:  # chunked draws the same mask as full
        np.testing.assert_allclose(forward(layer, [x], params, algo=algo, seed=3)[0], runs[3], rtol=1e-12)
