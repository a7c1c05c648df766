"""The memory-bound CPU kernels split over threads (superneuron.layers.parallel): BatchNorm,
Scale, ReLU, Eltwise SUM and Split give, with every split forced onto two threads, what they
give on one, bit for bit (so the policy-invariance of DESIGN.md holds at any thread count),
and allocate nothing big while they do. Their gradients and PyTorch agreement are checked in
tests/test_layers_misc.py."""

import numpy as np
import pytest
from layer_harness import backward, build, forward, gradcheck, peak_allocation

from superneuron.layers import parallel

KIB = 1024

CASES = [
    ("BatchNorm", [(4, 6, 5, 3)], {}),
    ("BatchNorm", [(5, 7)], dict(eps=1e-3)),
    ("Scale", [(4, 6, 5, 3)], dict(bias_term=True)),
    ("Scale", [(4, 6, 5, 3)], {}),
    ("ReLU", [(4, 6, 5, 3)], {}),
    ("ReLU", [(4, 6, 5, 3)], dict(negative_slope=0.1)),
    ("Eltwise", [(4, 6, 5, 3)] * 2, {}),
    ("Eltwise", [(4, 6, 5, 3)] * 3, dict(coeff=[1, -1, 0.5])),
]


@pytest.fixture
def forced_splits(monkeypatch):
    """Every kernel split as far as it goes; the thread count put back afterwards."""
    monkeypatch.setattr(parallel, "MIN_CHUNK", 1)
    before = parallel.threads()
    yield
    parallel.set_threads(before)


def _run(layer, bottoms, params, dy):
    tops = forward(layer, bottoms, params)
    state = {k: v.copy() for k, v in params.items()}  # BatchNorm's statistics move
    bg, pg = backward(layer, bottoms, tops, dy, params)
    return tops + [g for g in bg if g is not None] + list(pg.values()) + list(state.values())


@pytest.mark.parametrize("type_name,shapes,cfg", CASES)
def test_threads_give_the_same_bits(forced_splits, type_name, shapes, cfg):
    rng = np.random.default_rng(0)
    results = []
    for threads in (1, 2, 3):
        parallel.set_threads(threads)
        layer, params = build(type_name, shapes, np.float32, **cfg)
        bottoms = [np.random.default_rng(1 + i).standard_normal(s).astype(np.float32)
                   for i, s in enumerate(shapes)]
        dy = [rng.standard_normal(s).astype(np.float32) for s in layer.top_shapes]
        rng = np.random.default_rng(0)
        results.append(_run(layer, bottoms, params, dy))
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("type_name,shapes,cfg", CASES[::2])
def test_split_kernels_gradients(forced_splits, type_name, shapes, cfg):
    parallel.set_threads(2)
    layer, params = build(type_name, shapes, **cfg)
    rng = np.random.default_rng(2)
    gradcheck(layer, [rng.standard_normal(s) for s in shapes], params)


@pytest.mark.parametrize("n_tops", [2, 3])
def test_split_backward_sums_on_threads(forced_splits, n_tops):
    parallel.set_threads(2)
    layer, params = build("Split", [(4, 6, 5, 3)], np.float32, n_tops=n_tops)
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal((4, 6, 5, 3)).astype(np.float32) for _ in range(n_tops)]
    bg, _ = backward(layer, [None], [None] * n_tops, grads, params)
    expected = grads[0] + grads[1]
    for g in grads[2:]:
        expected += g
    np.testing.assert_array_equal(bg[0], expected)


def test_eltwise_sum_gradient_sharing_top_gradient():
    """An Eltwise SUM whose bottom gradient is the top gradient's memory leaves it as it is."""
    layer, params = build("Eltwise", [(3, 4)] * 2, np.float32)
    from superneuron.layers.base import Context
    dy = np.arange(12, dtype=np.float32).reshape(3, 4)
    other = np.full((3, 4), np.nan, np.float32)
    layer.backward(Context(np), [None, None], [None], [dy], [dy, other], params, {})
    np.testing.assert_array_equal(dy, np.arange(12, dtype=np.float32).reshape(3, 4))
    np.testing.assert_array_equal(other, dy)


@pytest.mark.parametrize("type_name,cfg", [("BatchNorm", {}), ("Scale", dict(bias_term=True)),
                                           ("ReLU", {}), ("Eltwise", {})])
def test_split_kernels_allocate_nothing_big(forced_splits, type_name, cfg):
    parallel.set_threads(2)
    shape = (8, 16, 64, 64)  # 2 MiB of float32
    n = 2 if type_name == "Eltwise" else 1
    layer, params = build(type_name, [shape] * n, np.float32, **cfg)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    assert peak_allocation(layer, [x] * n, params) < 256 * KIB


def test_chunks_cover_the_range_once():
    for length in (1, 2, 7, 64, 1000):
        for parts in (1, 2, 3, 16):
            spans = parallel.chunks(length, 1 << 20, parts)
            assert spans[0][0] == 0 and spans[-1][1] == length
            assert all(a < b for a, b in spans) and len(spans) == min(parts, length)
            assert all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1))
    assert parallel.chunks(1000, 1) == [(0, 1000)]  # too little work to split
