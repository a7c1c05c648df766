"""Fused recomputation: a layer and the in-place ReLU after it recomputed in one pass.

In a ResNet, a recomputed root is written by a Scale (or a block's Eltwise sum) and then by a
ReLU in place on it: two passes over memory for one tensor, where one does (the ReLU applied
to each block of the first layer's output while it is still in cache, or in the same GPU
kernel). Where a Recompute of a layer whose forward can end so (Layer.fuses_relu) is followed
by the Recompute of a ReLU (no negative slope) in place on its one top, with nothing but
memory steps of other tensors between them (liveness's Frees of what the first read last),
the pass makes them one step, ``Recompute(node, fused=relu)``, which the Runtime runs as the
layer's forward with ``ctx.relu`` set: the same bits (the same operations on each value), the
same memory (the ReLU wrote over the layer's top anyway), one pass less on a GPU (ResNet-50 at
1/3 of liveness's arena on the H100 estimates: its recomputed ReLUs 1.0 ms before, 0.02 ms
after; the cost model's ``fused_seconds``). On the CPU it takes a cache's worth at a time,
never slower than the two passes and faster on large maps only, which its model counts so.

The pass runs last before the workspace choice (every policy's ``fit``), on Recompute steps
alone: the forward's ReLUs stay steps of their own, so the forward every policy runs, and
liveness's time that the others are measured against, are unchanged.
"""

from .liveness import Roots
from .steps import MEMORY, RECOMPUTE, Recompute


def fusable(graph, first, then, roots):
    """Whether node ``then`` is a ReLU with no negative slope in place on node ``first``'s one
    top (``roots``: liveness.Roots), whose layer can end with it (Layer.fuses_relu)."""
    a, b = graph.nodes[first], graph.nodes[then]
    relu = b.layer
    return (relu.type == "ReLU" and not relu.cfg["negative_slope"] and len(a.tops) == 1
            and list(b.bottoms) == [a.tops[0]] and roots(b.tops[0]) == roots(a.tops[0]) and a.layer.fuses_relu())


def _fuses(graph, first, then, roots):
    """Whether the steps ``first`` then ``then`` are Recomputes that may run as one."""
    return (first.kind == RECOMPUTE and then.kind == RECOMPUTE and first.fused is None and then.workspace is None
            and fusable(graph, first.node, then.node, roots))


def fuse_relus(schedule, context=None):
    """The pass: each Recompute followed by one of an in-place ReLU :func:`fusable` after it,
    with nothing but memory steps of other tensors between them (liveness's Frees of what the
    first read last), made one step where the first was (see the module's docstring);
    ``schedule`` itself where there is none."""
    graph, steps = schedule.graph, schedule.steps
    roots = Roots.of(schedule)
    out, dropped = [], set()
    for i, step in enumerate(steps):
        if i in dropped:
            continue
        j = i + 1
        if step.kind == RECOMPUTE:
            root = roots(graph.nodes[step.node].tops[0]) if len(graph.nodes[step.node].tops) == 1 else None
            while j < len(steps) and steps[j].kind in MEMORY and roots(steps[j].tensor) != root:
                j += 1
        if j < len(steps) and _fuses(graph, step, steps[j], roots):
            step = Recompute(step.node, step.algorithm, step.workspace, fused=steps[j].node)
            dropped.add(j)
        out.append(step)
    return schedule.replace(out) if dropped else schedule
