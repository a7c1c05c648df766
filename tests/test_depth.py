"""sn-depth: the search finds exactly the deepest fitting ResNet, its figures are the
Simulator's, and --verify runs the depth found with the planned peak to the byte; and the
shortcuts that make it fast (the guess, the offload pass's bisections without making the
steps, the workspace pass's retries from where they failed) give what the long way gives."""

import json
import math
import os

import pytest
from one_line import cli_error, raises_one_line

from superneuron.cli.depth import main
from superneuron.errors import SNError
from superneuron.explore.depth import MIN_BLOCKS, Planner, blocks_of, deepest, depth_of
from superneuron.explore.depth_search import search
from superneuron.graph import Graph
from superneuron.netfile.spec import load_spec
from superneuron.options import PlanOptions
from superneuron.scheduler.cost import CostModel
from superneuron.scheduler.lower import lower
from superneuron.scheduler.policy import POLICIES, SOLVED, apply_policy
from superneuron.scheduler.simulate import simulate
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    """A plan that needs ``need(blocks)``."""

    def __init__(self, blocks, need, budget):
        self.blocks, self.need_bytes = blocks, need(blocks)
        self.fits = self.need_bytes <= budget


def drive(need, budget, max_blocks, guess=None):
    """Run :func:`search` against ``need``; its answer and the blocks it asked for."""
    s = search(budget, max_blocks, guess=guess)
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


@pytest.mark.parametrize("curve", CURVES)
def test_a_guess_changes_the_plans_made_not_the_answer(curve):
    need, max_blocks = CURVES[curve], 5000
    for budget in sorted({need(n) + d for n in (16, 17, 333, 700, 4999) for d in (-1, 0, 1)}):
        expected, _ = drive(need, budget, max_blocks)
        answer = expected[0].blocks if expected[0] else None
        for guess in {16, 17, 100, 699, 700, 2500, 4999, 5000, 9999} | ({answer} - {None}):
            (best, over, at_cap, probes), asked = drive(need, budget, max_blocks, guess)
            assert (best and best.blocks, over and over.blocks, at_cap) == \
                (answer, expected[1] and expected[1].blocks, expected[2]), (budget, guess, asked)
            assert len(set(asked)) == len(asked) == probes, asked  # no depth planned twice
            if guess == answer:
                assert probes <= 2, asked  # the guess and its neighbour


# -- the family and the planner ---------------------------------------------------------------

def test_depth_means_blocks_in_the_third_stage():
    planner = Planner(NET, 2**30, overrides=SMALL, batch=2)
    for n in (16, 33, 50):  # depths 50, 101, 152: not the file's classic layouts
        spec = planner.spec(n)
        assert spec.params["blocks"] == [3, 8, n - 14, 3] and spec.params["depth"] == depth_of(n)
        assert sum(ls.type == "Eltwise" for ls in spec.layers) == n  # one per bottleneck block
    assert blocks_of(depth_of(1000)) == 1000 and blocks_of(100_000) == 33332


def test_the_planner_refuses_to_be_told_the_depth():
    with raises_one_line(SNError, match="sn-depth chooses the depth itself"):
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
    results = deepest(planner, ["baseline", "liveness"], max_depth=depth_of(40), guess=False)
    # both grow 16, 32, then to the cap (the budget is huge): three depths, six plans
    assert [(r.depth, r.at_cap) for r in results] == [(depth_of(40), True)] * 2
    assert planner.stats["builds"] == 3 and planner.stats["probes"] == 6
    planner = Planner(NET, 2**40, overrides=SMALL, batch=2)
    results = deepest(planner, ["baseline", "liveness"], max_depth=depth_of(40))
    # the floors of 16 and 32 blocks, then the guess: the cap, which fits
    assert [(r.depth, r.at_cap, r.probes) for r in results] == [(depth_of(40), True, 1)] * 2
    assert planner.stats["builds"] == 3 and planner.stats["floors"] == 4 and planner.stats["probes"] == 2


@pytest.mark.parametrize("policies, overrides, batch, budget, host, probes", [
    ("baseline,recompute", SMALL, 2, 400 << 20, None, 2),
    ("liveness,offload,superneurons", {"size": 64, "classes": 10}, 8, 400 << 20, None, 2),
    # host memory binds: the guess falls short (see Planner.guess), and the search grows on
    ("superneurons+params,liveness+params", SMALL, 2, 200 << 20, 500 << 20, 4)])
