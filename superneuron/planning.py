"""The one planning entry point: a network → the schedule of one iteration under a policy,
and its Plan. ``Net``, ``sn-plan``, ``sn-depth`` and the tools all plan through :func:`plan`,
so that each assembles nothing of the pipeline itself (lower → the policy's passes → workspace
choice and placement → the Simulator). What to plan for is one options.PlanOptions, given
whole or as its fields' keywords:

    schedule, plan = planning.plan(spec, "superneurons", budget=2 << 30, device="gpu")
    schedule, plan = planning.plan(spec, PlanOptions.of(policy="gist", memory="5MiB"))
    smallest = planning.min_memory(spec, "liveness")
    floor = planning.solver_floor(spec, "optimal")  # no plan of optimal's under it
"""

import numpy as np

from .backend import planning_kernels
from .errors import SNError
from .graph import Graph
from .options import PlanOptions
from .scheduler.context import Context
from .scheduler.cost import CostModel
from .scheduler.lower import lower
from .scheduler.optimal import lowest_budget, smallest_candidate_budget
from .scheduler.policy import apply_policy, passes_of
from .scheduler.schedule import Schedule
from .scheduler.simulate import simulate


def lowered(net, train=True, optimizer=None, device="cpu", dtype="float32"):
    """The baseline schedule of ``net``: a NetSpec (its Graph built with the kernels that
    planning for ``device`` sees, of ``dtype``), a Graph, or a lowered Schedule (returned as
    it is)."""
    if isinstance(net, Schedule):
        return net
    graph = net if isinstance(net, Graph) else Graph(net, dtype=np.dtype(dtype), kernels=planning_kernels(device))
    return lower(graph, train=train, optimizer=optimizer)


def plan(net, options=None, *, cost=None, optimizer=None, train=True, memo=None, **settings):
    """``(schedule, simulate.Plan)`` of one iteration of ``net`` (see :func:`lowered`; with
    ``optimizer``, its state is resident and the iteration ends with the update; ``train``
    False: a forward pass for testing) under ``options`` (an options.PlanOptions, or a
    policy's name) with the fields ``settings`` names changed (``budget=``, ``placement=``,
    ...: options.PlanOptions.of): the policy's passes, within the budget and host memory where
    the policy can make it, no workspace over the workspace limit where there is a choice,
    placed as the options say. ``cost``: a cost.CostModel, a measured table, or None (the
    estimates of the options' device). ``memo`` (a dict): gets what the passes left
    (``'optimal'``: what the optimal policy chose, scheduler/optimal.py). SNError for an
    option that is not one (unknown policy, bad size, ...)."""
    options = PlanOptions.of(options, **settings)
    memo = {} if memo is None else memo
    context = Context(options, cost_model(cost, options.device), memo)
    schedule = apply_policy(lowered(net, train, optimizer, options.device, options.dtype), context)
    placed, replayed = memo.get("replayed", (None, None))
    return schedule, simulate(schedule, replayed if placed is schedule else None)


def cost_model(cost, device="cpu"):
    """A CostModel from ``cost``: a CostModel, a measured table (dict), or None (the estimates
    of ``device``)."""
    return cost if isinstance(cost, CostModel) else CostModel(device, cost)


def fits(plan, budget, host_memory=None):
    """Whether a simulate.Plan fits ``budget`` (its arena) and ``host_memory`` (its host bytes)."""
    return plan.fits(budget) and (host_memory is None or plan.host_bytes <= host_memory)


def min_memory(net, options=None, *, phases=(True,), cost=None, optimizer=None, **settings):
    """The smallest budget B (bytes) under which the plans of ``net`` under ``options`` (as
    for :func:`plan`; their budget is what is searched) fit: the plans made for budget B have
    arenas of at most B (and host bytes within the host memory), and those made for B - 1 do
    not all fit B - 1. Both are checked, so that much holds whatever the policy does; that no
    smaller budget fits holds where fitting is monotone in the budget, which the search (a
    bisection) assumes: a policy that offloads chooses what to move by the budget and need not
    be monotone to the byte. ``phases``: the plans that must fit, ``True`` for the training
    iteration, ``False`` for the test forward (a Net's arena holds both). SNError when no
    budget fits (the host memory is too small). For ``optimal`` and ``auto``: the smallest
    budget under which one of the heuristic plans they weigh fits (scheduler/optimal.py)."""
    options = PlanOptions.of(options, **settings)
    host_memory = options.host_memory
    cost = cost_model(cost, options.device)  # made once for every plan
    bases = [lowered(net, train, optimizer, options.device, options.dtype) for train in phases]
    if options.solved:  # the smallest budget a candidate of theirs fits (each plan solves a program)
        context = Context(options, cost).with_options(budget=None)
        return max(smallest_candidate_budget(base, context, passes_of) for base in bases)
    known = {}

    def plans(budget):
        return [plan(base, options, cost=cost, budget=budget)[1] for base in bases]

    def fits_at(budget):
        if budget not in known:
            known[budget] = all(fits(p, budget, host_memory) for p in plans(budget))
        return known[budget]

    free = plans(None)
    if not all(fits(p, None, host_memory) for p in free):
        raise SNError(f"policy {options.name}: no budget fits, the host memory does not "
                      f"({max(p.host_bytes for p in free)} bytes needed)")
    hi = max(p.arena_bytes for p in free)
    while not fits_at(hi):  # the plan without a budget fits its own arena, but be sure
        hi *= 2
    # Start from the lower bound of the plans under a budget of nothing (their resident bytes
    # and largest step at the smallest workspaces), under which no plan can fit; should one
    # fit there after all, search on below it.
    lo = min(max(p.lower_bound_bytes for p in plans(0)), hi)
    while True:
        while lo < hi:
            mid = (lo + hi) // 2
            if fits_at(mid):
                hi = mid
            else:
                lo = mid + 1
        if lo == 0 or not fits_at(lo - 1):
            return lo
        lo, hi = 0, lo - 1


def solver_floor(net, options=None, *, cost=None, optimizer=None, **settings):
    """For ``optimal`` and ``auto``: a budget (bytes) under which no plan of the solver's fits
    the training iteration (scheduler/optimal.py's ``lowest_budget``: its program has no answer
    there, even with the optimiser's state and the parameters on the host), under
    :func:`min_memory`'s, which a heuristic's plan fits; None where it has none at all."""
    options = PlanOptions.of(options, **settings)
    cost = cost_model(cost, options.device)
    base = lowered(net, True, optimizer, options.device, options.dtype)
    return lowest_budget(base, Context(options, cost).with_options(budget=None))
