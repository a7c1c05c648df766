"""Shared checks for layers: build one alone, run it with every algorithm, check its gradient by
finite differences in float64, its in-place form, and that its kernels allocate nothing big.

A layer test writes only the inputs and an expected value; see tests/test_layers_*.py."""

import tracemalloc

import numpy as np
import pytest
import torch

from superneuron.layers import layer_class
from superneuron.layers.base import Context
from superneuron.layers.fillers import fill


def build(type_name, bottom_shapes, dtype=np.float64, n_tops=None, seed=0, **raw):
    """A configured, set-up layer and its parameters (dict name → array, filled by its fillers)."""
    cls = layer_class(type_name)
    cfg = cls.config(raw)
    n_tops = cls.TOPS[0] if n_tops is None else n_tops
    layer = cls("L", [f"b{i}" for i in range(len(bottom_shapes))], [f"t{i}" for i in range(n_tops)],
                cfg, dtype=dtype)
    layer.bottom_shapes = [tuple(s) for s in bottom_shapes]
    layer.top_shapes = [tuple(s) for s in layer.setup(layer.bottom_shapes)]
    rng = np.random.default_rng(seed)
    params = {p.name: fill(rng, p.shape, p.filler, p.fan_in, p.fan_out, dtype) for p in layer.param_specs()}
    # Random non-trivial values even where the filler would give constants (bias = 0, etc.)
    for p in layer.param_specs():
        if p.learnable:
            params[p.name] = (params[p.name] + 0.1 * rng.standard_normal(p.shape)).astype(dtype)
    return layer, params


def _workspace(layer, phase, algo):
    return np.zeros(max(algo.workspace, 1), dtype=np.uint8)


def forward(layer, bottoms, params, algo=None, train=True, seed=1, inplace=False, feed=None):
    """Run the forward once and return the tops (new arrays)."""
    algo = algo or layer.algorithms("forward")[0]
    ctx = Context(np, train=train, workspace=_workspace(layer, "forward", algo), algo=algo.name,
                  seed=seed, feed=feed)
    bottoms = [np.array(b, dtype=b.dtype) for b in bottoms]
    tops = [np.full(s, np.nan, dtype=layer.dtype) for s in layer.top_shapes]
    if inplace:
        tops[0] = bottoms[0]
    layer.forward(ctx, bottoms, tops, params)
    return [np.array(t) for t in tops]


def backward(layer, bottoms, tops, top_grads, params, algo=None, seed=1, inplace=False, train=True):
    """Run the backward, handing ``None`` for every bottom and top it does not declare it reads.

    Returns ``(bottom_grads, param_grads)``; a bottom gradient is ``None`` for label bottoms."""
    algo = algo or layer.algorithms("backward")[0]
    ctx = Context(np, train=train, workspace=_workspace(layer, "backward", algo), algo=algo.name, seed=seed)
    reads_b, reads_t = layer.backward_reads()
    b_in = [np.array(b) if i in reads_b else None for i, b in enumerate(bottoms)]
    t_in = [np.array(t) if i in reads_t else None for i, t in enumerate(tops)]
    tg = [None if g is None else np.array(g) for g in top_grads]
    bg = [None if i in layer.LABEL_BOTTOMS else np.full(s, np.nan, dtype=layer.dtype)
          for i, s in enumerate(layer.bottom_shapes)]
    if inplace:
        bg[0] = tg[0]
    pg = {p.name: np.full(p.shape, np.nan, dtype=layer.dtype) for p in layer.param_specs() if p.learnable}
    layer.backward(ctx, b_in, t_in, tg, bg, params, pg)
    return [None if g is None else np.array(g) for g in bg], pg


def _objective_weights(layer, rng):
    return [rng.standard_normal(s) for s in layer.top_shapes]


