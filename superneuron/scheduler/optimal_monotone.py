"""More memory, never a slower plan: the optimal policy's plans of one net kept by budget,
so that a plan asked for under a larger budget in the same process (``sn-plan --tradeoff``,
tools/optimal_table.py, a Python loop over budgets) is never slower than one already found
under a smaller budget, which fits the larger one too.

The solver alone does not promise it: its programs are solved to a gap (0.5 %), their plans
realised by passes whose placement is not smooth in the budget, so a plan found under more
memory can come out a few percent slower (CIFAR ResNet-14 at batch 4, H100 estimates: x1.337
at 0.567 of liveness's arena, x1.400 at 0.611). Where one was found under a smaller budget
for the same net and options, it is a candidate too, and the faster wins.

A plan depends only on the net, the options and the budget (optimal_highs.py: no wall
clock), so what is kept here never changes a plan's bytes or steps, only which of two valid
plans is chosen; a fresh process (one ``sn-plan`` command) plans as if nothing were kept.
"""

import collections

KEPT_NETS = 4  # nets (with their options) whose plans are kept, the least recently used dropped
KEPT_PLANS = 16  # plans kept per net


class Smaller:
    """The fastest plan (an optimal_rounds.Candidate) found so far for each budget of each net."""

    def __init__(self):
        self.nets = collections.OrderedDict()

    def best_under(self, key, budget):
        """The fastest candidate kept for ``key`` under a budget below ``budget``, else None (the
        same budget plans the same again: a plan is deterministic)."""
        kept = self.nets.get(key)
        if kept is None:
            return None
        self.nets.move_to_end(key)
        fitting = [c for b, c in kept if b < budget]
        return min(fitting, key=lambda c: (c.seconds, c.plan.arena_bytes)) if fitting else None

    def keep(self, key, budget, candidate):
        """Keep ``candidate``, the plan chosen for ``key`` under ``budget``."""
        kept = self.nets.setdefault(key, [])
        self.nets.move_to_end(key)
        kept[:] = [(b, c) for b, c in kept if b != budget][-(KEPT_PLANS - 1):] + [(budget, candidate)]
        while len(self.nets) > KEPT_NETS:
            self.nets.popitem(last=False)


SMALLER = Smaller()


def key_of(schedule, context):
    """What a plan depends on besides the budget: the schedule's steps, tensors and policy,
    and the Context's other options (the cost model by identity: a table may be measured)."""
    tensors = tuple(sorted((name, t.nbytes, t.kind) for name, t in schedule.tensors.items()))
    return (schedule.policy, tuple(schedule.steps), tensors, schedule.resident_bytes, id(context.model),
            context.host_memory, context.workspace_limit, context.placement, context.lossy,
            getattr(context, "ranks", 1), getattr(context, "bucket_bytes", None))
