"""The float64 check of --profile (runtime/profile.py): each algorithm of a layer with a choice
runs once against the layer's reference algorithm in float64 on the same inputs; the real ones
(im2col, Winograd, ...) pass, a wrong one is rejected, cached with its verdict, never planned
and named by sn-plan; a cache written before the check is measured again."""

import json
import math
import os
import textwrap

import numpy as np
import pytest

from superneuron.backend import Backend
from superneuron.cli.plan import main
from superneuron.graph import Graph
from superneuron.layers import layer_class
from superneuron.netfile.spec import loads_spec
from superneuron.runtime import profile
from superneuron.runtime.profile import check_algorithms, load_or_measure
from superneuron.scheduler.cost import CACHE_FORMAT, CostModel, cache_path, cached, entry_key, table_of
from superneuron.scheduler.lower import lower
from superneuron.scheduler.workspace import choose_workspaces

NET = """\
name: check
input: {data: [2, 3, 8, 8], label: [2]}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3, pad: 1}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: fc, type: InnerProduct, bottom: conv1, top: fc, num_output: 3}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
"""


def graph():
    return Graph(loads_spec(NET))


def conv(g):
    return g.nodes[[n.name for n in g.nodes].index("conv1")].layer


@pytest.fixture
def wrong(monkeypatch):
    """``wrong(forward, backward)``: the convolution's algorithms for which ``forward(name)``
    holds give outputs 0.1 % off, and those for which ``backward(name)`` holds leave their
    gradients unwritten, on the device (the host's reference runs have no backend)."""
    cls = layer_class("Convolution")
    forward, backward = cls.forward, cls.backward

    def make(bad_forward, bad_backward=lambda name: False):
        def off(self, ctx, bottoms, tops, params):
            forward(self, ctx, bottoms, tops, params)
            if ctx.backend is not None and bad_forward(ctx.algo):
                tops[0] *= 1.001

        def unwritten(self, ctx, *operands):
            if ctx.backend is None or not bad_backward(ctx.algo):
                backward(self, ctx, *operands)
        monkeypatch.setattr(cls, "forward", off)
        monkeypatch.setattr(cls, "backward", unwritten)
    return make


def planned(g, table, phase):
    """The algorithm the workspace pass gives conv1's ``phase`` under the measured ``table``."""
    schedule = choose_workspaces(lower(g), costs=CostModel("cpu", table))
    index = [n.name for n in g.nodes].index("conv1")
    return next(s.algorithm for s in schedule.steps if s.node == index and s.kind == phase)


def test_real_algorithms_pass_and_wrong_ones_are_rejected_and_never_planned(wrong):
    wrong(lambda name: name == "direct", lambda name: name == "direct")
    g = graph()
    layer = conv(g)
    names = {p: [a.name for a in layer.algorithms(p)] for p in ("forward", "backward")}
    assert "winograd" in names["forward"] and "direct" in names["forward"], names
    checks = check_algorithms(g, Backend())
    for phase, algos in names.items():
        for name in algos:
            error, tolerance = checks[entry_key(layer, name, phase)]
            if name == "direct":
                assert not error <= tolerance, (phase, error)
            else:
                assert error <= tolerance == profile.FLOOR, (phase, name, error)
    assert checks[entry_key(layer, "direct", "forward")][0] == pytest.approx(1e-3, rel=0.01)
    assert checks[entry_key(layer, "direct", "backward")][0] == math.inf  # NaN left in its outputs
    # the rejected algorithm, the fastest measured, is what the pass takes without the check
    costs = {key: 1e-6 if "|direct|" in key else 1.0 for key in checks}
    for phase in ("forward", "backward"):
        assert planned(g, table_of({"costs": costs}), phase) == "direct"
        assert planned(g, table_of({"costs": costs, "checks": checks}), phase) != "direct"
        model = CostModel("cpu", table_of({"costs": costs, "checks": checks}))
        assert "direct" not in [a.name for a in model.algorithms(layer, phase)]


