"""sn-depth: the search finds exactly the deepest fitting ResNet, its figures are the
Simulator's, and --verify runs the depth found with the planned peak to the byte."""

import json
import math

import pytest

from superneuron.cli.depth import main
from superneuron.depth import MIN_BLOCKS, Planner, blocks_of, deepest, depth_of, search
from superneuron.errors import SNError
from superneuron.graph import Graph
from superneuron.optim import SolverConfig, make_optimizer
from superneuron.scheduler.cost import CostModel
from superneuron.scheduler.lower import lower
from superneuron.scheduler.policy import POLICIES, apply_policy
from superneuron.scheduler.simulate import simulate
from superneuron.spec import load_spec

NET = "nets/resnet.yaml"
SMALL = {"size": 32, "classes": 10}  # with batch 2: plans in tens of milliseconds
SMALL_ARGS = ["--batch", "2", "--size", "32", "--set", "classes=10"]


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def arena(policy, blocks, budget=None):
    """The arena bytes of ``blocks`` blocks under ``policy``, planned without the Planner."""
    spec = load_spec(NET, overrides={**SMALL, "depth": depth_of(blocks), "blocks": [3, 8, blocks - 14, 3]},
                     batch=2)
    schedule = lower(Graph(spec), train=True, optimizer=make_optimizer(SolverConfig()))
    plan = simulate(apply_policy(schedule, policy, budget=budget, costs=CostModel("cpu")))
    return plan


# -- the search on made-up memory curves ----------------------------------------------------

class Fake:
    """A plan whose arena is ``need(blocks)``."""

    def __init__(self, blocks, need, budget):
        self.blocks, self.arena_bytes = blocks, need(blocks)
        self.fits = self.arena_bytes <= budget


def drive(need, budget, max_blocks):
    """Run :func:`search` against ``need``; its answer and the blocks it asked for."""
    s = search(budget, max_blocks)
    asked = [next(s)]
    try:
        while True:
            asked.append(s.send(Fake(asked[-1], need, budget)))
    except StopIteration as stop:
        return stop.value, asked