def gradcheck(layer, bottoms, params, eps=1e-6, rtol=1e-5, atol=1e-7, seed=0, train=True, inplace=False):
    """Check every bottom and learnable parameter gradient against central finite differences of
    L = sum_i <w_i, top_i> along a random direction (float64; the layer must be deterministic
    for a fixed seed). Also checks that every algorithm agrees."""
    assert layer.dtype == np.float64
    rng = np.random.default_rng(seed)
    weights = _objective_weights(layer, rng)
    if layer.LOSS:
        weights = [np.asarray(rng.uniform(0.5, 2.0))]

    def objective(bs, ps):
        tops = forward(layer, bs, ps, train=train)
        return sum(float(np.sum(w * t)) for w, t in zip(weights, tops))

    tops = forward(layer, bottoms, params, train=train)
    top_grads = [np.array(w, dtype=layer.dtype) for w in weights]
    bgrads, pgrads = backward(layer, bottoms, tops, top_grads, params, train=train)
    for i, b in enumerate(bottoms):
        if i in layer.LABEL_BOTTOMS:
            continue
        v = rng.standard_normal(b.shape)
        plus = [x + eps * v if j == i else x for j, x in enumerate(bottoms)]
        minus = [x - eps * v if j == i else x for j, x in enumerate(bottoms)]
        numeric = (objective(plus, params) - objective(minus, params)) / (2 * eps)
        analytic = float(np.sum(bgrads[i] * v))
        assert np.isclose(analytic, numeric, rtol=rtol, atol=atol), \
            f"{layer.type}: bottom {i} gradient {analytic} vs finite difference {numeric}"
    for p in layer.param_specs():
        if not p.learnable:
            continue
        v = rng.standard_normal(p.shape)
        numeric = (objective(bottoms, dict(params, **{p.name: params[p.name] + eps * v}))
                   - objective(bottoms, dict(params, **{p.name: params[p.name] - eps * v}))) / (2 * eps)
        analytic = float(np.sum(pgrads[p.name] * v))
        assert np.isclose(analytic, numeric, rtol=rtol, atol=atol), \
            f"{layer.type}: param {p.name} gradient {analytic} vs finite difference {numeric}"
    check_algorithms(layer, bottoms, params, train=train)
    if inplace or layer.INPLACE:
        check_inplace(layer, bottoms, params, train=train)
    check_grad_inplace(layer, bottoms, params, train=train)
    return tops, bgrads, pgrads


def check_grad_inplace(layer, bottoms, params, train=True, top_grads=None):
    """Each pair of ``layer.grad_inplace()`` and each bottom of ``layer.grad_over_bottom()``,
    under every backward algorithm: the bottom gradient written over the top gradient's memory,
    or over the bottom's own, gives the same bits as in its own."""
    rng = np.random.default_rng(5)
    tops = forward(layer, bottoms, params, train=train)
    tg = top_grads or [rng.standard_normal(s).astype(layer.dtype) for s in layer.top_shapes]
    reads_b, reads_t = layer.backward_reads()
    t_in = [np.array(t) if i in reads_t else None for i, t in enumerate(tops)]
    shared = [("top", b, t) for b, t in layer.grad_inplace()] + [("bottom", b, b) for b in layer.grad_over_bottom()]
    for algo in layer.algorithms("backward"):
        results = []
        for pair in [None] + shared:
            ctx = Context(np, train=train, workspace=_workspace(layer, "backward", algo), algo=algo.name, seed=1)
            given = [g.copy() for g in tg]
            b_in = [np.array(b) if i in reads_b else None for i, b in enumerate(bottoms)]
            bg = [None if i in layer.LABEL_BOTTOMS else np.full(s, np.nan, dtype=layer.dtype)
                  for i, s in enumerate(layer.bottom_shapes)]
            if pair is not None:
                over, b, t = pair
                bg[b] = given[t] if over == "top" else b_in[b]
                assert bg[b] is not None, f"{layer.type}: the backward does not read bottom {b}"
            pg = {p.name: np.full(p.shape, np.nan, dtype=layer.dtype) for p in layer.param_specs() if p.learnable}
            layer.backward(ctx, b_in, t_in, given, bg, params, pg)
            results.append(([None if g is None else g.copy() for g in bg], pg))
        for pair, (bg, pg) in zip(shared, results[1:]):
            for a, b in zip(results[0][0], bg):
                if a is not None:
                    np.testing.assert_array_equal(b, a, err_msg=f"{layer.type} {algo.name} gradient over {pair}")
            for k in pg:
                np.testing.assert_array_equal(pg[k], results[0][1][k], err_msg=f"{layer.type} {algo.name} {pair}")


def check_algorithms(layer, bottoms, params, train=True, rtol=1e-10, atol=1e-12):
    """Every forward and backward algorithm gives the same result as the first."""
    rng = np.random.default_rng(3)
    ref = forward(layer, bottoms, params, train=train)
    tg = [rng.standard_normal(s).astype(layer.dtype) for s in layer.top_shapes]
    ref_b = backward(layer, bottoms, ref, tg, params, train=train)
    for algo in layer.algorithms("forward")[1:]:
        out = forward(layer, bottoms, params, algo=algo, train=train)
        for a, b in zip(ref, out):
            np.testing.assert_allclose(b, a, rtol=rtol, atol=atol, err_msg=f"forward algo {algo.name}")
    for algo in layer.algorithms("backward")[1:]:
        bg, pg = backward(layer, bottoms, ref, tg, params, algo=algo, train=train)
        for a, b in zip(ref_b[0], bg):
            if a is not None:
                np.testing.assert_allclose(b, a, rtol=rtol, atol=atol, err_msg=f"backward algo {algo.name}")
        for k in pg:
            np.testing.assert_allclose(pg[k], ref_b[1][k], rtol=rtol, atol=atol, err_msg=f"backward algo {algo.name}")


