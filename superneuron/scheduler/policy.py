"""Memory policies: named presets of passes, chosen with ``--policy``.

A policy is the list of passes applied, in order, to the baseline schedule of ``lower()``;
then every policy, ``baseline`` included, chooses each step's algorithm and workspace under
the budget (workspace.py); placement (dynamic or planned) comes last, since it depends on
every Alloc and Free.

- ``baseline``: no pass; every activation and gradient lives all iteration (as in Caffe).
- ``liveness``: in-place reuse, then liveness (SuperNeurons' liveness analysis with Layrub's
  intra-layer reuse): each tensor lives from its first use to its last.

Still to come: ``recompute``, ``offload``, ``superneurons``, ``gist``, ``optimal`` and ``auto``
(the fastest policy that fits the budget); each is one more entry here.
"""

from ..errors import SNError
from .inplace import inplace
from .liveness import liveness
from .placement import PLACEMENTS
from .workspace import fit

POLICIES = {
    "baseline": (),
    "liveness": (inplace, liveness),
}


def apply_policy(schedule, name, placement="dynamic", budget=None, workspace_limit=None, costs=None):
    """The baseline ``schedule`` rewritten by policy ``name``'s passes, its algorithms and
    workspaces chosen to fit ``budget`` (bytes; None: the fastest) with none over
    ``workspace_limit`` (bytes) where there is a choice, ranked by ``costs`` (a cost.CostModel,
    a measured table, or None: estimates), then placed (``placement``: ``'dynamic'`` or
    ``'planned'``). SNError for an unknown policy or placement."""
    if name not in POLICIES:
        raise SNError(f"unknown policy '{name}'; known: {', '.join(POLICIES)}")
    if placement not in PLACEMENTS:
        raise SNError(f"unknown placement '{placement}'; known: {', '.join(PLACEMENTS)}")
    for apply in POLICIES[name]:
        schedule = apply(schedule)
    return fit(schedule.replace(policy=name), placement, budget, workspace_limit, costs)
