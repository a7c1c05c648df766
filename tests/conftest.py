"""Test configuration: GPU tests are skipped unless CuPy sees a CUDA device."""

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