def test_the_guess_finds_what_the_search_without_it_finds(policies, overrides, batch, budget, host, probes):
    policies = policies.split(",")
    results = {}
    for guess in (False, True):
        planner = Planner(NET, budget, overrides=overrides, batch=batch, host_memory=host)
        results[guess] = [r.as_dict() for r in deepest(planner, policies, max_depth=depth_of(160), guess=guess)]
    for r in results[True]:
        assert r["depth"] > depth_of(MIN_BLOCKS) and not r["at_cap"], r
        assert r["probes"] <= probes, r  # the floors' line lands on (or near) the answer
    strip = [{k: v for k, v in r.items() if k != "probes"} for r in results[True]]
    assert strip == [{k: v for k, v in r.items() if k != "probes"} for r in results[False]]


def test_a_plan_over_the_host_memory_does_not_fit():
    # parameter offload: the device holds a few KiB per block, the host all the parameters
    host = arena("superneurons+params", 30).host_bytes
    planner = Planner(NET, 2**40, overrides=SMALL, batch=2, host_memory=host)
    (r,) = deepest(planner, ["superneurons+params"], max_depth=depth_of(200))
    assert r.best.host_bytes <= host < r.over.host_bytes and r.over.arena_bytes < 2**40
    assert r.over.blocks == r.best.blocks + 1 and r.over.need_bytes > 2**40  # host bytes, scaled
    (alone,) = deepest(Planner(NET, 2**40, overrides=SMALL, batch=2), ["superneurons+params"],
                       max_depth=depth_of(48))
    assert alone.at_cap  # without a host bound nothing stops it


# -- the command line -------------------------------------------------------------------------

def test_prints_a_table_of_every_policy(capsys):
    budget = arena("baseline", 18).arena_bytes
    status, out, err = run(capsys, "--memory", str(budget), *SMALL_ARGS, "--max-depth", "80")
    assert status == 0
    scanned = [p for p in POLICIES if p not in SOLVED]  # sn-depth's default: not the solved ones
    for word in ("policy", "depth", "peak", "arena", "resident", "host", "est. iter", *scanned):
        assert word in out, word
    row = next(line for line in out.splitlines() if line.startswith("baseline "))
    assert row.split()[1] == str(depth_of(18))
    assert f" depth     {depth_of(18)} " in err and "fits" in err  # a progress line per plan


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
    (["--memory", "1GiB", "--batch", "2", "--policies", "baseline+params"], "not offered with baseline"),
    (["--memory", "1GiB", "--batch", "2", "--host-memory", "0"], "--host-memory must be positive"),
])
def test_bad_input_exits_2_with_one_clear_line(capsys, argv, message):
    line = cli_error(capsys, main, argv, quiet=True)
    assert line.startswith("error: ") and message in line, line


def test_verify_runs_with_the_planned_peak(capsys):
    budget = arena("baseline", 17).arena_bytes  # small: depth 53 for baseline, a bit more for the others
    status, out, _ = run(capsys, "--memory", str(budget), *SMALL_ARGS, "--policies", "baseline,superneurons",
                         "--verify", "--device", "cpu", "--json")
    assert status == 0
    for r in json.loads(out)["results"]:
        assert r["depth"] >= depth_of(17)
        v = r["verify"]
        assert v["equal"] and v["real_peak_bytes"] == r["peak_bytes"] == v["net_plan_peak_bytes"]
        assert math.isfinite(v["loss"])
    status, out, _ = run(capsys, "--memory", str(budget), *SMALL_ARGS, "--policies", "liveness",
                         "--verify", "--device", "cpu")
    assert status == 0 and "planned peak (B)" in out and "run peak (B)" in out
    row = next(line for line in out.splitlines() if line.startswith("liveness "))
    planned, real, equal = row.split()[-3:]
    assert planned == real and int(real) > 0 and equal == "yes"


