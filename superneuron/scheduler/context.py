"""The Context of a plan: what a pass may need besides the schedule.

Every pass has one shape, ``(schedule, Context) → schedule`` (policy.py lists them in order).
The Context carries the budget and host memory, the cost model (which also keeps the memo of
each layer's algorithms), the largest workspace of any choice, the placement, and ``memo``,
where a pass leaves what a later step of the same plan may reuse. Nothing of a plan is kept
in a module: it goes when the Context goes.
"""

from dataclasses import dataclass, field

from .allreduce import DEFAULT_BUCKET_BYTES
from .cost import CostModel


@dataclass(frozen=True)
class Context:
    """``budget`` and ``host_memory``: bytes (None: unbounded); ``model``: a cost.CostModel
    (default: the GPU estimates); ``workspace_limit``: bytes, the largest workspace where a
    layer has a choice (None: no limit); ``placement``: ``'dynamic'`` or ``'planned'``;
    ``memo``: what passes leave for later ones (``'replayed'``: see workspace.fit;
    ``'optimal'``: what the optimal pass chose and why, optimal.py); ``lossy``: the lossy
    encodings the encode pass may use (``('fp16',)``: ``--lossy fp16``); ``solver_seconds``:
    a cap on the optimal policy's solving time (None: none; its work limits end it, and
    the plan is the same on every run: optimal_model.py); ``ranks``: data-parallel
    ranks, whose gradients are all-reduced in buckets of ``bucket_bytes`` (allreduce.py)."""

    budget: int = None
    host_memory: int = None
    model: CostModel = field(default_factory=CostModel)
    workspace_limit: int = None
    placement: str = "dynamic"
    memo: dict = field(default_factory=dict, compare=False)
    lossy: tuple = ()
    solver_seconds: float = None
    ranks: int = 1
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