def check_inplace(layer, bottoms, params, train=True):
    """An in-place layer gives the same tops and gradients with top == bottom."""
    assert layer.INPLACE
    assert 0 not in layer.backward_reads()[0], "an in-place layer's backward cannot read bottom 0"
    rng = np.random.default_rng(4)
    ref = forward(layer, bottoms, params, train=train)
    got = forward(layer, bottoms, params, train=train, inplace=True)
    np.testing.assert_array_equal(got[0], ref[0])
    tg = [rng.standard_normal(s).astype(layer.dtype) for s in layer.top_shapes]
    ref_b, ref_p = backward(layer, bottoms, ref, tg, params, train=train)
    got_b, got_p = backward(layer, bottoms, ref, tg, params, train=train, inplace=True)
    np.testing.assert_array_equal(got_b[0], ref_b[0])
    for k in ref_p:
        np.testing.assert_array_equal(got_p[k], ref_p[k])


def peak_allocation(layer, bottoms, params, train=True):
    """Largest number of bytes traced by tracemalloc while the forward and the backward kernels run
    (operands and workspace are made beforehand, as the arena would hold them)."""
    f_algo, b_algo = layer.algorithms("forward")[0], layer.algorithms("backward")[0]
    bottoms = [np.array(b) for b in bottoms]
    tops = [np.zeros(s, dtype=layer.dtype) for s in layer.top_shapes]
    tg = [np.ones(s, dtype=layer.dtype) for s in layer.top_shapes]
    bg = [None if i in layer.LABEL_BOTTOMS else np.zeros(s, dtype=layer.dtype)
          for i, s in enumerate(layer.bottom_shapes)]
    pg = {p.name: np.zeros(p.shape, dtype=layer.dtype) for p in layer.param_specs() if p.learnable}
    fctx = Context(np, train=train, workspace=_workspace(layer, "forward", f_algo), algo=f_algo.name, seed=1)
    bctx = Context(np, train=train, workspace=_workspace(layer, "backward", b_algo), algo=b_algo.name, seed=1)
    tracemalloc.start()
    try:
        layer.forward(fctx, bottoms, tops, params)
        if layer.BACKWARD:
            layer.backward(bctx, bottoms, tops, tg, bg, params, pg)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def only(layer, name):
    """Make ``name`` the layer's only algorithm (peak_allocation runs the first one)."""
    every = type(layer).algorithms
    layer.algorithms = lambda phase: [a for a in every(layer, phase) if a.name == name]
    return layer


def run_with_workspace(layer, phase, algo, nbytes, x, params):
    """Run one phase with a workspace of exactly ``nbytes`` (the bottom gradient requested)."""
    ctx = Context(np, workspace=np.zeros(nbytes, dtype=np.uint8), algo=algo)
    top = np.zeros(layer.top_shapes[0], dtype=layer.dtype)
    if phase == "forward":
        return layer.forward(ctx, [x], [top], params)
    layer.forward(Context(np, workspace=np.zeros(1 << 20, np.uint8)), [x], [top], params)
    grads = {k: np.zeros_like(v) for k, v in params.items()}
    layer.backward(ctx, [x], [top], [np.ones_like(top)], [np.zeros_like(x)], params, grads)


def assert_workspace_exact(layer, x, params):
    """Each algorithm runs in the workspace it declares and fails with one byte less."""
    for phase in ("forward", "backward"):
        for algo in layer.algorithms(phase):
            run_with_workspace(layer, phase, algo.name, algo.workspace, x, params)
            if algo.workspace:
                with pytest.raises(AssertionError, match="exceeds workspace"):
                    run_with_workspace(layer, phase, algo.name, algo.workspace - 1, x, params)


def torch_grads(fn, x, params, dy):
    """Top, bottom gradient and parameter gradients of ``fn(x, **params)`` by torch autograd."""
    tx = torch.tensor(x, requires_grad=True)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    y = fn(tx, **tp)
    y.backward(torch.tensor(dy))
    return y.detach().numpy(), tx.grad.numpy(), {k: v.grad.numpy() for k, v in tp.items()}
