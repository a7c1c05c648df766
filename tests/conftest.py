"""Test configuration: GPU tests are skipped unless CuPy sees a CUDA device; each test that
draws random numbers gets a generator of its own (``rng``)."""

import numpy as np
import pytest

from superneuron.backend import gpu_available


def pytest_collection_modifyitems(config, items):
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
