"""Time against memory: each policy's estimated iteration time at budgets below liveness's
peak (what ``sn-plan --tradeoff`` prints and draws: the curve a user reads to choose a budget).

    table = tradeoff(base, PlanOptions(), model, liveness_seconds)

Beside the curve, where the net is one MONeT published (Shah et al. 2021, its repository's
README: ResNet-50, GoogLeNet, VGG-16), MONeT's measured points, their memory a fraction of
PyTorch's peak (which keeps and frees as liveness does) and their time an overhead over it.
"""

import dataclasses
from fractions import Fraction

from ..errors import SNError
from ..planning import fits, plan
from ..scheduler.context import Context
from ..scheduler.optimal import smallest_budget
from ..scheduler.policy import passes_of

POLICIES = ("liveness", "recompute", "offload", "superneurons", "optimal")
FRACTIONS = (2 / 3, 1 / 2, 1 / 3, 1 / 4)  # of liveness's peak (its arena without a budget)
NEAR_BOUND = 1.10  # a budget this much over the lower bound (issue 34's "near the bound")

# MONeT's published results (github.com/utsaslab/MONeT, README "Results", measured on a GPU):
# net name here -> (what ran, PyTorch's GB, [(MONeT's GB, overhead %), ...])
MONET_PUBLISHED = {
    "resnet50": ("ResNet-50, batch 184", 15.06,
                 [(10.01, 3.22), (9.01, 4.68), (8.01, 5.56), (6.99, 7.28), (6.00, 9.31), (4.99, 11.95)]),
    "googlenet": ("GoogLeNet, batch 320", 14.93,
                  [(9.98, 7.13), (8.99, 7.87), (8.01, 8.44), (7.02, 9.71), (6.01, 12.14), (4.99, 15.77)]),
    "vgg16": ("VGG-16, batch 176", 14.12,
              [(9.71, -5.30), (8.66, -4.64), (7.88, -2.18), (6.82, 1.99), (5.90, 5.44), (5.51, 9.11)]),
}


def monet_points(net_name):
    """MONeT's published points for net ``net_name`` (None if it published none): ``{"net",
    "points": [{"fraction": of PyTorch's peak, "overhead": over its time}]}``."""
    if net_name not in MONET_PUBLISHED:
        return None
    what, pytorch, points = MONET_PUBLISHED[net_name]
    return {"net": what, "points": [{"fraction": round(gb / pytorch, 4), "overhead": pct / 100}
                                    for gb, pct in points]}


def tradeoff(base, options, model, liveness_seconds, policies=POLICIES, fractions=FRACTIONS):
    """``{"liveness_bytes", "liveness_seconds", "rows": [{"budget_bytes", "label", "policies":
    {policy: seconds or None (does not fit)}}]}`` for ``base`` (a baseline schedule) under
    ``model`` (a cost.CostModel): budgets ``fractions`` of liveness's arena, and the smallest
    under which a heuristic plan fits (optimal.smallest_budget). ``options``: an
    options.PlanOptions (its placement, host memory, workspace limit and solver time; each
    policy of ``policies`` and each budget in turn replace its own)."""
    reference = plan(base, options, cost=model, policy="liveness", budget=None)[1]
    live, bound = reference.arena_bytes, reference.lower_bound_bytes
    rows = [(round(live * f), f"{_fraction(f)} of liveness") for f in fractions]
    rows.append((round(bound * NEAR_BOUND), f"{NEAR_BOUND:g}x the lower bound"))
    rows.append((_smallest(base, model, options), "smallest a heuristic fits"))
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
    return {"liveness_bytes": live, "liveness_seconds": liveness_seconds, "lower_bound_bytes": bound,
            "rows": out, "monet": monet_points(base.graph.name)}


def _smallest(base, model, options):
    """The smallest budget under which a heuristic plan (and so the optimal one) fits."""
    context = Context(dataclasses.replace(options, budget=None), model)
    return smallest_budget(base, context, passes_of)


def _fraction(f):
    q = Fraction(f).limit_denominator(12)
    return f"{q.numerator}/{q.denominator}"
