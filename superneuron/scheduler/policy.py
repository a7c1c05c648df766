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
- with parameter offload (``offload_params`` in the options; ``superneurons+params``,
  ``--offload-params`` with any policy but baseline): parameters,
  their gradients and the optimiser state on the host, prefetched for the steps that use
  them; the optimiser updates on the host (params.py). Where the policy recomputes, it
  recomputes every other join too (recompute.recompute_joins): with the parameters gone,
  the activations kept for the backward are what fills the host. ``gist`` keeps the
  stashes encoded besides: the encode pass runs after liveness, which it needs, on the
  schedule whose parameter copies are already in place (it leaves them as they are).
  ``optimal`` and ``auto`` weigh the presets with parameter offload and the solver's plan
  with the parameters offloaded (optimal.py).

``optimal`` and ``auto`` plan candidates with the other presets: the planner hands them
:func:`passes_of` as a function (they import nothing of this module).
"""

from ..errors import SNError
from ..options import LISTED, SOLVED, PlanOptions
from ..options import POLICIES as NAMES
from .allreduce import allreduce
from .context import Context
from .cost import as_model
from .encode import encode
from .fuse import fuse_recomputes
from .inplace import inplace
from .liveness import liveness
from .offload import offload
from .optimal import auto, optimal
from .params import offload_params
from .recompute import recompute, recompute_joins
from .workspace import fit


def solve_optimal(schedule, context):
    """The pass ``optimal`` (optimal.py), with the presets it weighs."""
    return optimal(schedule, context, passes_of)


def solve_auto(schedule, context):
    """The pass ``auto`` (optimal.py), with the presets it weighs."""
    return auto(schedule, context, passes_of)


# Every pass has one shape, (schedule, Context) → schedule; a policy is the list of them.
LIVENESS = (inplace, liveness)
# fused recomputations (fuse.py), then workspace choice and placement: every policy, baseline
# included, ends so
LAST = (fuse_recomputes, fit)
PRESETS = {
    "baseline": LAST,
    "liveness": LIVENESS + LAST,
    "recompute": (recompute,) + LIVENESS + LAST,
    "offload": LIVENESS + (offload,) + LAST,
    "superneurons": (recompute,) + LIVENESS + (offload,) + LAST,
    "gist": LIVENESS + (encode,) + LAST,
    "optimal": (solve_optimal,),  # it plans every candidate to the end (LAST included) and keeps the best
    "auto": (solve_auto,),
}
# With parameter offload: it runs after recomputation (whose Recompute steps read parameters
# too) and before liveness, which then frees each parameter's device copy after its last use.
WITH_PARAMS = {
    "liveness": (offload_params,) + LIVENESS + LAST,
    "recompute": (recompute_joins, offload_params) + LIVENESS + LAST,
    "offload": (offload_params,) + LIVENESS + (offload,) + LAST,
    "superneurons": (recompute_joins, offload_params) + LIVENESS + (offload,) + LAST,
    "gist": (offload_params,) + LIVENESS + (encode,) + LAST,
    # each of their plans is made with the presets above, or with parameter offload right after
    # the solver's recomputations (optimal.py reads the Context's offload_params)
    "optimal": (solve_optimal,),
    "auto": (solve_auto,),
}
assert set(PRESETS) == set(NAMES) and set(WITH_PARAMS) == set(NAMES) - {"baseline"}  # options.py's names
POLICIES = LISTED  # the policies to list (--help, sn-depth's default scan)
__all__ = ["POLICIES", "PRESETS", "SOLVED", "WITH_PARAMS", "apply_policy", "passes_of"]


def passes_of(name, offload_params=False):
    """The passes of preset ``name`` in order, with parameter offload if ``offload_params``
    (a name that ends in ``+params`` is read by options.PlanOptions, which gives this its
    preset and the flag). SNError for an unknown preset or one without parameter offload."""
    table = WITH_PARAMS if offload_params else PRESETS
    if name not in table:
        raise SNError(f"unknown policy '{name}'{' with parameter offload' if offload_params else ''}; "
                      f"known: {', '.join(table)}")
    return list(table[name])


def apply_policy(schedule, context, costs=None, memo=None, **settings):
    """The baseline ``schedule`` rewritten by the passes of the policy of ``context`` (a
    Context: the options, the cost model, and the memo where the passes leave what they found,
    ``'replayed'``: see workspace.fit; ``'optimal'``: see optimal.py), its algorithms and
    workspaces chosen to fit the budget with none over the workspace limit where there is a
    choice, then placed. ``context`` may also be an options.PlanOptions or a policy's name,
    with the fields ``settings`` names changed, ranked by ``costs`` (a cost.CostModel, a
    measured table, or None: estimates) and leaving what the passes found in ``memo``. With
    ranks > 1 the gradients are all-reduced in buckets, the first pass (allreduce.py), so that
    every later one sees the buckets. The options' lossy encodings need a policy that encodes:
    SNError for one that does not."""
    if not isinstance(context, Context):
        context = Context(PlanOptions.of(context, **settings), as_model(costs), {} if memo is None else memo)
    options = context.options
    passes = passes_of(options.policy, options.offload_params)
    if options.ranks > 1:
        passes.insert(0, allreduce)
    if options.lossy and options.policy not in ("gist", "optimal", "auto"):
        raise SNError(f"--lossy {','.join(options.lossy)} keeps stashes in a lossy encoding, which policy "
                      f"'{options.name}' does not encode; use --policy gist, optimal or auto")
    schedule = schedule.replace(policy=options.name)
    for apply in passes:
        schedule = apply(schedule, context)
    return schedule
