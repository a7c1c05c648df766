"""Fused recomputation: a layer and what follows it on its output recomputed in one pass.

In a ResNet, a recomputed root is written by a Scale (or a block's Eltwise sum) and then by a
ReLU in place on it: two passes over memory for one tensor, where one does (the ReLU applied
to each block of the first layer's output while it is still in cache, or in the same GPU
kernel). Where a Recompute of a layer whose forward can end so (Layer.fuses_relu) is followed
by the Recompute of a ReLU (no negative slope) in place on its one top, with nothing but
memory steps of other tensors between them (liveness's Frees of what the first read last),
the pass makes them one step, ``Recompute(node, fused=(relu,))``, which the Runtime runs as the
layer's forward with ``ctx.relu`` set: the same bits (the same operations on each value), the
same memory (the ReLU wrote over the layer's top anyway), one pass less on a GPU (ResNet-50 at
1/3 of liveness's arena on the H100 estimates: its recomputed ReLUs 1.0 ms before, 0.02 ms
after; the cost model's ``fused_seconds``). On the CPU it takes a cache's worth at a time,
never slower than the two passes and faster on large maps only, which its model counts so.

A BatchNorm recomputed right before the Scale on its output (a unit convolution, BatchNorm,
Scale, ReLU recomputed whole) becomes ``Recompute(bn, fused=(scale,))``, or ``(scale, relu)``
with the Scale's ReLU: one pass that normalises and writes both x_hat and the Scale's output
from the values in hand (BatchNorm.fuses_scale; ``ctx.scale``), where the Scale's own step
would read x_hat back. The Scale's top is new memory, allocated between the two steps, so the
merged step goes where the Scale's was (the BatchNorm moved down past memory steps that touch
nothing it writes, the Frees of what it reads kept after it), and only where that does not
lift the peak: the bytes live at the Scale's step, workspaces aside, plus the BatchNorm's
forward scratch (and a bottom it read last), at most the most bytes live at any compute
step. optimal's program does not count this
saving (it would take the AND of two roots' recomputations: with such a column a pair,
ResNet-50's program at a quarter of liveness's arena ended 10 % from its bound, its plan x1.41
against x1.32 without); its plans gain it here, after the solve.

The pass runs last before the workspace choice (every policy's ``fit``), on Recompute steps
alone: the forward's steps stay steps of their own, so the forward every policy runs, and
liveness's time that the others are measured against, are unchanged.
"""

from .allocator import aligned
from .liveness import Roots
from .steps import FREE, MEMORY, RECOMPUTE, Recompute
from .workspace import live_at_steps


def fusable(graph, first, then, roots):
    """Whether node ``then`` is a ReLU with no negative slope in place on node ``first``'s one
    top (``roots``: liveness.Roots), whose layer can end with it (Layer.fuses_relu)."""
    a, b = graph.nodes[first], graph.nodes[then]
    relu = b.layer
    return (relu.type == "ReLU" and not relu.cfg["negative_slope"] and len(a.tops) == 1
            and list(b.bottoms) == [a.tops[0]] and roots(b.tops[0]) == roots(a.tops[0]) and a.layer.fuses_relu())


def scale_fusable(graph, first, then, roots):
    """Whether node ``then`` is a Scale over node ``first``'s one top, on new memory, that
    ``first``'s layer can write in its own pass (BatchNorm.fuses_scale)."""
    a, b = graph.nodes[first], graph.nodes[then]
    return (b.layer.type == "Scale" and len(a.tops) == 1 and list(b.bottoms) == [a.tops[0]]
            and roots(b.tops[0]) != roots(a.tops[0]) and a.layer.fuses_scale(b.layer))


