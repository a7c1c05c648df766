"""The optimal and auto policies (issue 15, parts 2 and 3): scheduler/optimal.py and its
program, scheduler/optimal_model.py.

The program against brute force on hand-made chains (every combination of options and
algorithms enumerated, with the windows the model's docstring states); the pass under
budgets on several nets: within the budget (Simulator), never slower than a heuristic that
fits, baseline's results bit for bit with plan equal to run; auto's choice of liveness; the
one-line error for a budget nothing fits; the solver's time limit."""

import dataclasses
import itertools
import time

import numpy as np
import pytest
from test_memory_passes import CAFFE_CHAIN, CHAIN, assert_same_results, check_copies, graph_of, tiny

from superneuron.graph import Graph
from superneuron.layers.base import Algo
from superneuron.netfile.spec import load_spec
from superneuron.options import PlanOptions
from superneuron.scheduler.context import Context
from superneuron.scheduler.cost import CostModel
from superneuron.scheduler.lower import lower
from superneuron.scheduler.optimal import HEURISTICS, smallest_budget, smallest_candidate_budget
from superneuron.scheduler.optimal_model import Choice, Model, Stash, solve
from superneuron.scheduler.optimal_rounds import realise
from superneuron.scheduler.policy import apply_policy, passes_of
from superneuron.scheduler.simulate import simulate
from superneuron.sizes import human_bytes

CPU = CostModel("cpu")


def resnet_cifar():
    return Graph(load_spec("nets/resnet_cifar.yaml", overrides={"depth": 8}, batch=2))


NETS = {"tiny": tiny, "chain": lambda: graph_of(CHAIN), "caffe_chain": lambda: graph_of(CAFFE_CHAIN),
        "resnet_cifar8": resnet_cifar}


def planned(graph, policy, budget, memo=None, seconds=5.0, model=CPU):
    schedule = apply_policy(lower(graph), policy, budget=budget, costs=model, memo=memo, solver_seconds=seconds)
    return schedule, simulate(schedule)


