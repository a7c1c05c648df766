"""layers/parallel.py: GEMMs split over the pool, and BLAS held to one thread in an iteration."""

import time

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from superneuron.layers import parallel


@pytest.fixture
def two_threads(monkeypatch):
    before = parallel.threads()
    monkeypatch.setattr(parallel, "MIN_CHUNK", 1)  # every split taken
    parallel.set_threads(2)
    yield
    parallel.set_threads(before)


@pytest.mark.parametrize("a_shape,b_shape,transpose_b", [
    ((16, 144), (144, 4097), False),     # more columns than rows: split by columns
    ((300, 20), (20, 7), False),         # more rows: split by rows
    ((3, 8, 40), (3, 40, 513), True),    # stacks, b a transposed (strided) view
    ((1, 5), (5, 1), False),             # too small to split
])
def test_matmul_split_matches_numpy(two_threads, a_shape, b_shape, transpose_b):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    if transpose_b:
        b = np.ascontiguousarray(np.swapaxes(b, -1, -2)).swapaxes(-1, -2)
    out = np.full(np.matmul(a, b).shape, np.nan, np.float32)
    parallel.matmul(np, a, b, out)
    expected = np.matmul(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def blas_threads():
    return {info["filepath"]: info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"}


def test_numpy_settings_hold_blas_to_one_thread_and_give_it_back():
    """Every BLAS loaded when the kernels first ran (NumPy's among them) runs one thread per
    call inside, and gets its thread count back after."""
    np.matmul(np.ones((2, 2)), np.ones((2, 2)))
    with parallel.numpy_settings():
        pass
    before = blas_threads()
    held = {lib.filepath for lib in parallel._blas[0].lib_controllers if lib.user_api == "blas"}
    assert held and held <= set(before)
    assert any("numpy" in path for path in held) or not any("numpy" in path for path in before)
    with parallel.numpy_settings():
        inside = blas_threads()
        assert all(inside[path] == 1 for path in held), inside
        assert np.getbufsize() == parallel.BUFSIZE
        assert set(np.geterr().values()) == {"ignore"}  # the trainer names a non-finite loss
    assert blas_threads() == before


@pytest.mark.parametrize("pool,cfg", [("MAX", dict(kernel_size=2, stride=2)),
                                      ("MAX", dict(kernel_size=3, stride=2, pad=1)),
                                      ("AVE", dict(kernel_size=3, stride=1, pad=1))])
def test_pooling_split_over_samples_gives_the_same_bits(monkeypatch, pool, cfg):
    from layer_harness import backward, build, forward
    shape = (6, 3, 9, 9)
    layer, params = build("Pooling", [shape], np.float32, pool=pool, **cfg)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    x[:, :, ::3, ::3] = x[:, :, 1::3, 1::3]  # ties: the first maximum must win on every thread
    dy = rng.standard_normal(layer.top_shapes[0]).astype(np.float32)
    monkeypatch.setattr(parallel, "MIN_CHUNK", 1)
    before, out = parallel.threads(), []
    try:
        for count in (1, 3):
            parallel.set_threads(count)
            y = forward(layer, [x], params)[0]
            out.append((y, backward(layer, [x], [y], [dy], params)[0][0]))
    finally:
        parallel.set_threads(before)
    for a, b in zip(*out, strict=True):
        np.testing.assert_array_equal(a, b)


def test_run_covers_the_range_once_and_nests_inline(two_threads):
    """Every index is handed to exactly one chunk, on two threads; a split inside a split
    (the pool busy) runs inline rather than waiting on itself."""
    import threading
    hits, inner = np.zeros(10, int), []

    def kernel(a, b):
        hits[a:b] += 1
        parallel.run(lambda c, d: inner.append((c, d, threading.current_thread().name)), 4)
    parallel.run(kernel, 10)
    assert hits.tolist() == [1] * 10
    assert sorted(c for c, d, _ in inner) == [0, 0] and all(d == 4 for _, d, _ in inner)
    assert len({name for _, _, name in inner}) == 2  # one chunk ran on the worker


def test_an_error_on_a_worker_reaches_the_caller_and_the_pool_goes_on(two_threads):
    def kernel(a, b):
        if a:  # the worker's chunk
            raise ValueError(f"chunk {a}:{b}")
    with pytest.raises(ValueError, match="chunk 5:10"):
        parallel.run(kernel, 10)
    out = np.zeros(10)
    parallel.run(lambda a, b: out.__setitem__(slice(a, b), 1), 10)
    assert out.tolist() == [1] * 10


def test_a_forked_child_splits_on_workers_of_its_own(two_threads):
    """After a fork the parent's kernel threads are gone from the child: its first split makes
    new ones rather than waiting forever on the parent's."""
    import os
    out = np.zeros(10)
    parallel.run(lambda a, b: out.__setitem__(slice(a, b), 1), 10)  # the parent's workers exist
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if a split completes
        try:
            got = np.zeros(10)
            parallel.run(lambda a, b: got.__setitem__(slice(a, b), 2), 10)
            os._exit(0 if got.tolist() == [2] * 10 else 1)
        finally:
            os._exit(2)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the child's split never ended")
    assert os.waitstatus_to_exitcode(status) == 0