def fuse_recomputes(schedule, context=None):
    """The pass: each Recompute made one step with the Recomputes after it that its pass can
    run (see the module's docstring); ``schedule`` itself where there is none."""
    graph, steps = schedule.graph, schedule.steps
    roots = Roots.of(schedule)
    room = _Room(schedule)
    out, dropped, fused_any = [], set(), False
    i = 0
    while i < len(steps):
        step = steps[i]
        if i in dropped or step.kind != RECOMPUTE or step.fused is not None:
            if i not in dropped:
                out.append(step)
            i += 1
            continue
        chain, last, at = (), step.node, None  # the nodes fused, the last, where the merged step goes
        j = _next_compute(steps, i, roots, set(roots.uses(step)[1]))
        if j < len(steps) and _then(steps[j], step) and scale_fusable(graph, step.node, steps[j].node, roots):
            late = _freed_late(steps[i + 1:j], step, roots)
            if room.fits(j, step, sum(roots.size(s.tensor) for s in late if s.tensor != step.workspace)):
                chain, last, at = (steps[j].node,), steps[j].node, j
                dropped.add(j)
        top = graph.nodes[last].tops
        k = _next_compute(steps, at if at is not None else i, roots, {roots(top[0])} if len(top) == 1 else set())
        if k < len(steps) and _then(steps[k], step) and fusable(graph, last, steps[k].node, roots):
            chain += (steps[k].node,)
            dropped.add(k)
        if not chain:
            out.append(step)
            i += 1
            continue
        fused_any = True
        merged = Recompute(step.node, step.algorithm, step.workspace, fused=chain)
        if at is None:  # in place: where the first was
            out.append(merged)
            i += 1
            continue
        # the memory steps between (the Scale's top allocated among them) before it, but the
        # Frees of what its own layer reads (its workspace, a bottom read last), after it
        out.extend(s for s in steps[i + 1:at] if s not in late)
        out.append(merged)
        out.extend(late)
        i = at + 1
    return schedule.replace(out) if fused_any else schedule


def seconds_once_fused(schedule, steps, model):
    """Each of ``steps``' seconds (``schedule``'s, all or some: its compute steps) on the
    compute stream under cost ``model`` as they will be once this pass has run: a Recompute
    of a ReLU that it will take into the Recompute before it costs what the ReLU adds there
    (CostModel.fused_seconds). The offload pass, which runs before, times its copies by
    these: timed by the steps as they were, a copy back could land a ReLU's pass after its
    Wait. A BatchNorm's Scale is taken in only where the room allows, which the copies
    change: its step keeps its own time (a prefetch timed by it is early, never late)."""
    graph, roots = schedule.graph, Roots.of(schedule)
    seconds = [model.step_seconds(schedule, step) for step in steps]
    for i, step in enumerate(steps):
        if step.kind != RECOMPUTE or step.fused is not None or len(graph.nodes[step.node].tops) != 1:
            continue
        k = _next_compute(steps, i, roots, {roots(graph.nodes[step.node].tops[0])})
        if k < len(steps) and _then(steps[k], step) and fusable(graph, step.node, steps[k].node, roots):
            seconds[k] = model.fused_seconds(graph.nodes[steps[k].node].layer)
    return seconds


def _next_compute(steps, i, roots, held):
    """The index of the first step after ``i`` that is not a memory step of a tensor whose root
    is not in ``held``."""
    j = i + 1
    while j < len(steps) and steps[j].kind in MEMORY and roots(steps[j].tensor) not in held:
        j += 1
    return j


def _freed_late(between, first, roots):
    """The Frees among the memory steps ``between`` of what the Recompute ``first`` reads (its
    workspace, a bottom it reads last): they must come after it wherever it moves."""
    reads = set(roots.uses(first)[0]) | {roots(first.workspace)}
    return [s for s in between if s.kind == FREE and roots(s.tensor) in reads]


def _then(then, first):
    """Whether ``then`` is a plain Recompute that ``first`` (a Recompute) may take into its pass."""
    return then.kind == RECOMPUTE and then.fused is None and then.workspace is None and first.fused is None


class _Room:
    """Whether a BatchNorm's forward scratch (and ``kept`` bytes more: a bottom its step would
    have freed before) may be live at a compute step without lifting the peak (the bytes live
    there, workspaces aside, plus those, within the most live at any compute step); the walk
    that counts is made once, on first use."""

    def __init__(self, schedule):
        self.schedule, self.live = schedule, None

    def fits(self, j, first, kept=0):
        if self.live is None:
            self.live = live_at_steps(self.schedule)
            self.most = max(self.live.values(), default=0)
        layer = self.schedule.graph.nodes[first.node].layer
        scratch = max((a.workspace for a in layer.algorithms("forward")), default=0)
        return self.live[j] + aligned(scratch) + kept <= self.most