def test_host_memory_and_the_cap_on_the_command_line(capsys):
    host = arena("superneurons+params", 24).host_bytes
    status, out, _ = run(capsys, "--memory", "1TiB", *SMALL_ARGS, "--policies", "liveness+params,liveness",
                         "--host-memory", str(host), "--max-depth", str(depth_of(48)))
    assert status == 0
    rows = {line.split()[0]: line for line in out.splitlines()
            if line.startswith(("liveness+params ", "liveness "))}
    assert "(host +" in rows["liveness+params"]  # the next depth is over the host memory
    assert f"≥ {depth_of(48)} (cap)" in rows["liveness"]  # a terabyte: the cap stops liveness
    assert f"liveness: depth {depth_of(48)}, the --max-depth cap, fits" in out
    status, out, _ = run(capsys, "--memory", "1TiB", *SMALL_ARGS, "--policies", "superneurons+params",
                         "--host-memory", str(host), "--json")
    info = json.loads(out)
    (r,) = info["results"]
    assert info["host_memory_bytes"] == host and r["host_bytes"] <= host and not r["at_cap"]


def test_the_default_network_is_found_from_anywhere(capsys, tmp_path, monkeypatch):
    budget = arena("liveness", 20).arena_bytes
    monkeypatch.chdir(tmp_path)
    status, out, _ = run(capsys, "--memory", str(budget), *SMALL_ARGS, "--policies", "liveness", "--json")
    info = json.loads(out)
    assert status == 0 and os.path.samefile(info["net"], os.path.join(ROOT, NET))
    assert info["results"][0]["depth"] == depth_of(20)
    import superneuron.cli.depth as cli
    monkeypatch.setattr(cli, "__file__", str(tmp_path / "superneuron" / "cli" / "depth.py"))
    err = cli_error(capsys, main, ["--memory", budget, *SMALL_ARGS], quiet=True)
    assert "the default network is not at" in err and "give the path of nets/resnet.yaml" in err


# -- the shortcuts of the passes, against the long way -----------------------------------------

def _offload_variants(path, overrides, batch, params):
    """The offload pass's candidates on ``path`` after liveness (and parameter offload)."""
    from superneuron.scheduler import offload as off
    from superneuron.scheduler.inplace import inplace
    from superneuron.scheduler.liveness import liveness
    from superneuron.scheduler.params import offload_params
    from superneuron.scheduler.recompute import recompute
    from superneuron.scheduler.steps import MEMORY
    schedule = recompute(lower(Graph(load_spec(path, overrides=overrides, batch=batch)), train=True,
                               optimizer=make_optimizer(SolverConfig())))
    if params:
        schedule = offload_params(schedule)
    schedule = liveness(inplace(schedule))
    steps = [s for s in schedule.steps if s.kind not in MEMORY]
    gaps, writes = off._gaps(schedule, steps, CostModel("cpu"))
    return off._Variants(schedule, steps, gaps, writes)


NETS_SMALL = [("nets/resnet.yaml", {"depth": 50, "size": 64, "classes": 10}, 2), ("nets/googlenet.yaml", {}, 2)]


@pytest.mark.parametrize("params", [False, True])
@pytest.mark.parametrize("path, overrides, batch", NETS_SMALL)
def test_the_offload_bisections_see_what_the_steps_would_do(path, overrides, batch, params):
    import itertools

    from superneuron.scheduler.simulate import replay, resident_arenas
    from superneuron.scheduler.steps import MEMORY
    v = _offload_variants(path, overrides, batch, params)
    n, hosted = len(v.gaps), set(v.schedule.host_resident)
    assert n > 50

    def frees_sorted(steps):  # Frees that come together, in any order: the arena ends the same
        out = []
        for free, run in itertools.groupby(steps, key=lambda s: s.kind == "free"):
            run = list(run)
            out += sorted(run, key=lambda s: s.tensor) if free else run
        return out

    arenas, hosts = {}, {}
    for k in sorted({*range(0, n + 1, 7), n}):
        steps = v.with_copies(k).steps
        memory = [s for s in steps if s.kind in MEMORY]
        assert frees_sorted(v.device_steps(k)) == frees_sorted(memory), k
        cut = (k * 37) % len(v.steps)  # any split gives the same steps
        assert v.device_steps(k, 0, cut) + v.device_steps(k, cut) == v.device_steps(k)
        # the host arena's calls: an Offload of its own takes host memory, the last Wait (or an
        # Apply) gives it back
        pending, calls = {}, []
        for s in steps:
            if s.kind == "offload":
                calls += [] if s.tensor in hosted else [("alloc", s.tensor)]
                pending[s.tensor] = s.kind
            elif s.kind == "prefetch":
                pending[s.tensor] = ("keep" if s.keep else s.kind)
            elif s.kind == "wait" and pending.pop(s.tensor) == "prefetch":
                calls.append(("free", s.tensor))
            elif s.kind == "apply":  # parameter offload's diet: the update consumed a gradient's copy
                calls.append(("free", s.tensor))
        # host_steps are those steps alone: walked on the host side, they make the same calls
        assert _host_calls(v.schedule, hosted, v.host_steps(k)) == calls, k
        whole = replay(v.with_copies(k))
        arenas[k], hosts[k] = whole.high_water, whole.host.high_water

    def arena(k):
        if k not in arenas:
            arenas[k] = replay(v.with_copies(k)).high_water
        return arenas[k]

    residents = resident_arenas(v.schedule)
    for budget in sorted(set(arenas.values()))[::4] + [min(arenas.values()) - 1]:
        lo, hi = 0, n  # the plain bisection, each test a whole replay
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if arena(mid) <= budget else (mid + 1, hi)
        assert v.fewest_within(0, n, budget, residents) == lo, budget
    for host in sorted(set(hosts.values()))[::5]:
        assert all(v.host_within(k, host, residents) == (h <= host) for k, h in hosts.items()), host


