"""Liveness analysis (SuperNeurons, Wang et al. 2018): each tensor lives from the step that
first uses it to the step that last uses it, instead of all iteration.

One sweep over the compute steps finds the first and last use of every storage root (a
tensor that aliases another takes no storage of its own; its uses count for its root). The
pass then allocates each root right before its first use and frees it right after its last,
so an activation that no backward reads is gone as soon as the layers after it have run, and
a gradient is gone as soon as the backward below it has consumed it.

What a step uses is :func:`uses`: a forward reads its bottoms and writes its tops (a Split's
tops are views of its bottom: its forward touches nothing); a backward reads the bottoms and
tops its layer's ``backward_reads`` names and its top gradients, and writes its bottom
gradients. The loss gradient, which the runtime fills just before the loss layer's backward,
is thereby allocated right before that backward. Resident tensors (parameters, their
gradients, optimiser state) are never scheduled.
"""

from .schedule import MEMORY, Alloc, Free, root

SCHEDULED = ("data", "grad", "workspace", "encoded")  # kinds whose storage the steps manage


def uses(graph, step):
    """``(reads, writes)``: the tensor names a compute step reads and writes (its workspace
    aside). Memory steps and the update (resident tensors only) use none."""
    kind = step.kind
    if kind in ("forward", "recompute"):
        node = graph.nodes[step.target]
        if node.layer.ALIAS_TOPS:
            return (), ()
        return node.bottoms, node.tops
    if kind == "backward":
        node = graph.nodes[step.target]
        reads_b, reads_t = node.layer.backward_reads()
        reads = [node.bottoms[i] for i in reads_b] + [node.tops[i] for i in reads_t]
        reads += [g for g in node.top_grads if g is not None]
        writes = [g for g in node.bottom_grads if g is not None] + list(node.param_grads.values())
        return reads, writes
    return (), ()


class Roots:
    """``name → storage root`` in a schedule's tensors, memoised (a pass asks millions of
    times). ``scheduled(name)`` is the root when the steps manage its storage, else None."""

    def __init__(self, schedule):
        self.tensors = schedule.tensors
        self.resident = set(schedule.resident)
        self.memo = {}

    def __call__(self, name):
        r = self.memo.get(name)
        if r is None:
            r = self.memo[name] = root(self.tensors, name)
        return r

    def scheduled(self, name):
        r = self(name)
        info = self.tensors.get(r)
        if r in self.resident or info is None or info.kind not in SCHEDULED:
            return None
        return r


def step_roots(schedule, step, roots):
    """The scheduled roots a compute step touches, writes first, each once, workspace last."""
    reads, writes = uses(schedule.graph, step)
    out = {}
    for name in list(writes) + list(reads):
        r = roots.scheduled(name)
        if r is not None:
            out[r] = True
    if step.workspace:
        out[step.workspace] = True
    return list(out)


def first_last_uses(schedule, steps, roots):
    """``(first, last)``: for each scheduled root, the indices in ``steps`` of the first and
    last step that uses it (one sweep)."""
    first, last = {}, {}
    for i, step in enumerate(steps):
        for r in step_roots(schedule, step, roots):
            first.setdefault(r, i)
            last[r] = i
    return first, last


def liveness(schedule):
    """The schedule with every scheduled root allocated right before its first use and freed
    right after its last (the input's own Alloc and Free steps are dropped). Works on training
    and test schedules alike."""
    roots = Roots(schedule)
    compute = [s for s in schedule.steps if s.kind not in MEMORY]
    first, last = first_last_uses(schedule, compute, roots)
    starts, ends = {}, {}
    for r, i in first.items():
        starts.setdefault(i, []).append(r)
    for r, i in last.items():
        ends.setdefault(i, []).append(r)
    steps = []
    for i, step in enumerate(compute):
        steps += [Alloc(r) for r in starts.get(i, ())]
        steps.append(step)
        steps += [Free(r) for r in ends.get(i, ())]
    return schedule.replace(steps)
