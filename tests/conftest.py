"""Test configuration: GPU tests are skipped unless CuPy sees a CUDA device; each test that
draws random numbers gets a generator of its own (``rng``)."""

import numpy as np
import pytest

from superneuron.backend import gpu_available


def pytest_collection_modifyitems(config, items):
    # the long tests (marked slow) start first: with pytest-xdist the others then fill the
    # workers around them, instead of one long test left running alone at the end
    items.sort(key=lambda item: "slow" not in item.keywords)
    ok, why = gpu_available()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"no usable GPU ({why})")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng(request):
    """A fresh generator for this test, seeded by its module's ``RNG_SEED`` (default 0): what a
    test draws never depends on which tests ran before it, in this process or this worker."""
    return np.random.default_rng(getattr(request.module, "RNG_SEED", 0))


@pytest.fixture(autouse=True)
def no_kept_plans():
    """Each test plans as a fresh process does: the optimal policy's plans of smaller budgets,
    kept for a larger one (scheduler/optimal_monotone.py), would outlive a test's monkeypatches."""
    from superneuron.scheduler.optimal_monotone import SMALLER
    SMALLER.nets.clear()
    yield
    SMALLER.nets.clear()


@pytest.fixture
def threads(request, monkeypatch):
    """Run with ``request.param`` threads (parametrize it ``indirect``), every kernel split as
    far as it goes (layers/parallel.py); the thread count put back afterwards."""
    from superneuron.layers import parallel
    monkeypatch.setattr(parallel, "MIN_CHUNK", 1)
    before = parallel.threads()
    parallel.set_threads(request.param)
    yield request.param
    parallel.set_threads(before)
