"""The Context of a plan: what a pass may need besides the schedule.

Every pass has one shape, ``(schedule, Context) → schedule`` (policy.py lists them in order).
The Context is the user's options (options.PlanOptions: budget, host memory, workspace limit,
placement, lossy encodings, solver time, ranks, ...), the cost model (which also keeps the
memo of each layer's algorithms) and ``memo``, where a pass leaves what a later step of the
same plan may reuse. Nothing of a plan is kept in a module: it goes when the Context goes.
"""

import dataclasses
from dataclasses import dataclass, field

from ..options import PlanOptions
from .cost import CostModel


@dataclass(frozen=True)
class Context:
    """``options``: the plan's options.PlanOptions, whose fields a pass reads as the
    Context's own (``context.budget``, ``context.placement``, ...); ``model``: a
    cost.CostModel (default: the GPU estimates); ``memo``: what passes leave for later ones
    (``'replayed'``: see workspace.fit; ``'optimal'``: what the optimal pass chose and why,
    optimal.py)."""

    options: PlanOptions = field(default_factory=PlanOptions)
    model: CostModel = field(default_factory=CostModel)
    memo: dict = field(default_factory=dict, compare=False)

    def with_options(self, **changes):
        """This Context (its model and memo) with the options' fields ``changes`` changed."""
        return dataclasses.replace(self, options=dataclasses.replace(self.options, **changes))

    # The options a pass reads, by their names (bytes; None: unbounded).
    budget = property(lambda self: self.options.budget)
    host_memory = property(lambda self: self.options.host_memory)
    workspace_limit = property(lambda self: self.options.workspace_limit)
    placement = property(lambda self: self.options.placement)
    lossy = property(lambda self: self.options.lossy)
    solver_seconds = property(lambda self: self.options.solver_seconds)
    ranks = property(lambda self: self.options.ranks)
    bucket_bytes = property(lambda self: self.options.bucket_bytes)
    offload_params = property(lambda self: self.options.offload_params)