def _host_calls(schedule, hosted, steps):
    """The host allocator's calls of a walk of ``steps`` (the device side kept nowhere)."""
    from superneuron.scheduler.walk import NO_MEMORY, Walker

    class Host:
        resident, calls = hosted, []

        def alloc(self, name, nbytes):
            self.calls.append(("alloc", name))

        def free(self, name):
            self.calls.append(("free", name))

    host = Host()
    host.calls = []
    Walker(schedule.tensors, NO_MEMORY, host).walk(steps)
    return host.calls


def _fit_the_long_way(schedule, budget, tries=8):
    """workspace.fit as it was: every try chooses every step's workspace and replays all."""
    from superneuron.runtime.arena import aligned
    from superneuron.scheduler.placement import with_placement
    from superneuron.scheduler.simulate import replay
    from superneuron.scheduler.steps import MEMORY
    from superneuron.scheduler.workspace import choose_workspaces
    caps = {}
    while True:
        placed = with_placement(choose_workspaces(schedule, budget, caps=caps), "dynamic")
        if tries == 0:
            return placed, caps
        stop = replay(placed, stop=lambda a: a.high_water > budget).stopped_at
        if stop is None or placed.steps[stop].kind != "alloc":
            return placed, caps
        ws = placed.steps[stop].tensor
        if placed.tensors[ws].kind != "workspace":
            return placed, caps
        caps[sum(s.kind not in MEMORY for s in placed.steps[:stop])] = aligned(placed.tensors[ws].nbytes) - 1
        tries -= 1


@pytest.mark.parametrize("policy", ["liveness", "superneurons"])
def test_the_workspace_retries_go_on_from_where_they_failed(policy):
    import dataclasses

    from superneuron.scheduler.context import Context
    from superneuron.scheduler.inplace import inplace
    from superneuron.scheduler.liveness import liveness
    from superneuron.scheduler.recompute import recompute
    from superneuron.scheduler.workspace import fit
    graph = Graph(load_spec("nets/vgg16.yaml", batch=8))  # large workspaces beside large tensors
    schedule = lower(graph, train=True, optimizer=make_optimizer(SolverConfig()))
    schedule = liveness(inplace(recompute(schedule) if policy == "superneurons" else schedule))
    low = simulate(fit(schedule, Context(PlanOptions(budget=0)))).arena_bytes
    high = simulate(fit(schedule, Context())).arena_bytes
    retried = 0
    for budget in range(low - 2**20, high + 2**20, (high - low) // 40):
        placed = fit(schedule, Context(PlanOptions(budget=budget)))
        expected, caps = _fit_the_long_way(schedule, budget)
        retried += bool(caps)
        assert placed.steps == expected.steps and placed.tensors == expected.tensors, budget
        plan, fresh = simulate(placed), simulate(dataclasses.replace(placed))  # its replay, and a new one
        assert (plan.peak_bytes, plan.arena_bytes, plan.host_bytes, plan.live, plan.peak_step) == \
            (fresh.peak_bytes, fresh.arena_bytes, fresh.host_bytes, fresh.live, fresh.peak_step), budget
    assert retried >= 3  # the budgets made it try again
