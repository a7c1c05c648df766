"""Memory policies: named presets of passes, chosen with ``--policy``.

A policy is the list of passes applied, in order, to the baseline schedule of ``lower()``;
every pass has one shape, ``(schedule, Context) → schedule``, and every list, ``baseline``'s
included, ends with the choice of each step's algorithm and workspace under the budget and
the placement (dynamic or planned), which depends on every Alloc and Free
(:func:`workspace.fit`).

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
each is one more entry in :data:`PRESETS`.
"""

from ..errors import SNError
from .allreduce import DEFAULT_BUCKET_BYTES, allreduce
from .context import Context
from .cost import as_model
from .inplace import inplace
from .liveness import liveness
from .offload import offload
from .params import offload_params
from .placement import PLACEMENTS
from .recompute import recompute
from .workspace import fit

# Every pass has one shape, (schedule, Context) → schedule; a policy is the list of them.
LIVENESS = (inplace, liveness)
LAST = (fit,)  # workspace choice and placement: every policy, baseline included, ends so
PRESETS = {
    "baseline": LAST,
    "liveness": LIVENESS + LAST,
    "recompute": (recompute,) + LIVENESS + LAST,
    "offload": LIVENESS + (offload,) + LAST,
    "superneurons": (recompute,) + LIVENESS + (offload,) + LAST,
}
PARAMS = "+params"  # a policy name ending so keeps its parameters on the host (params.py)
# With parameter offload: it runs after recomputation (whose Recompute steps read parameters
# too) and before liveness, which then frees each parameter's device copy after its last use.
WITH_PARAMS = {
    "liveness" + PARAMS: (offload_params,) + LIVENESS + LAST,
    "recompute" + PARAMS: (recompute, offload_params) + LIVENESS + LAST,
    "offload" + PARAMS: (offload_params,) + LIVENESS + (offload,) + LAST,
    "superneurons" + PARAMS: (recompute, offload_params) + LIVENESS + (offload,) + LAST,
}
# The policies to list (--help, sn-depth's default scan): the presets and the one of the paper
# with parameter offload; any preset but baseline takes "+params".
POLICIES = {**PRESETS, "superneurons" + PARAMS: WITH_PARAMS["superneurons" + PARAMS]}


def passes_of(name):
    """The passes of policy ``name``, in order: a preset, or a preset + ``'+params'``."""
    base = name[:-len(PARAMS)] if name.endswith(PARAMS) else name
    if base not in PRESETS:
        raise SNError(f"unknown policy '{name}'; known: {', '.join(POLICIES)} "
                      f"(any of them but baseline + '{PARAMS}' offloads the parameters)")
    if name.endswith(PARAMS) and name not in WITH_PARAMS:
        raise SNError(f"policy '{name}': parameter offload frees a parameter's device copy "
                      f"after its step, which needs liveness; use liveness{PARAMS} or another")
    return list(WITH_PARAMS[name] if name.endswith(PARAMS) else PRESETS[name])


def apply_policy(schedule, name, placement="dynamic", budget=None, workspace_limit=None, costs=None,
                 host_memory=None, memo=None, ranks=1, bucket_bytes=DEFAULT_BUCKET_BYTES):
    """The baseline ``schedule`` rewritten by policy ``name``'s passes, its algorithms and
    workspaces chosen to fit ``budget`` (bytes; None: the fastest) with none over
    ``workspace_limit`` (bytes) where there is a choice, ranked by ``costs`` (a cost.CostModel,
    a measured table, or None: estimates), then placed (``placement``: ``'dynamic'`` or
    ``'planned'``). ``host_memory`` (bytes) bounds what offloading keeps on the host. ``memo``
    (a dict): the Context's memo, to read what the passes left there (``'replayed'``: see
    workspace.fit). ``ranks`` > 1: the gradients are all-reduced across that many ranks in
    buckets of ``bucket_bytes``, the first pass (allreduce.py), so that every later one sees
    the buckets. SNError for an unknown policy or placement."""
    passes = passes_of(name)
    if ranks > 1:
        passes.insert(0, allreduce)
    if placement not in PLACEMENTS:
        raise SNError(f"unknown placement '{placement}'; known: {', '.join(PLACEMENTS)}")
    context = Context(budget, host_memory, as_model(costs), workspace_limit, placement,
                      {} if memo is None else memo, ranks, bucket_bytes)
    schedule = schedule.replace(policy=name)
    for apply in passes:
        schedule = apply(schedule, context)
    return schedule