def test_a_step_lowered_with_a_rejected_default_moves_to_the_one_kept(wrong):
    wrong(lambda name: name != "im2col_chunked")
    g = graph()
    layer = conv(g)
    assert layer.algorithms("forward")[0].name != "im2col_chunked"  # the default the step is lowered with
    checks = {k: v for k, v in check_algorithms(g, Backend()).items() if k.endswith("|forward")}
    model = CostModel("cpu", table_of({"costs": dict.fromkeys(checks, 1.0), "checks": checks}))
    assert [a.name for a in model.algorithms(layer, "forward")] == ["im2col_chunked"]
    assert planned(g, model.table, "forward") == "im2col_chunked"


def test_the_tolerance_follows_the_reference_algorithms_own_rounding(monkeypatch):
    """Beyond the floor, an algorithm may round up to ROUNDING times what the reference rounds
    in float32 at that size; the real algorithms are well within it."""
    monkeypatch.setattr(profile, "FLOOR", 0.0)
    for error, tolerance in check_algorithms(graph(), Backend()).values():
        assert 1e-8 < tolerance < 2e-5 and error <= tolerance


def test_the_cache_keeps_the_verdicts_and_an_older_cache_is_measured_again(wrong, tmp_path, monkeypatch):
    monkeypatch.setenv("SN_CACHE_DIR", str(tmp_path))
    wrong(lambda name: name == "direct", lambda name: name == "direct")
    g, backend = graph(), Backend()
    first = load_or_measure(g, backend)
    assert first.measured and [r[:3] for r in first.rejected] == [("conv1", "direct", "backward"),
                                                                  ("conv1", "direct", "forward")]
    assert first.table[entry_key(conv(g), "direct", "forward")] == math.inf
    second = load_or_measure(g, backend)
    assert not second.measured and second.rejected == first.rejected and second.table == first.table
    with open(first.path) as f:
        data = json.load(f)
    assert data["format"] == CACHE_FORMAT and set(data["checks"]) < set(data["costs"])
    # a file of the first format (times alone, unchecked) is not trusted: measured again
    with open(cache_path(g, "cpu"), "w") as f:
        json.dump({"device": "cpu", "costs": data["costs"]}, f)
    assert cached(g, "cpu") is None
    again = load_or_measure(g, backend)
    assert again.measured and again.rejected[0][:3] == ("conv1", "direct", "backward")
    assert cached(g, "cpu")["format"] == CACHE_FORMAT


def test_sn_plan_profile_names_the_rejected_algorithms(wrong, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SN_CACHE_DIR", str(tmp_path / "cache"))
    wrong(lambda name: name == "direct")
    path = tmp_path / "check.yaml"
    path.write_text(textwrap.dedent(NET))
    assert main([str(path), "--profile"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("rejected")]
    assert len(lines) == 1 and "conv1 direct forward (1.0e-03 > 2.0e-05)" in lines[0], lines
    assert main([str(path), "--profile", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)["profile"]
    assert not info["measured"] and [r[:3] for r in info["rejected"]] == [["conv1", "direct", "forward"]]


def test_sn_train_profile_names_them_and_trains_on(wrong, tmp_path, monkeypatch, capsys):
    from superneuron.cli.train import main as train
    monkeypatch.setenv("SN_CACHE_DIR", str(tmp_path / "cache"))
    wrong(lambda name: name == "direct")
    tiny = os.path.join(os.path.dirname(__file__), "nets", "tiny.yaml")
    assert train([tiny, "--iters", "1", "--test-interval", "0", "--profile"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("rejected")]
    assert len(lines) == 1 and "conv1 direct forward" in lines[0] and "branch_b direct forward" in lines[0]


def test_relative_error_of_unwritten_and_zero_outputs():
    exact = np.zeros(3)
    assert profile.relative_error(np.zeros(3, np.float32), exact) == 0.0
    assert profile.relative_error(np.array([0, 0, 1e-3]), exact) == 1e-3  # absolute where exact is 0
    assert profile.relative_error(np.array([0, np.nan, 0]), np.ones(3)) == math.inf
