"""``optimal+params`` and ``auto+params`` (issue 15): the optimal policy's choice with every plan's
parameters, gradients and optimiser state on the host (params.py): the heuristics it weighs are
the ``+params`` presets, and the solver's plan offloads the parameters after its
recomputations.

Checked on the chain of conv → BatchNorm → Scale → ReLU blocks: within each budget, no slower
than any ``+params`` heuristic that fits, the solver's plan the winner where it should be,
the parameters on the host, plan equal to run for device and host bytes, baseline's results;
it fits budgets ``optimal`` does not; training gives baseline's weights; sn-plan takes it."""

import json

import numpy as np
import pytest
from test_memory_passes import CHAIN, assert_same_results, check_copies, feed_of, graph_of
from test_optimal import CPU, planned, same_algorithms

from superneuron.net import Net
from superneuron.netfile.spec import loads_spec
from superneuron.options import PlanOptions
from superneuron.scheduler.context import Context
from superneuron.scheduler.lower import lower
from superneuron.scheduler.optimal import HEURISTICS, smallest_budget
from superneuron.scheduler.optimal_model import build, solve
from superneuron.scheduler.params import offload_params
from superneuron.scheduler.policy import passes_of
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig


@pytest.mark.parametrize("fraction", [0.9, 0.8, 0.7])
def test_optimal_params_fits_and_beats_every_params_heuristic_that_fits(fraction):
    graph = graph_of(CHAIN)
    free = planned(graph, "liveness+params", None)[1]
    tightest = planned(graph, "liveness+params", 1)[1]  # with the smallest workspaces
    budget = int(tightest.arena_bytes * fraction)  # so that liveness+params does not fit
    memo = {}
    schedule, plan = planned(graph, "optimal+params", budget, memo)
    assert plan.arena_bytes <= budget and plan.resident_bytes == free.resident_bytes  # parameters on the host
    seconds = CPU.iteration_seconds(schedule)
    for heuristic in HEURISTICS:
        other, other_plan = planned(graph, heuristic + "+params", budget)
        if other_plan.fits(budget):
            assert seconds <= CPU.iteration_seconds(other) * (1 + 1e-12), heuristic
    info = memo["optimal"]
    assert info["candidates"]["liveness+params"] is None and info["winner"] == "solver"
    check_copies(schedule)
    runtime, run_plan = assert_same_results(graph, schedule, exact=same_algorithms(schedule, graph))[:2]
    assert (runtime.peak_bytes, runtime.arena_bytes) == (plan.peak_bytes, plan.arena_bytes)
    assert runtime.host_peak == plan.host_bytes > 0


def test_optimal_params_goes_below_what_optimal_reaches():
    base = lower(graph_of(CHAIN))
    on_device = smallest_budget(base, Context(PlanOptions("optimal"), CPU), passes_of)
    on_host = smallest_budget(base, Context(PlanOptions("optimal", offload_params=True), CPU), passes_of)
    assert on_host < on_device
    schedule, plan = planned(graph_of(CHAIN), "optimal+params", on_host)
    assert plan.arena_bytes <= on_host


def test_training_under_optimal_params_gives_baselines_weights():
    spec = loads_spec(CHAIN)
    solver = SolverConfig(momentum=0.9)
    base = Net(spec, policy="baseline", optimizer=make_optimizer(solver))
    budget = planned(graph_of(CHAIN), "liveness+params", None)[1].arena_bytes * 8 // 10
    net = Net(spec, policy="optimal+params", memory=budget, optimizer=make_optimizer(solver))
    feed = feed_of(net.graph)
    exact = same_algorithms(net.schedules["train"], net.graph)
    for it in range(2):
        loss, base_loss = net.train_step(feed, it), base.train_step(feed, it)
        assert loss == base_loss if exact else loss == pytest.approx(base_loss, rel=1e-5)
    for name in base.param_names:
        if exact:
            np.testing.assert_array_equal(net.param(name), base.param(name), err_msg=name)
        else:
            np.testing.assert_allclose(net.param(name), base.param(name), rtol=1e-4, atol=1e-6, err_msg=name)
    assert net.arena_bytes <= budget and net.runtime.host_peak == net.plans["train"].host_bytes


def test_sn_plan_takes_optimal_params_and_auto_params(capsys):
    from superneuron.cli.plan import main
    assert passes_of("optimal", True) and passes_of("auto", True)
    assert main(["tests/nets/tiny.yaml", "--policy", "optimal", "--offload-params", "--memory", "60KiB",
                 "--solver-time", "2", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["policy"] == "optimal+params" and info["arena_bytes"] <= 60 << 10 and info["host_bytes"] > 0
    assert info["optimal"]["winner"].endswith("+params") or info["optimal"]["winner"] == "solver"
    memo = {}  # auto+params: liveness+params where it fits
    free = planned(graph_of(CHAIN), "liveness+params", None)[1]
    assert planned(graph_of(CHAIN), "auto+params", free.arena_bytes, memo)[1].arena_bytes == free.arena_bytes
    assert memo["optimal"]["winner"] == "liveness+params"


def test_the_program_leaves_the_parameters_host_bytes_out_of_what_stashes_may_take():
    """Built with the parameters on the host, the program counts what they take there as fixed
    (liveness+params' host bytes): with a host memory of exactly that, no stash may go there."""
    graph = graph_of(CHAIN)
    m = build(offload_params(lower(graph)), CPU)
    assert m.host_fixed == planned(graph, "liveness+params", None)[1].host_bytes > 0
    cap = int(m.live.max() * 0.9)
    free = solve(m, cap, 5.0)
    assert free.offload | free.swap  # the premise: without a host bound it copies a stash out
    bounded = solve(m, cap, 5.0, host_memory=m.host_fixed)
    assert bounded.recompute is not None and not bounded.offload | bounded.swap
    assert bounded.objective > free.objective
