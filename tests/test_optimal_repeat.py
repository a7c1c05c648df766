"""The optimal policy's plans repeat and never get slower with more memory (issue 34):
scheduler/optimal_highs.py (HiGHS deterministic: one thread, a fixed seed, work limits, no
wall clock) and scheduler/optimal_monotone.py (a smaller budget's plan a candidate)."""

import hashlib
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
from scipy.optimize import LinearConstraint

from superneuron.graph import Graph
from superneuron.netfile.spec import load_spec
from superneuron.scheduler import optimal, optimal_highs, optimal_rounds
from superneuron.scheduler.cost import CostModel
from superneuron.scheduler.lower import lower
from superneuron.scheduler.optimal_monotone import SMALLER
from superneuron.scheduler.policy import apply_policy
from superneuron.scheduler.simulate import simulate

CPU = CostModel("cpu")

PLAN_ONCE = """
import hashlib, sys
from superneuron.graph import Graph
from superneuron.scheduler.cost import CostModel
from superneuron.scheduler.lower import lower
from superneuron.scheduler.policy import apply_policy
from superneuron.netfile.spec import load_spec
g = Graph(load_spec("nets/resnet_cifar.yaml", overrides={"depth": 8}, batch=4))
memo = {}
s = apply_policy(lower(g), "optimal", budget=int(sys.argv[1]), costs=CostModel("cpu"), memo=memo)
print(memo["optimal"]["winner"], hashlib.sha1(repr(list(s.steps)).encode()).hexdigest(), s.offsets is None)
"""


def resnet8():
    return Graph(load_spec("nets/resnet_cifar.yaml", overrides={"depth": 8}, batch=4))


def liveness_arena(graph):
    return simulate(apply_policy(lower(graph), "liveness", costs=CPU)).arena_bytes


def test_the_same_command_gives_the_same_plan_in_two_processes():
    budget = liveness_arena(resnet8()) * 2 // 5
    outputs = []
    for seed in ("1", "2"):  # string hashing, and so set order, differs between the two
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=os.getcwd())
        done = subprocess.run([sys.executable, "-c", PLAN_ONCE, str(budget)], env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.split())
    assert outputs[0][0] == "solver"  # the solver's plan, not a heuristic's, is what repeats
    assert outputs[0] == outputs[1]


def test_the_same_plan_twice_in_one_process_with_nothing_kept():
    graph = resnet8()
    budget = liveness_arena(graph) * 2 // 5
    digests = []
    for _ in range(2):
        SMALLER.nets.clear()
        schedule = apply_policy(lower(graph), "optimal", budget=budget, costs=CPU)
        digests.append(hashlib.sha1(repr(list(schedule.steps)).encode()).hexdigest())
    assert digests[0] == digests[1]


def test_ten_budgets_more_memory_never_a_slower_plan():
    graph = resnet8()
    live = liveness_arena(graph)
    SMALLER.nets.clear()
    seconds = []
    for k in range(10):
        budget = int(live * (0.35 + 0.4 * k / 9))
        schedule = apply_policy(lower(graph), "optimal", budget=budget, costs=CPU)
        assert simulate(schedule).arena_bytes <= budget
        seconds.append(CPU.iteration_seconds(schedule))
    assert all(a >= b for a, b in zip(seconds, seconds[1:])), seconds
    assert seconds[0] > seconds[-1]  # the budgets span plans that differ


def test_a_smaller_budgets_plan_wins_where_the_larger_budget_plans_slower(monkeypatch):
    graph = resnet8()
    live = liveness_arena(graph)
    small, large = live * 2 // 5, live * 9 // 20
    SMALLER.nets.clear()
    fast = apply_policy(lower(graph), "optimal", budget=small, costs=CPU)
    monkeypatch.setattr(optimal_rounds, "SOLVES", 0)  # no solver under the larger budget: the heuristics alone
    memo = {}
    kept = apply_policy(lower(graph), "optimal", budget=large, costs=CPU, memo=memo)
    heuristics = [s for name, s in memo["optimal"]["candidates"].items() if name in optimal.HEURISTICS and s]
    assert min(heuristics) > CPU.iteration_seconds(fast)  # the heuristics alone are slower here
    assert memo["optimal"]["winner"] == "smaller budget"
    assert CPU.iteration_seconds(kept) == CPU.iteration_seconds(fast)
    assert simulate(kept).arena_bytes <= small
    SMALLER.nets.clear()
    alone = apply_policy(lower(graph), "optimal", budget=large, costs=CPU, memo={})  # nothing kept: heuristics
    assert CPU.iteration_seconds(alone) > CPU.iteration_seconds(kept)


