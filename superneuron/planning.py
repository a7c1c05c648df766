"""The one planning entry point: a network → the schedule of one iteration under a policy,
and its Plan. ``Net``, ``sn-plan``, ``sn-depth`` and the tools all plan through :func:`plan`,
so that each assembles nothing of the pipeline itself (lower → the policy's passes → workspace
choice and placement → the Simulator).

    schedule, plan = planning.plan(spec, "superneurons", budget=2 << 30, device="gpu")
    smallest = planning.min_memory(spec, "liveness")
"""

from .backend import planning_kernels
from .errors import SNError
from .graph import Graph
from .scheduler.allreduce import DEFAULT_BUCKET_BYTES
from .scheduler.cost import CostModel
from .scheduler.lower import lower
from .scheduler.policy import SOLVED, apply_policy
from .scheduler.schedule import Schedule
from .scheduler.simulate import simulate


def lowered(net, train=True, optimizer=None, device="cpu"):
    """The baseline schedule of ``net``: a NetSpec (its Graph built with the kernels that
    planning for ``device`` sees), a Graph, or a lowered Schedule (returned as it is)."""
    if isinstance(net, Schedule):
        return net
    graph = net if isinstance(net, Graph) else Graph(net, kernels=planning_kernels(device))
    return lower(graph, train=train, optimizer=optimizer)


def plan(net, policy="baseline", budget=None, host_memory=None, device="cpu", cost=None,
         placement="dynamic", workspace_limit=None, optimizer=None, train=True, lossy=(), solver_seconds=None,
         memo=None, ranks=1, bucket_bytes=DEFAULT_BUCKET_BYTES):
    """``(schedule, simulate.Plan)`` of one iteration of ``net`` (see :func:`lowered`; with
    ``optimizer``, its state is resident and the iteration ends with the update; ``train``
    False: a forward pass for testing) under ``policy``, within ``budget`` and ``host_memory``
    (bytes; None: unbounded) where the policy can make it, no workspace over
    ``workspace_limit`` where there is a choice, placed by ``placement``. ``cost``: a
    cost.CostModel, a measured table, or None (the estimates of ``device``). ``lossy``: the
    lossy encodings a policy that encodes may use (``('fp16',)``). ``solver_seconds``: the
    optimal policy's solver time limit (None: its default). ``memo`` (a dict): gets what the
    passes left (``'optimal'``: what the optimal policy chose, scheduler/optimal.py).
    ``ranks`` > 1: data-parallel, the gradients all-reduced in buckets of ``bucket_bytes``
    (scheduler/allreduce.py). SNError for an unknown policy or placement."""
    memo = {} if memo is None else memo
    schedule = apply_policy(lowered(net, train, optimizer, device), policy, placement, budget=budget,
                            workspace_limit=workspace_limit, costs=cost_model(cost, device),
                            host_memory=host_memory, memo=memo, lossy=lossy, solver_seconds=solver_seconds,
                            ranks=ranks, bucket_bytes=bucket_bytes)
    placed, replayed = memo.get("replayed", (None, None))
    return schedule, simulate(schedule, replayed if placed is schedule else None)


def cost_model(cost, device="cpu"):
    """A CostModel from ``cost``: a CostModel, a measured table (dict), or None (the estimates
    of ``device``)."""
    return cost if isinstance(cost, CostModel) else CostModel(device, cost)


def fits(plan, budget, host_memory=None):
    """Whether a simulate.Plan fits ``budget`` (its arena) and ``host_memory`` (its host bytes)."""
    return plan.fits(budget) and (host_memory is None or plan.host_bytes <= host_memory)


def min_memory(net, policy="baseline", host_memory=None, phases=(True,), **options):
    """The smallest budget B (bytes) under which ``policy``'s plans of ``net`` fit, found by
    planning: the plans made for budget B have arenas of at most B (and host bytes within
    ``host_memory``), and those made for B - 1 do not all fit B - 1. Both are checked, so that
    much holds whatever the policy does; that no smaller budget fits holds where fitting is
    monotone in the budget, which the search (a bisection) assumes: a policy that offloads
    chooses what to move by the budget and need not be monotone to the byte. ``phases``: the
    plans that must fit, ``True`` for the training iteration, ``False`` for the test forward
    (a Net's arena holds both). ``options``: as for :func:`plan`. SNError when no budget fits
    (the host memory is too small). For ``optimal`` and ``auto``: the smallest budget under
    which one of the heuristic plans they weigh fits (scheduler/optimal.py)."""
    device = options.get("device", "cpu")
    optimizer = options.pop("optimizer", None)
    options["cost"] = cost_model(options.get("cost"), device)  # made once for every plan
    bases = [lowered(net, train, optimizer, device) for train in phases]
    if policy in SOLVED:  # the smallest budget a candidate of theirs fits (each plan solves a program)
        from .scheduler.context import Context
        from .scheduler.optimal import smallest_budget
        context = Context(None, host_memory, options["cost"], options.get("workspace_limit"),
                          options.get("placement", "dynamic"))
        return max(smallest_budget(base.replace(policy=policy), context) for base in bases)
    known = {}

    def plans(budget):
        return [plan(base, policy, budget, host_memory, **options)[1] for base in bases]

    def fits_at(budget):
        if budget not in known:
            known[budget] = all(fits(p, budget, host_memory) for p in plans(budget))
        return known[budget]

    free = plans(None)
    if not all(fits(p, None, host_memory) for p in free):
        raise SNError(f"policy {policy}: no budget fits, the host memory does not "
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