CURVES = {  # monotone in the blocks, as the search assumes; linear, concave, convex, stepped
    "linear": lambda n: 1000 + 37 * n,
    "sqrt": lambda n: int(5000 * math.sqrt(n)),
    "square": lambda n: 3 * n * n,
    "steps": lambda n: 1000 * (n // 50),
    "flat then steep": lambda n: 100 if n < 700 else 100 + 10**6 * (n - 699),
}


@pytest.mark.parametrize("curve", CURVES)
def test_search_finds_exactly_the_last_fitting_blocks(curve):
    need, max_blocks = CURVES[curve], 5000
    for budget in sorted({need(n) + d for n in (16, 17, 40, 333, 699, 700, 1234, 4999) for d in (-1, 0, 1)}):
        (best, over, at_cap, probes), asked = drive(need, budget, max_blocks)
        fitting = [n for n in range(MIN_BLOCKS, max_blocks + 1) if need(n) <= budget]
        expected = max(fitting, default=None)
        assert (best.blocks if best else None) == expected, (budget, asked)
        assert at_cap == (expected == max_blocks)
        assert over is None if at_cap else over.blocks == (expected + 1 if best else MIN_BLOCKS)
        assert len(set(asked)) == len(asked) == probes  # no depth planned twice
        # growth at least doubles, then each interpolation that fails to halve is followed by
        # a bisection: at most about twice the probes of plain doubling and bisection
        assert probes <= 2 * (2 * math.log2(max_blocks / MIN_BLOCKS) + 2), (budget, asked)


@pytest.mark.parametrize("last", [16, 17, 100, 881, 5000, 33331, 33332])
def test_search_where_plans_hug_the_budget(last):
    # offloading keeps every plan that fits just under the budget; past ``last`` blocks what
    # cannot be offloaded overflows it, by more the deeper the net
    budget = 10**9

    def need(n):
        return budget - (last - n) if n <= last else budget + 5000 * (n - last) + 7 * (n % 3)

    (best, over, at_cap, probes), asked = drive(need, budget, 33332)
    assert best.blocks == last and at_cap == (last == 33332)
    assert at_cap or over.blocks == last + 1
    assert probes <= 2 * (2 * math.log2(33332 / MIN_BLOCKS) + 2), asked


def test_search_is_quick_where_memory_is_linear():
    need = CURVES["linear"]
    budget = need(3333) + 5
    (best, over, _, probes), asked = drive(need, budget, 33332)
    assert best.blocks == 3333 and over.blocks == 3334
    assert probes <= 5 and asked[-2:] == [3334, 3333], asked  # the line lands on the answer


# -- the family and the planner ---------------------------------------------------------------

def test_depth_means_blocks_in_the_third_stage():
    planner = Planner(NET, 2**30, overrides=SMALL, batch=2)
    for n in (16, 33, 50):  # depths 50, 101, 152: not the file's classic layouts
        spec = planner.spec(n)
        assert spec.params["blocks"] == [3, 8, n - 14, 3] and spec.params["depth"] == depth_of(n)
        assert sum(ls.type == "Eltwise" for ls in spec.layers) == n  # one per bottleneck block
    assert blocks_of(depth_of(1000)) == 1000 and blocks_of(100_000) == 33332


def test_the_planner_refuses_to_be_told_the_depth():
    with pytest.raises(SNError, match="sn-depth chooses the depth itself"):
        Planner(NET, 2**30, overrides={"depth": 101})


@pytest.mark.parametrize("policy", ["baseline", "liveness"])
def test_the_deepest_fitting_depth_by_brute_force(policy):
    # a budget between the arenas of 24 and 25 blocks, as planned without one; with the budget
    # the workspace pass may squeeze 25 in, so the answer comes from planning every depth
    budget = (arena(policy, 24).arena_bytes + arena(policy, 25).arena_bytes) // 2
    planner = Planner(NET, budget, overrides=SMALL, batch=2)
    fits = [planner.probe(policy, n).fits for n in range(MIN_BLOCKS, 29)]
    assert fits == sorted(fits, reverse=True), "fitting is not monotone in the depth"
    expected = MIN_BLOCKS + sum(fits) - 1
    assert expected in (24, 25)
    (result,) = deepest(Planner(NET, budget, overrides=SMALL, batch=2), [policy])
    assert result.depth == depth_of(expected) and not result.at_cap
    assert result.over.depth == result.depth + 3 and result.over.arena_bytes > budget
    plan = arena(policy, expected, budget)  # the figures are the Simulator's
    best = result.best
    assert (best.peak_bytes, best.arena_bytes, best.resident_bytes, best.steps) == \
        (plan.peak_bytes, plan.arena_bytes, plan.resident_bytes, plan.steps)
    assert best.est_seconds > 0 and best.host_bytes == getattr(plan, "host_bytes", 0)


def test_shared_depths_are_built_once():
    planner = Planner(NET, 2**40, overrides=SMALL, batch=2)
    results = deepest(planner, ["baseline", "liveness"], max_depth=depth_of(40))
    # both grow 16, 32, then to the cap (the budget is huge): three depths, six plans
    assert [(r.depth, r.at_cap) for r in results] == [(depth_of(40), True)] * 2
    assert planner.stats["builds"] == 3 and planner.stats["probes"] == 6


# -- the command line -------------------------------------------------------------------------

def test_prints_a_table_of_every_policy(capsys):
    budget = arena("baseline", 18).arena_bytes
    status, out, err = run(capsys, "--memory", str(budget), *SMALL_ARGS, "--max-depth", "80")
    assert status == 0
    for word in ("policy", "depth", "peak", "arena", "resident", "host", "est. iter", *POLICIES):
        assert word in out, word
    row = next(line for line in out.splitlines() if line.startswith("baseline "))
    assert row.split()[1] == str(depth_of(18))
    assert " depth     50 " in err and "fits" in err  # a progress line per plan


def test_json_has_the_figures_of_each_policy(capsys):
    budget = arena("liveness", 22).arena_bytes
    status, out, _ = run(capsys, "--memory", str(budget), *SMALL_ARGS, "--policies", "liveness,baseline",
                         "--json")
    info = json.loads(out)
    assert status == 0 and info["budget_bytes"] == budget and info["batch"] == 2
    assert [r["policy"] for r in info["results"]] == ["liveness", "baseline"]
    for r in info["results"]:
        assert {"depth", "blocks", "at_cap", "peak_bytes", "arena_bytes", "resident_bytes", "host_bytes",
                "est_seconds", "next_depth", "next_arena_bytes", "probes"} <= set(r)
        assert r["arena_bytes"] <= budget < r["next_arena_bytes"] and r["depth"] == depth_of(r["blocks"])
    assert info["results"][0]["depth"] == depth_of(22)


def test_not_even_depth_50_fits(capsys):
    need = arena("liveness", MIN_BLOCKS).arena_bytes
    status, out, _ = run(capsys, "--memory", str(need - 1), *SMALL_ARGS, "--policies", "liveness")
    assert status == 3
    assert "liveness: not even depth 50 fits; it needs" in out and f"({need} bytes)" in out
    status, out, _ = run(capsys, "--memory", str(need - 1), *SMALL_ARGS, "--policies", "liveness", "--json")
    (r,) = json.loads(out)["results"]
    assert (r["depth"], r["peak_bytes"], r["next_depth"], r["next_arena_bytes"]) == (0, None, 50, need)


@pytest.mark.parametrize("argv, message", [
    (["--memory", "12 parsecs", "--batch", "2"], "bad size '12 parsecs'"),
    (["--memory", "1GiB", "--batch", "2", "--policies", "baseline,lifeness"],
     f"unknown policy 'lifeness'; known: {', '.join(POLICIES)}"),
    (["--memory", "1GiB", "--batch", "2", "--set", "depth=101"], "--set depth: sn-depth chooses"),
    (["nets/lenet.yaml", "--memory", "1GiB", "--batch", "2"], "--set depth: no such parameter"),
    (["--memory", "1GiB", "--batch", "0"], "--batch must be at least 1"),
])
def test_bad_input_exits_2_with_one_clear_line(capsys, argv, message):
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err


def test_verify_runs_with_the_planned_peak(capsys):
    budget = arena("baseline", 17).arena_bytes  # small: depth 53 for baseline, a bit more for liveness
    status, out, _ = run(capsys, "--memory", str(budget), *SMALL_ARGS, "--policies", "baseline,liveness",
                         "--verify", "--device", "cpu", "--json")
    assert status == 0
    for r in json.loads(out)["results"]:
        assert r["depth"] >= depth_of(17)
        v = r["verify"]
        assert v["equal"] and v["real_peak_bytes"] == r["peak_bytes"] == v["net_plan_peak_bytes"]
        assert math.isfinite(v["loss"])
