"""The GPU check's cases, checked on the CPU (tests/gpu_cases.py): every registered layer type
has a case or a reason, and every case runs here with values in its domain, so the one GPU
call a session gets never fails on a case written wrong."""

import numpy as np
import pytest
from gpu_cases import EXCLUDED, MORE_CASES, build_case, inputs_of, run_case
from test_gpu import CASES

from superneuron.backend import get_backend
from superneuron.layers import REGISTRY


def test_every_layer_type_has_a_gpu_case_or_a_reason():
    covered = {c[0] for c in CASES + MORE_CASES}
    public = {t for t, cls in REGISTRY.items() if not cls.__dict__.get("INTERNAL", False)}
    assert not covered & set(EXCLUDED), covered & set(EXCLUDED)
    missing = sorted(public - covered - set(EXCLUDED))
    assert not missing, f"no GPU case for {missing}: add one to tests/gpu_cases.py (or a reason)"


@pytest.mark.parametrize("case", MORE_CASES, ids=[f"{c[0]}-{k}" for k, c in enumerate(MORE_CASES)])
def test_each_case_runs_on_numpy_with_finite_values(case):
    layer, params = build_case(case)
    bottoms = inputs_of(case, np.random.default_rng(1))
    tops, grads, pgrads = run_case(layer, params, bottoms, np, get_backend("cpu"))
    assert tops and all(np.isfinite(t).all() for t in tops + grads + list(pgrads.values())), case[0]
    if layer.BACKWARD and case[0] != "Threshold":  # (its derivative is zero) something flows back:
        # the comparison on the GPU checks a backward
        assert any(np.abs(g).max() > 0 for g in grads + list(pgrads.values())), case[0]
