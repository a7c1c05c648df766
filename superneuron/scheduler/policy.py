"""Memory policies: named presets of passes, chosen with ``--policy``.

A policy is the list of passes applied, in order, to the baseline schedule of ``lower()``;
then every policy, ``baseline`` included, chooses each step's algorithm and workspace under
the budget (workspace.py); placement (dynamic or planned) comes last, since it depends on
every Alloc and Free.

- ``baseline``: no pass; every activation and gradient lives all iteration (as in Caffe).
- ``liveness``: in-place reuse, then liveness (SuperNeurons' liveness analysis with Layrub's
  intra-layer reuse): each tensor lives from its first use to its last.
- ``recompute``: liveness, with cheap layers' outputs recomputed in the backward pass instead
  of kept (recompute.py).
- ``offload``: liveness, with activations live across the forward/backward turn offloaded to
  host memory and prefetched back (offload.py); under a budget, only as many as needed.
- ``superneurons``: all of SuperNeurons: recompute, liveness and offload (of the checkpoints
  recompute leaves), with the workspace choice every policy gets.
- ``P+params`` (``superneurons+params``, or ``--offload-params`` with any policy): parameters,
  their gradients and the optimiser state on the host, prefetched for the steps that use
  them; the optimiser updates on the host (params.py).

Still to come: ``gist``, ``optimal`` and ``auto`` (the fastest policy that fits the budget);
each is one more entry here.
"""

from dataclasses import dataclass

from ..errors import SNError
from .cost import as_model
from .inplace import inplace
from .liveness import liveness
from .offload import offload
from .params import offload_params
from .placement import PLACEMENTS
from .recompute import recompute
from .workspace import fit


@dataclass(frozen=True)
class Options:
    """What a pass may need besides the schedule: the budget and host memory (bytes, None:
    unbounded) and the cost model."""

    budget: int = None
    host_memory: int = None
    model: object = None


def _recompute(schedule, options):
    return recompute(schedule)


def _offload(schedule, options):
    return offload(schedule, options.model, options.budget, options.host_memory)


def _plain(apply):
    return lambda schedule, options: apply(schedule)


POLICIES = {
    "baseline": (),
    "liveness": (_plain(inplace), _plain(liveness)),
    "recompute": (_recompute, _plain(inplace), _plain(liveness)),
    "offload": (_plain(inplace), _plain(liveness), _offload),
    "superneurons": (_recompute, _plain(inplace), _plain(liveness), _offload),
    "superneurons+params": None,  # superneurons with --offload-params (see passes_of)
}
PARAMS = "+params"  # a policy name ending so keeps its parameters on the host (params.py)


def passes_of(name):
    """The passes of policy ``name``: a preset, or a preset + ``'+params'``, which runs the
    parameter offload pass after recomputation (whose Recompute steps read parameters too)."""
    base = name[:-len(PARAMS)] if name.endswith(PARAMS) else name
    if base not in POLICIES or base.endswith(PARAMS):
        raise SNError(f"unknown policy '{name}'; known: {', '.join(POLICIES)} "
                      f"(any of them but baseline + '{PARAMS}' offloads the parameters)")
    passes = list(POLICIES[base])
    if name.endswith(PARAMS):
        if base == "baseline":
            raise SNError(f"policy '{name}': parameter offload frees a parameter's device copy "
                          f"after its step, which needs liveness; use liveness{PARAMS} or another")
        at = 1 if passes[0] is _recompute else 0
        passes.insert(at, _plain(offload_params))
    return passes


def apply_policy(schedule, name, placement="dynamic", budget=None, workspace_limit=None, costs=None,
                 host_memory=None):
    """The baseline ``schedule`` rewritten by policy ``name``'s passes, its algorithms and
    workspaces chosen to fit ``budget`` (bytes; None: the fastest) with none over
    ``workspace_limit`` (bytes) where there is a choice, ranked by ``costs`` (a cost.CostModel,
    a measured table, or None: estimates), then placed (``placement``: ``'dynamic'`` or
    ``'planned'``). ``host_memory`` (bytes) bounds what offloading keeps on the host. SNError
    for an unknown policy or placement."""
    passes = passes_of(name)
    if placement not in PLACEMENTS:
        raise SNError(f"unknown placement '{placement}'; known: {', '.join(PLACEMENTS)}")
    model = as_model(costs)
    options = Options(budget, host_memory, model)
    for apply in passes:
        schedule = apply(schedule, options)
    return fit(schedule.replace(policy=name), placement, budget, workspace_limit, model)
