"""Time against memory: each policy's estimated iteration time at budgets below liveness's
peak (what ``sn-plan --tradeoff`` prints and draws: the curve a user reads to choose a budget).

    table = tradeoff(base, PlanOptions(), model, liveness_seconds)
"""

import dataclasses
from fractions import Fraction

from .errors import SNError
from .planning import fits, plan
from .scheduler.context import Context
from .scheduler.optimal import smallest_budget
from .scheduler.policy import passes_of

POLICIES = ("liveness", "recompute", "offload", "superneurons", "optimal")
FRACTIONS = (2 / 3, 1 / 2, 1 / 3, 1 / 4)  # of liveness's peak (its arena without a budget)


def tradeoff(base, options, model, liveness_seconds, policies=POLICIES, fractions=FRACTIONS):
    """``{"liveness_bytes", "liveness_seconds", "rows": [{"budget_bytes", "label", "policies":
    {policy: seconds or None (does not fit)}}]}`` for ``base`` (a baseline schedule) under
    ``model`` (a cost.CostModel): budgets ``fractions`` of liveness's arena, and the smallest
    under which a heuristic plan fits (optimal.smallest_budget). ``options``: an
    options.PlanOptions (its placement, host memory, workspace limit and solver time; each
    policy of ``policies`` and each budget in turn replace its own)."""
    live = plan(base, options, cost=model, policy="liveness", budget=None)[1].arena_bytes
    rows = [(round(live * f), f"{_fraction(f)} of liveness") for f in fractions]
    rows.append((_smallest(base, model, options), "smallest that fits"))
    out = []
    # the smallest budget first: optimal's plan of each is a candidate under the larger ones
    # (scheduler/optimal_monotone.py), so the curve never rises with the budget
    for budget, label in sorted(rows):
        cells = {}
        for policy in policies:
            try:
                schedule, p = plan(base, options, cost=model, policy=policy, budget=budget)
            except SNError:  # optimal's "no schedule fits"
                cells[policy] = None
                continue
            fitted = fits(p, budget, options.host_memory)
            cells[policy] = model.iteration_seconds(schedule) if fitted else None
        out.append({"budget_bytes": budget, "label": label, "policies": cells})
    order = {label: k for k, (_, label) in enumerate(rows)}
    out.sort(key=lambda row: order[row["label"]])  # as the fractions were given, the smallest last
    return {"liveness_bytes": live, "liveness_seconds": liveness_seconds, "rows": out}


def _smallest(base, model, options):
    """The smallest budget under which a heuristic plan (and so the optimal one) fits."""
    context = Context(dataclasses.replace(options, budget=None), model)
    return smallest_budget(base, context, passes_of)


def _fraction(f):
    q = Fraction(f).limit_denominator(12)
    return f"{q.numerator}/{q.denominator}"
