"""The memory-bound CPU kernels split over threads (superneuron.layers.parallel): BatchNorm,
Scale, ReLU, Eltwise SUM and Split give, with every split forced onto two threads, what they
give on one, bit for bit (so the policy-invariance of DESIGN.md holds at any thread count),
and allocate nothing big while they do. Their gradients and PyTorch agreement are checked in
tests/test_layers_misc.py."""

import numpy as np
import pytest
from layer_harness import backward, build, forward, gradcheck, peak_allocation

from superneuron.layers import parallel
from superneuron.layers.norm import BatchNorm

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


# Maps large enough for the CPU's fast paths (ReLU's zero rows with a remainder, BatchNorm's and
# Scale's per-channel sums as dot products with a row of ones over long rows): 143,360
# elements, more than ``activation.ROW`` and not a multiple of it
BIG = (4, 8, 64, 70)


def _torch_chain(kind):
    """The PyTorch function of a layer of ``kind`` and its parameter names."""
    import torch.nn.functional as F
    if kind == "BatchNorm":
        return (lambda t: F.batch_norm(t, None, None, training=True, eps=1e-5)), []
    if kind == "Scale":
        return (lambda t, w, b: t * w.reshape(1, -1, 1, 1) + b.reshape(1, -1, 1, 1)), ["weight", "bias"]
    return F.relu, []