def test_a_relaxation_over_the_cutoff_ends_the_solve_without_an_answer():
    # two binaries, at least 1.5 of them: the relaxation's bound 1.5, the optimum 2
    args = (np.ones(2), np.ones(2), (np.zeros(2), np.ones(2)), LinearConstraint(np.ones((1, 2)), 1.5, np.inf), 1e-6)
    assert optimal_highs.run(*args).fun == 2.0
    over = optimal_highs.run(*args, cutoff=1.4)
    assert over.x is None and over.bound == 1.5 and set(over.seconds) == {"relaxation"}
    under = optimal_highs.run(*args, cutoff=1.6)  # the bound is under it: solved, whatever the answer
    assert under.fun == 2.0


def test_an_answer_in_hand_is_kept_where_the_whole_programs_search_ends_worse(monkeypatch):
    """With the relaxation's integral part fixed the program has an answer, but not within the
    gap; the whole program's search, ended by its node limit, may end on a worse one (ResNet-152
    near its lower bound: 254.9 against 219.1 in hand). The better answer is kept, against the
    whole program's bound where that is the higher."""
    # three binaries, at least 1.5 of them, the third dearer: the relaxation's bound 1.5, and
    # with its integral part fixed (the first at 1, the third at 0) the answer 2 (25 % over)
    args = (np.array([1.0, 1.0, 1.5]), np.ones(3), (np.zeros(3), np.ones(3)),
            LinearConstraint(np.ones((1, 3)), 1.5, np.inf), 1e-6)
    honest = optimal_highs.run(*args)
    assert honest.fun == 2.0 and not honest.fixed  # the whole program's answer, as good
    milp = optimal_highs._milp

    def worse_whole(c, integrality, bounds, constraints, options, seconds, what):
        if what == "whole":  # a search that ran out of nodes on the third binary
            return SimpleNamespace(x=np.array([1.0, 0.0, 1.0]), fun=2.5, mip_dual_bound=1.6, mip_gap=0.36,
                                   message="node limit", mip_node_count=200)
        return milp(c, integrality, bounds, constraints, options, seconds, what)

    monkeypatch.setattr(optimal_highs, "_milp", worse_whole)
    kept = optimal_highs.run(*args)
    assert kept.fun == 2.0 and kept.fixed and list(np.round(kept.x)) == [1.0, 1.0, 0.0]
    assert kept.bound == 1.6 and abs(kept.gap - 0.2) < 1e-12


def test_the_cutoff_changes_no_plan(monkeypatch):
    graph = resnet8()
    budget = liveness_arena(graph) * 2 // 5
    digests, cut = [], []
    solve = optimal_rounds.solve

    def without_cutoff(*args, cutoff=None, **kwargs):
        return solve(*args, **kwargs)

    def noting(*args, cutoff=None, **kwargs):
        cut.append(cutoff)
        return solve(*args, cutoff=cutoff, **kwargs)

    for wrapper in (without_cutoff, noting):
        monkeypatch.setattr(optimal_rounds, "solve", wrapper)
        SMALLER.nets.clear()
        schedule = apply_policy(lower(graph), "optimal", budget=budget, costs=CPU)
        digests.append(hashlib.sha1(repr(list(schedule.steps)).encode()).hexdigest())
    assert digests[0] == digests[1]
    assert any(c is not None for c in cut)  # rounds after the first had one (ResNet-1001's cut whole programs)


def test_prune_hands_the_search_its_bound_and_keeps_the_answers_under_it(monkeypatch):
    """``prune`` is HiGHS's objective bound for the runs after the relaxation: a program whose
    answers are all over it ends its search sooner; one with an answer under it finds the same
    answer (a covering program of 60 binaries: its optimum 14.32, relaxation under 13)."""
    rng = np.random.default_rng(0)
    c, cover = rng.uniform(1, 10, 60), rng.uniform(0, 1, (30, 60))
    args = (c, np.ones(60), (np.zeros(60), np.ones(60)), LinearConstraint(cover, 3.0, np.inf), 1e-6)
    whole = optimal_highs.run(*args)
    assert abs(whole.fun - 14.316) < 1e-3 and whole.nodes > 5
    over = optimal_highs.run(*args, prune=13.0)  # no answer under it: the search ends at once
    assert (over.x is None or over.fun > 13.0) and over.nodes < whole.nodes
    assert over.bound <= whole.fun  # what it proved: none under 13, not its answer's value
    under = optimal_highs.run(*args, prune=15.0)
    assert list(np.round(under.x)) == list(np.round(whole.x)) and abs(under.fun - whole.fun) < 1e-9
    seen = []
    milp = optimal_highs._milp

    def noting(c, integrality, bounds, constraints, options, seconds, what):
        seen.append((what, options.get("objective_bound")))
        return milp(c, integrality, bounds, constraints, options, seconds, what)

    monkeypatch.setattr(optimal_highs, "_milp", noting)
    optimal_highs.run(*args, prune=15.0)
    assert seen[0] == ("relaxation", None) and all(bound == 15.0 for _, bound in seen[1:]) and len(seen) > 1
