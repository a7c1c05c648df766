"""The planning entry point (superneuron/planning.py): the smallest budget that fits
(``min_memory``, ``Net.min_memory``, ``sn-plan --min-memory``) and the line that says why a
plan does not fit (the step where the budget is first exceeded, and apart from it the peak)."""

import json
import os

import pytest

from superneuron.cli.plan import build_parser, main, plan_from_args
from superneuron.errors import SNError
from superneuron.net import Net
from superneuron.netfile.spec import load_spec
from superneuron.planning import fits, min_memory, plan
from superneuron.scheduler.allocator import aligned
from superneuron.scheduler.simulate import compute_step
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "nets", "tiny.yaml")
LENET = os.path.join(ROOT, "nets", "lenet.yaml")


@pytest.mark.parametrize("policy", ["baseline", "liveness", "recompute", "offload", "superneurons",
                                    "liveness+params"])
def test_min_memory_fits_there_and_not_one_byte_less(policy):
    spec = load_spec(TINY)
    smallest = min_memory(spec, policy)
    at = plan(spec, policy, budget=smallest)[1]
    under = plan(spec, policy, budget=smallest - 1)[1]
    assert fits(at, smallest) and at.arena_bytes <= smallest
    assert not fits(under, smallest - 1)
    # and it is below what the plan without a budget takes (workspaces shrink to fit)
    assert smallest <= plan(spec, policy)[1].arena_bytes


def test_net_min_memory_builds_there_and_refuses_one_byte_less():
    spec = load_spec(TINY)
    opt = make_optimizer(SolverConfig())
    smallest = Net(spec, optimizer=opt, policy="liveness").min_memory()
    net = Net(spec, optimizer=opt, policy="liveness", memory=smallest)
    assert net.arena_bytes == smallest and max(p.arena_bytes for p in net.plans.values()) <= smallest
    with pytest.raises(SNError, match="the budget is first exceeded at"):
        Net(spec, optimizer=opt, policy="liveness", memory=smallest - 1)


def test_sn_plan_min_memory_prints_the_search_answer(capsys):
    assert main([TINY, "--policy", "superneurons", "--min-memory", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    opt = make_optimizer(SolverConfig())  # sn-plan's default solver: SGD with momentum
    assert info["min_memory_bytes"] == min_memory(load_spec(TINY), "superneurons", optimizer=opt)
    assert main([TINY, "--policy", "superneurons", "--min-memory"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("min memory"))
    assert f"({info['min_memory_bytes']} bytes)" in line and f"at {info['min_memory_bytes'] - 1} bytes" in line


def _live_by_hand(schedule):
    """Device bytes after each step, from the Alloc and Free steps alone (resident included)."""
    sizes, live, out = schedule.tensors, sum(aligned(schedule.tensors[t].nbytes) for t in schedule.resident), []
    for step in schedule.steps:
        if step.kind == "alloc":
            live += aligned(sizes[step.tensor].nbytes)
        elif step.kind == "free":
            live -= aligned(sizes[step.tensor].nbytes)
        out.append(live)
    return out


def test_the_overflow_line_names_the_first_step_over_and_the_peak_apart(capsys):
    # LeNet under liveness: under some budget the bytes live first pass it at one step and
    # peak at another (sn-plan used to name the first as if it held the peak).
    def planned(*argv):
        return plan_from_args(build_parser().parse_args([LENET, "--policy", "liveness", *argv]))[0]

    def case(budget):
        """``(budget, schedule, live, first, peak)`` at ``budget`` (the oracle: the Alloc and Free steps
        summed by hand), or None where it fits or is first exceeded at its peak's step."""
        schedule = planned("--memory", str(budget))
        if budget < sum(aligned(schedule.tensors[t].nbytes) for t in schedule.resident):
            return None  # the resident tensors alone exceed it: the next test's case
        live = _live_by_hand(schedule)
        first = next((i for i, x in enumerate(live) if x > budget), None)
        peak = live.index(max(live))
        if first is None or compute_step(schedule, first) == compute_step(schedule, peak):
            return None
        return budget, schedule, live, first, peak

    # budgets just under each level the bytes live reach without one, lowest first
    levels = sorted(set(_live_by_hand(planned())))
    budget, schedule, live, first, peak = next(c for c in map(case, (v - 1 for v in levels)) if c)
    first_name, peak_name = compute_step(schedule, first), compute_step(schedule, peak)
    assert main([LENET, "--policy", "liveness", "--memory", str(budget), "--json"]) == 3
    info = json.loads(capsys.readouterr().out)
    assert info["overflow"]["step"] == first_name and info["overflow"]["step_index"] == first
    assert info["overflow"]["bytes_at_step"] == live[first]
    assert info["peak_step"] == peak_name and info["peak_bytes"] == max(live)
    assert main([LENET, "--policy", "liveness", "--memory", str(budget)]) == 3
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("needs "))
    assert f"first exceeded at {first_name} (" in line and f"at {peak_name}; budget" in line


def test_a_budget_under_the_resident_tensors_says_so(capsys):
    assert main([LENET, "--policy", "liveness", "--memory", "1000", "--json"]) == 3
    info = json.loads(capsys.readouterr().out)
    assert info["overflow"]["step"] == "the resident tensors" and info["overflow"]["step_index"] is None
    assert info["overflow"]["bytes_at_step"] == info["resident_bytes"] > 1000