@pytest.mark.parametrize("kind,cfg", [("BatchNorm", {}), ("Scale", dict(bias_term=True)), ("ReLU", {})])
def test_fast_paths_on_large_maps_match_pytorch(forced_splits, kind, cfg):
    """Float64 on two threads, every split forced: top, bottom and parameter gradients as
    PyTorch's autograd gives them."""
    import torch
    parallel.set_threads(2)
    layer, params = build(kind, [BIG], **cfg)
    rng = np.random.default_rng(3)
    x, dy = rng.standard_normal(BIG) * 2 + 0.5, rng.standard_normal(BIG)
    for name in ("weight", "bias"):
        if name in params:
            params[name][...] = rng.standard_normal(params[name].shape)
    tops = forward(layer, [x], params)
    (dx,), pg = backward(layer, [x], tops, [dy], params)
    fn, names = _torch_chain(kind)
    ts = [torch.tensor(x, requires_grad=True)] + [torch.tensor(params[k], requires_grad=True) for k in names]
    ty = fn(*ts)
    ty.backward(torch.tensor(dy))
    np.testing.assert_allclose(tops[0], ty.detach().numpy(), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(dx, ts[0].grad.numpy(), rtol=1e-8, atol=1e-10)
    for k, t in zip(names, ts[1:], strict=True):
        np.testing.assert_allclose(pg[k], t.grad.numpy(), rtol=1e-9)


@pytest.mark.parametrize("kind,cfg", [("BatchNorm", {}), ("Scale", dict(bias_term=True)), ("ReLU", {})])
def test_fast_paths_on_large_maps_same_bits_on_threads(forced_splits, kind, cfg):
    """Float32, large maps: one, two and three threads give the same bits."""
    results = []
    for threads in (1, 2, 3):
        parallel.set_threads(threads)
        layer, params = build(kind, [BIG], np.float32, **cfg)
        x = np.random.default_rng(1).standard_normal(BIG).astype(np.float32)
        dy = [np.random.default_rng(2).standard_normal(BIG).astype(np.float32)]
        results.append(_run(layer, [x], params, dy))
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


def test_relu_rows_give_maximum_exactly():
    """ReLU's zero-row kernel (parallel.max_zero) against ``np.maximum(x, 0)``, for sizes
    below, at and around multiples of its row, signed zeros and infinities included."""
    from superneuron.layers.parallel import ROW
    from superneuron.layers.parallel import max_zero as _relu
    rng = np.random.default_rng(4)
    for size in (1, ROW - 1, ROW, ROW + 1, 3 * ROW + 17):
        x = rng.standard_normal(size).astype(np.float32)
        x[:3] = [-0.0, np.inf, -np.inf][:min(3, size)] if size >= 3 else x[:3]
        y = np.full_like(x, np.nan)
        _relu(x, y)
        np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_numpy_settings_hold_for_the_block_and_this_thread_only():
    """The kernels' NumPy buffer size is set in the calling thread for the block, put back
    after it (an error included), and never seen by another thread; the pool's threads run
    with it."""
    import threading
    before = np.getbufsize()
    assert before != parallel.BUFSIZE
    seen = []
    with parallel.numpy_settings():
        assert np.getbufsize() == parallel.BUFSIZE
        other = threading.Thread(target=lambda: seen.append(np.getbufsize()))
        other.start()
        other.join()
    assert seen == [before] and np.getbufsize() == before
    with pytest.raises(RuntimeError), parallel.numpy_settings():
        raise RuntimeError
    assert np.getbufsize() == before
    threads = parallel.threads()
    parallel.set_threads(2)
    try:
        on_worker = []  # the second chunk runs on the pool's thread
        parallel.run(lambda a, b: a and on_worker.append(
            (threading.current_thread() is threading.main_thread(), np.getbufsize())), 2, parallel.MIN_CHUNK)
        assert on_worker == [(False, parallel.BUFSIZE)]
    finally:
        parallel.set_threads(threads)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_batchnorm_chunked_backward_gives_the_default_bits(monkeypatch, forced_splits, dtype, threads):
    """BatchNorm's backward ``chunked``: two channels' temporary at a time (the last chunk one
    channel), on one thread or split over two, gives the bits of ``default`` (every sum is a
    channel's own), in place or not, its workspace a fraction of ``default``'s; and it is
    offered only where a chunk is less than every channel."""
    shape = (4, 5, 6, 3)
    monkeypatch.setattr(BatchNorm, "CHUNK_BYTES", 2 * 4 * 6 * 3 * np.dtype(dtype).itemsize)
    parallel.set_threads(threads)
    layer, params = build("BatchNorm", [shape], dtype)
    default, chunked = layer.algorithms("backward")
    assert (default.name, chunked.name) == ("default", "chunked") and layer._chunk() == 2
    assert chunked.workspace < default.workspace / 2
    rng = np.random.default_rng(0)
    x, dy = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    tops = forward(layer, [x], params)
    for inplace in (False, True):
        ref = backward(layer, [x], tops, [dy], params, algo=default, inplace=inplace)[0][0]
        got = backward(layer, [x], tops, [dy], params, algo=chunked, inplace=inplace)[0][0]
        np.testing.assert_array_equal(got, ref)
    monkeypatch.setattr(BatchNorm, "CHUNK_BYTES", 1 << 30)
    assert [a.name for a in build("BatchNorm", [shape], dtype)[0].algorithms("backward")] == ["default"]


def test_batchnorm_chunked_backward_synchronised(monkeypatch):
    """Synchronised BatchNorm's backward (``ctx.ranks``: one rank here, whose sum over the ranks
    is its own) under ``chunked`` gives ``default``'s gradient: the sums taken a chunk of
    channels at a time."""
    from superneuron.layers.base import Context
    shape, dtype = (4, 5, 6, 3), np.float64
    monkeypatch.setattr(BatchNorm, "CHUNK_BYTES", 2 * 4 * 6 * 3 * 8)

    class OneRank:
        size = 1

        def sum(self, array, what):
            return array

    layer, params = build("BatchNorm", [shape], dtype)
    rng = np.random.default_rng(1)
    x, dy = (rng.standard_normal(shape) for _ in range(2))
    y = forward(layer, [x], params)[0]
    out = {}
    for algo in layer.algorithms("backward"):
        ctx = Context(np, workspace=np.empty(algo.workspace, np.uint8), algo=algo.name, ranks=OneRank())
        dx = np.empty(shape)
        layer.backward(ctx, [None], [y], [dy.copy()], [dx], params, {})
        out[algo.name] = dx
    np.testing.assert_allclose(out["chunked"], out["default"], rtol=1e-12, atol=1e-14)
    assert not np.array_equal(out["default"], np.zeros(shape))