def budgets(graph):
    """Budgets from liveness's arena down to the smallest any heuristic fits."""
    live = planned(graph, "liveness", None)[1].arena_bytes
    low = smallest_budget(lower(graph), Context(model=CPU), passes_of)
    return sorted({b for b in (live * 2 // 3, live // 2, (live + low) // 2, low) if b >= low}, reverse=True), low


# -- the program against brute force -------------------------------------------------------------

def brute_force(m, cap):
    """The least objective of Model ``m`` under ``cap`` by enumeration: each stash kept,
    recomputed or offloaded (absent from a+1 to e-2), each choice on one algorithm."""
    best = None
    stash_options = [[None] + [o for o in ("rec", "off") if getattr(s, f"{'recompute' if o == 'rec' else 'offload'}"
                                                                    "_seconds") is not None] for s in m.stashes]
    for options in itertools.product(*stash_options):
        for algos in itertools.product(*[range(len(c.algos)) for c in m.choices]):
            live = m.live + m.fixed_workspace
            seconds = m.fixed_seconds
            for s, o in zip(m.stashes, options):
                if o is None:
                    continue
                end = s.e - 2
                live = live - np.array([s.size if s.a + 1 <= i <= end else 0 for i in range(m.n)])
                seconds += s.recompute_seconds if o == "rec" else s.offload_seconds
            for c, a in zip(m.choices, algos):
                live = live + np.array([c.workspace[a] if i == c.step else 0 for i in range(m.n)])
                seconds += c.seconds[a]
            if live.max() <= cap and (best is None or seconds < best):
                best = seconds
    return best


def chain_model(rng, n=10):
    """A random chain of ``n`` steps: stashes with windows across the middle (the turn), and
    two steps with three algorithms each (faster ones with more workspace)."""
    half = n // 2
    stashes = []
    for k in range(4):
        a = int(rng.integers(0, half - 1))
        e = int(rng.integers(half, n))
        if e - a < 3:
            continue
        stashes.append(Stash(f"t{k}", int(rng.integers(1, 9)) << 20, a, e,
                             recompute_seconds=float(rng.uniform(1, 5)) * 1e-3 if k % 2 == 0 else None,
                             offload_seconds=float(rng.uniform(1, 5)) * 1e-3))
    live = np.zeros(n)
    for s in stashes:
        live[s.a:s.e + 1] += s.size
    live += rng.integers(1, 4, n) * (1 << 20)
    choices = [Choice(step, [Algo("fast", 0), Algo("mid", 0), Algo("slow", 0)],
                      [1e-3, 2e-3, 4e-3], [4 << 20, 2 << 20, 0]) for step in (half - 1, half)]
    return Model(n, live, np.zeros(n), 0.01, stashes, choices, 0)


@pytest.mark.parametrize("seed", range(6))
def test_the_program_finds_the_brute_force_optimum_of_a_small_chain(seed):
    rng = np.random.default_rng(seed)
    m = chain_model(rng)
    peak = m.live.max() + 4 * (1 << 20)
    for fraction in (1.0, 0.8, 0.6, 0.4):
        cap = int(peak * fraction)
        best = brute_force(m, cap)
        solution = solve(m, cap, 10.0)
        if best is None:
            assert solution.recompute is None, f"cap {cap}: brute force finds nothing, the solver does"
            continue
        assert solution.recompute is not None, f"cap {cap}: the solver finds nothing, brute force {best}"
        assert solution.objective == pytest.approx(best, rel=1e-3, abs=1e-7)


# -- the pass ------------------------------------------------------------------------------------

def optimal_within_budget_and_fastest(graph, budget, model=CPU):
    """``(schedule, plan, memo)`` of optimal at ``budget``, asserted within it and no slower
    than any heuristic that fits it, under cost ``model``."""
    memo = {}
    schedule, plan = planned(graph, "optimal", budget, memo, model=model)
    assert plan.peak_bytes <= plan.arena_bytes <= budget, (budget, plan.arena_bytes)
    seconds = model.iteration_seconds(schedule)
    for heuristic in HEURISTICS:
        other, other_plan = planned(graph, heuristic, budget, model=model)
        if other_plan.fits(budget):
            assert seconds <= model.iteration_seconds(other) * (1 + 1e-12), (budget, heuristic)
    return schedule, plan, memo


@pytest.mark.parametrize("name", sorted(NETS))
def test_optimal_fits_every_budget_and_beats_every_heuristic_that_fits(name):
    graph = NETS[name]()
    fitted = 0
    levels, _ = budgets(graph)
    for budget in levels:
        _, _, memo = optimal_within_budget_and_fastest(graph, budget)
        assert memo["optimal"]["winner"] in (*HEURISTICS, "solver")
        fitted += 1
    assert fitted == len(levels)


# Inner products, ReLU and Dropout only: one algorithm per layer, so any plan runs baseline's
# kernels and must give its results bit for bit, recomputed inner products included.
MLP = """\
name: mlp
input: {data: [128, 32], label: [128]}
layers:
""" + "".join(f"""\
  - {{name: ip{i}, type: InnerProduct, bottom: {b}, top: ip{i}, num_output: 32}}
  - {{name: relu{i}, type: ReLU, bottom: ip{i}, top: ip{i}}}
  - {{name: drop{i}, type: Dropout, bottom: ip{i}, top: drop{i}, dropout_ratio: 0.25}}
""" for i, b in ((1, "data"), (2, "drop1"), (3, "drop2"), (4, "drop3"))) + """\
  - {name: fc, type: InnerProduct, bottom: drop4, top: fc, num_output: 5}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
"""
NETS["mlp"] = lambda: graph_of(MLP)


def same_algorithms(schedule, graph):
    """Whether every layer step of ``schedule`` runs baseline's algorithm (a Recompute its
    Forward's): then its results are baseline's bit for bit, else within float32 rounding."""
    base = apply_policy(lower(graph), "baseline", costs=CPU)
    algos = {(s.node, s.kind): s.algorithm for s in base.steps if s.kind in ("forward", "backward")}
    return all(s.algorithm == algos[(s.node, "forward" if s.kind == "recompute" else s.kind)]
               for s in schedule.steps if s.kind in ("forward", "backward", "recompute"))


@pytest.mark.parametrize("name", ["mlp", "chain", "caffe_chain", "tiny"])
def test_optimal_gives_baselines_results_and_plan_equals_run(name):
    graph = NETS[name]()
    levels, _ = budgets(graph)
    winners = set()
    for budget in levels:
        memo = {}
        schedule, plan = planned(graph, "optimal", budget, memo)
        winners.add(memo["optimal"]["winner"])
        check_copies(schedule)
        exact = same_algorithms(schedule, graph)
        assert exact or name != "mlp"
        runtime, run_plan = assert_same_results(graph, schedule, exact=exact)[:2]
        assert (runtime.peak_bytes, runtime.arena_bytes) == (plan.peak_bytes, plan.arena_bytes)
        assert runtime.arena_bytes <= budget


def test_a_solution_that_recomputes_inner_products_is_realised_with_baselines_results():
    """What the solver may choose and no heuristic does, recomputing expensive layers' outputs
    (here every inner product's but the last), realised by the recompute pass: baseline's
    results bit for bit (one algorithm per layer), plan equal to run, and less memory."""
    graph = graph_of(MLP)
    chosen = {f"ip{i}" for i in (1, 2, 3)}
    found = realise(lower(graph).replace(policy="optimal"), Context(model=CPU), chosen, set())
    recomputed = [graph.nodes[s.node].name for s in found.schedule.steps if s.kind == "recompute"]
    assert {"ip1", "ip2", "ip3"} <= set(recomputed) and "ip4" not in recomputed
    assert same_algorithms(found.schedule, graph)
    runtime, run_plan = assert_same_results(graph, found.schedule, exact=True)[:2]
    assert (runtime.peak_bytes, runtime.arena_bytes) == (found.plan.peak_bytes, found.plan.arena_bytes)
    assert found.plan.peak_bytes < planned(graph, "liveness", None)[1].peak_bytes


def test_the_solver_recomputes_convolutions_where_that_is_cheapest():
    """Below what recomputing the cheap layers reaches (the recompute policy no longer fits),
    with no host memory to copy to, the solver's plan recomputes a convolution (its choice,
    which no heuristic makes) and is the winner, within the budget."""
    graph = graph_of(CHAIN)
    budget = int(planned(graph, "recompute", None)[1].arena_bytes * 0.9)
    memo = {}
    schedule = apply_policy(lower(graph), "optimal", budget=budget, costs=CPU, memo=memo, solver_seconds=5.0,
                            host_memory=0)
    plan = simulate(schedule)
    assert memo["optimal"]["candidates"]["recompute"] is None  # the premise: it does not fit
    assert memo["optimal"]["winner"] == "solver"
    recomputed = {graph.nodes[s.node].layer.type for s in schedule.steps if s.kind == "recompute"}
    assert "Convolution" in recomputed
    assert plan.arena_bytes <= budget


def test_auto_picks_liveness_where_it_fits():
    graph = tiny()
    live = planned(graph, "liveness", None)
    for budget in (None, live[1].arena_bytes):
        memo = {}
        schedule, plan = planned(graph, "auto", budget, memo)
        assert memo["optimal"]["winner"] == "liveness"
        assert [s for s in schedule.steps if s.kind in ("recompute", "offload")] == []
        assert plan.arena_bytes == live[1].arena_bytes


def test_a_budget_nothing_fits_is_one_line_naming_the_smallest_that_does(capsys):
    from superneuron.cli.plan import main
    graph = tiny()
    low = smallest_candidate_budget(lower(graph), Context(model=CostModel("cpu")), passes_of)
    assert main(["tests/nets/tiny.yaml", "--policy", "optimal", "--memory", "1KiB", "--solver-time", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"a heuristic's plan fits from {human_bytes(low)}" in err
    assert planned(graph, "optimal", low)[1].arena_bytes <= low


def test_where_the_dynamic_allocators_holes_do_not_fit_optimal_places_at_planned_offsets():
    """Just under the smallest budget a heuristic fits with the dynamic allocator, the
    solver's plan fits at planned offsets (the bytes live fit, the dynamic allocator's holes
    do not), and the Runtime runs it at those offsets with the plan's bytes and baseline's
    results."""
    graph = tiny()
    low = smallest_budget(lower(graph), Context(model=CostModel("cpu")), passes_of)
    budget = low - max(1, low // 1000)
    memo = {}
    schedule, plan = planned(graph, "optimal", budget, memo)
    assert schedule.offsets is not None and plan.arena_bytes <= budget
    assert simulate(dataclasses.replace(schedule, offsets=None)).arena_bytes > budget
    runtime, run_plan = assert_same_results(graph, schedule, exact=same_algorithms(schedule, graph))[:2]
    assert (runtime.peak_bytes, runtime.arena_bytes) == (plan.peak_bytes, plan.arena_bytes)


def test_the_solver_time_limit_is_honoured():
    rng = np.random.default_rng(0)
    n = 4000  # a long chain of many stashes: not solved to optimality in a tenth of a second
    stashes = []
    for k in range(1500):
        a = int(rng.integers(0, n // 2 - 2))
        e = int(rng.integers(n // 2, n))
        stashes.append(Stash(f"t{k}", int(rng.integers(1, 100)) << 16, a, e,
                             recompute_seconds=float(rng.uniform(1, 5)) * 1e-4,
                             offload_seconds=float(rng.uniform(1, 5)) * 1e-4))
    live = np.zeros(n)
    for s in stashes:
        live[s.a:s.e + 1] += s.size
    m = Model(n, live, np.zeros(n), 0.0, stashes, [], 0)
    start = time.perf_counter()
    solution = solve(m, int(live.max() * 0.4), 0.3)
    took = time.perf_counter() - start
    assert solution.seconds <= 0.3 + 1.5 and took <= 0.3 + 3.0, took


def test_sn_train_with_a_budget_and_no_policy_uses_auto(capsys):
    from superneuron.cli.train import main
    assert main(["tests/nets/tiny.yaml", "--iters", "1", "--display", "1", "--test-interval", "0",
                 "--memory", "64MiB"]) == 0
    assert "memory: policy auto" in capsys.readouterr().out


def test_sn_plan_tradeoff_prints_the_table_and_draws_it(tmp_path, capsys):
    from superneuron.cli.plan import main
    out = tmp_path / "tradeoff.png"
    assert main(["tests/nets/tiny.yaml", "--tradeoff", str(out), "--solver-time", "2", "--json"]) == 0
    import json
    table = json.loads(capsys.readouterr().out)["tradeoff"]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [r["label"] for r in table["rows"]][-1] == "smallest a heuristic fits"
    for row in table["rows"]:  # optimal fits wherever a heuristic does, and is no slower
        cells = row["policies"]
        fitting = [v for k, v in cells.items() if k != "optimal" and v is not None]
        if fitting:
            assert cells["optimal"] is not None and cells["optimal"] <= min(fitting) * (1 + 1e-12)
    assert table["rows"][-1]["policies"]["optimal"] is not None  # the smallest budget fits
    near = next(r for r in table["rows"] if r["label"] == "1.1x the lower bound")
    assert near["budget_bytes"] == round(1.1 * table["lower_bound_bytes"])
    assert table["monet"] is None  # MONeT published nothing for this net


def test_the_tradeoff_shows_monets_published_points_beside_the_curve(tmp_path):
    """For the nets MONeT published (its README's tables), their points: memory as a fraction
    of PyTorch's peak, time as an overhead over PyTorch's; printed under the table."""
    from superneuron.explore.tradeoff import monet_points
    from superneuron.report import tradeoff_table
    r50 = monet_points("resnet50")
    assert r50["net"] == "ResNet-50, batch 184" and len(r50["points"]) == 6
    assert r50["points"][0] == {"fraction": round(10.01 / 15.06, 4), "overhead": 0.0322}
    assert monet_points("resnet18") is None
    figures = {"liveness_bytes": 3 << 30, "liveness_seconds": 0.05, "lower_bound_bytes": 1 << 30,
               "rows": [{"budget_bytes": 2 << 30, "label": "2/3 of liveness", "policies": {"optimal": 0.052}}],
               "monet": r50}
    text = tradeoff_table(figures)
    assert "lower bound 1.0 GiB" in text and "MONeT, published (ResNet-50, batch 184" in text
    assert "0.66 x1.032" in text and "0.33 x1.119" in text
    from superneuron.report import write_tradeoff
    write_tradeoff(tmp_path / "t.png", figures)  # drawn with them
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def test_the_rounds_keep_the_fastest_plan_between_a_cap_that_fits_and_one_that_does_not(monkeypatch):
    """Where a plan fits by its bytes but not its placement, the rounds lower the cap by half
    that first excess a round from the top (not by each plan's own excess, which jumps: the
    holes of a plan solved a little lower are another plan's), then halve the stretch between
    the caps that fit and did not, keeping the fastest plan that fits."""
    import types

    from superneuron.scheduler import optimal_rounds as opt
    mib, budget = 1 << 20, 100 << 20
    tried = []

    def solve(model, cap, left, *args, cutoff=None, prune=None):
        tried.append(cap)
        return types.SimpleNamespace(recompute=frozenset({cap}), offload=set(), swap=set(),
                                     encode=(frozenset(), frozenset()), status="", objective=1.0,
                                     dual_bound=1.0, gap=0.0, seconds=0.0, fixed=True, nodes=0, runs={})

    def placed(candidate, context):
        cap = next(iter(candidate))
        holes = cap >= 97 * mib  # above 97 MiB the plan's bytes fit but its placement does not
        seconds = 1.0 if holes else 1.1 if cap >= 95.5 * mib else 1.5
        plan = types.SimpleNamespace(peak_bytes=budget, arena_bytes=budget + (6 * mib if holes else 0),
                                     host_bytes=0)
        return opt.Candidate("solver", None, plan, seconds, not holes, context)

    monkeypatch.setattr(opt, "solve", solve)
    monkeypatch.setattr(opt, "realise", lambda schedule, context, recompute, *args: recompute)
    monkeypatch.setattr(opt, "placed", placed)
    context = Context(PlanOptions(budget=budget))
    model = types.SimpleNamespace(resident=0)
    phases = []
    found = opt._rounds(None, context, model, (True, (), False), time.perf_counter() + 60, phases)
    assert found.fits and found.seconds == 1.1  # lowering by each excess in turn: 1.5 at 91 MiB
    assert tried[:3] == [budget, 97 * mib, 94 * mib] and max(tried) == budget
    assert phases[0]["rounds"] == len(tried) <= opt.ROUNDS and phases[0]["realised_seconds"] == 1.1
