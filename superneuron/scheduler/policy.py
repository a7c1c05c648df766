"""Memory policies: named presets of passes, chosen with ``--policy``.

A policy is the list of passes applied, in order, to the baseline schedule of ``lower()``;
every pass has one shape, ``(schedule, Context) → schedule``, and every list, ``baseline``'s
included, ends with the recomputations of a layer and the in-place ReLU after it made one
pass (fuse.py), then the choice of each step's algorithm and workspace under the budget and
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
- ``gist``: liveness, with the stashes kept encoded between the forward and the backward
  (Gist: encode.py); lossless, or half precision too with ``--lossy fp16``.
- ``optimal``: the fastest schedule under the cost model that fits the budget: a
  mixed-integer program (HiGHS) chooses per stashed tensor keep, keep encoded, offload or
  recompute and per step its algorithm, against the heuristics above as incumbents
  (optimal.py; the pass plans its candidates to the end, workspace choice and placement
  included), each parameter updated right after its backward, where the optimiser allows,
  so that no gradient is resident (update.py). ``--lossy fp16`` lets it choose
  half-precision stashes too.
- ``auto``: liveness where it fits the budget (or none is given), else ``optimal``'s choice.
- ``P+params`` (``superneurons+params``, ``gist+params``, ``optimal+params``, or
  ``--offload-params`` with any policy but baseline): parameters,
  their gradients and the optimiser state on the host, prefetched for the steps that use
  them; the optimiser updates on the host (params.py). Where the policy recomputes, it
  recomputes every other join too (recompute.recompute_joins): with the parameters gone,
  the activations kept for the backward are what fills the host. ``gist+params`` keeps the
  stashes encoded besides: the encode pass runs after liveness, which it needs, on the
  schedule whose parameter copies are already in place (it leaves them as they are).
  ``optimal+params`` and ``auto+params`` weigh the ``+params`` presets and the solver's plan
  with the parameters offloaded (optimal.py).
"""

from dataclasses import replace

from ..errors import SNError
from .allreduce import DEFAULT_BUCKET_BYTES, allreduce
from .context import Context
from .cost import as_model
from .encode import encode
from .fuse import fuse_relus
from .inplace import inplace
from .liveness import liveness
from .offload import offload
from .optimal import auto, optimal
from .params import offload_params
from .placement import PLACEMENTS
from .recompute import recompute, recompute_joins
from .workspace import fit

# Every pass has one shape, (schedule, Context) → schedule; a policy is the list of them.
LIVENESS = (inplace, liveness)
# fused recomputations (fuse.py), then workspace choice and placement: every policy, baseline
# included, ends so
LAST = (fuse_relus, fit)
PRESETS = {
    "baseline": LAST,
    "liveness": LIVENESS + LAST,
    "recompute": (recompute,) + LIVENESS + LAST,
    "offload": LIVENESS + (offload,) + LAST,
    "superneurons": (recompute,) + LIVENESS + (offload,) + LAST,
    "gist": LIVENESS + (encode,) + LAST,
    "optimal": (optimal,),  # it plans every candidate to the end (LAST included) and keeps the best
    "auto": (auto,),
}
PARAMS = "+params"  # a policy name ending so keeps its parameters on the host (params.py)
# With parameter offload: it runs after recomputation (whose Recompute steps read parameters
# too) and before liveness, which then frees each parameter's device copy after its last use.
WITH_PARAMS = {
    "liveness" + PARAMS: (offload_params,) + LIVENESS + LAST,
    "recompute" + PARAMS: (recompute_joins, offload_params) + LIVENESS + LAST,
    "offload" + PARAMS: (offload_params,) + LIVENESS + (offload,) + LAST,
    "superneurons" + PARAMS: (recompute_joins, offload_params) + LIVENESS + (offload,) + LAST,
    "gist" + PARAMS: (offload_params,) + LIVENESS + (encode,) + LAST,
    # each of their plans is made with the presets above, or with parameter offload right after
    # the solver's recomputations (optimal.py reads the "+params" in the schedule's policy)
    "optimal" + PARAMS: (optimal,),
    "auto" + PARAMS: (auto,),
}
# The policies to list (--help, sn-depth's default scan): the presets and the one of the paper
# with parameter offload; any preset but baseline takes "+params".
POLICIES = {**PRESETS, "superneurons" + PARAMS: WITH_PARAMS["superneurons" + PARAMS]}
# Policies that solve a program per plan: not in sn-depth's default scan (a plan per depth).
SOLVED = ("optimal", "auto", "optimal" + PARAMS, "auto" + PARAMS)


def passes_of(name):
    """The passes of policy ``name``, in order: a preset, or a preset + ``'+params'``."""
    base = name[:-len(PARAMS)] if name.endswith(PARAMS) else name
    offered = ", ".join(WITH_PARAMS)
    if base not in PRESETS:
        raise SNError(f"unknown policy '{name}'; known: {', '.join(POLICIES)}; with parameter offload: {offered}")
    if name.endswith(PARAMS) and name not in WITH_PARAMS:
        raise SNError(f"policy '{name}': parameter offload is not offered with {base} "
                      f"(it frees a parameter's device copy after its step, which needs liveness's "
                      f"passes in a known order); with parameter offload: {offered}")
    return list(WITH_PARAMS[name] if name.endswith(PARAMS) else PRESETS[name])


def apply_policy(schedule, name, placement="dynamic", budget=None, workspace_limit=None, costs=None,
                 host_memory=None, memo=None, lossy=(), solver_seconds=None, ranks=1,
                 bucket_bytes=DEFAULT_BUCKET_BYTES):
    """The baseline ``schedule`` rewritten by policy ``name``'s passes, its algorithms and
    workspaces chosen to fit ``budget`` (bytes; None: the fastest) with none over
    ``workspace_limit`` (bytes) where there is a choice, ranked by ``costs`` (a cost.CostModel,
    a measured table, or None: estimates), then placed (``placement``: ``'dynamic'`` or
    ``'planned'``). ``host_memory`` (bytes) bounds what offloading keeps on the host. ``memo``
    (a dict): the Context's memo, to read what the passes left there (``'replayed'``: see
    workspace.fit; ``'optimal'``: see optimal.py). ``lossy``: the lossy encodings allowed
    (``('fp16',)``), which only a policy that encodes uses: SNError for one that does not.
    ``solver_seconds``: the time limit of the optimal policy's solver (None: the Context's
    default). ``ranks`` > 1: the gradients are all-reduced across that many ranks in buckets
    of ``bucket_bytes``, the first pass (allreduce.py), so that every later one sees the
    buckets. SNError for an unknown policy or placement."""
    passes = passes_of(name)
    if ranks > 1:
        passes.insert(0, allreduce)
    if placement not in PLACEMENTS:
        raise SNError(f"unknown placement '{placement}'; known: {', '.join(PLACEMENTS)}")
    if lossy and not {encode, optimal, auto} & set(passes):
        raise SNError(f"--lossy {','.join(lossy)} keeps stashes in a lossy encoding, which policy "
                      f"'{name}' does not encode; use --policy gist, optimal or auto")
    context = Context(budget, host_memory, as_model(costs), workspace_limit, placement,
                      {} if memo is None else memo, tuple(lossy), ranks=ranks, bucket_bytes=bucket_bytes)
    if solver_seconds is not None:
        context = replace(context, solver_seconds=solver_seconds)
    schedule = schedule.replace(policy=name)
    for apply in passes:
        schedule = apply(schedule, context)
    return schedule
