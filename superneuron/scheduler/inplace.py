"""In-place reuse (Layrub's intra-layer reuse, Li et al. 2019): a layer that may run in place
(``INPLACE``: ReLU, Dropout, BatchNorm, Softmax) writes its top over its bottom when nothing
after it still needs the bottom, and a layer's bottom gradient goes over its top gradient
(``Layer.grad_inplace``: an INPLACE layer's, and Scale's, Eltwise SUM's, Split's) when
nothing after it still needs the top gradient, or over its bottom (``Layer.grad_over_bottom``:
a Convolution's, whose backward is done reading a sample for the weight gradient before it
writes that sample's gradient) when nothing after it still reads the bottom: in conv → ReLU →
conv with the ReLU's backward reading its signs (encode.py, which runs this pass again for
that), the second convolution's backward holds its bottom and its bottom's gradient in one
map's memory, not two (VGG-16's conv1_2: 392 MiB at batch 32).

Caffe's explicit ``top == bottom`` is already an alias in the graph (and refused there when it
would corrupt a gradient); this pass finds the other cases from the schedule itself. The test
is on lifetimes: the top may take the bottom's storage when the last step that uses the
bottom's storage (through any alias: earlier in-place versions, Split tops) is this forward,
so no later forward reads it and no backward does — the layer's own, or the producer's
reading it as its top (a BatchNorm before a ReLU). The gradients likewise: the top gradient's
storage must be last used by this backward, the bottom gradient's first used by it.

A Graph is shared between schedules, so the pass never mutates ``graph.tensors``: it returns a
schedule whose tensors dict holds copies of the TensorInfos it aliased.
"""

from dataclasses import replace

from .liveness import SCHEDULED, not_scheduled, uses
from .steps import BACKWARD, FORWARD, MEMORY


class _Forest:
    """Storage roots as a union-find over the tensors' aliases, so a pass can merge roots as
    it decides (near-linear: paths are compressed)."""

    def __init__(self, tensors):
        self.tensors, self.up = tensors, {}

    def find(self, name):
        path = []
        while True:
            nxt = self.up.get(name)
            if nxt is None:
                info = self.tensors.get(name)
                nxt = None if info is None else info.alias
            if nxt is None:
                break
            path.append(name)
            name = nxt
        for p in path:
            self.up[p] = name
        return name

    def alias(self, name, onto):
        """Make the root ``name`` share ``onto``'s storage."""
        self.tensors[name] = replace(self.tensors[name], alias=onto)
        self.up[name] = onto


def inplace(schedule, context=None, grads_only=False):
    """The pass: the schedule with in-place layers sharing storage wherever lifetimes allow
    (it needs nothing of the Context; its memory steps are left to liveness to redo).
    ``grads_only``: only gradients take another tensor's storage, a top gradient's or a bottom's
    that the backward writing them reads last (the optimal policy's program counts them so:
    recomputation and copies change a forward value's lifetime, not those)."""
    graph = schedule.graph
    tensors = dict(schedule.tensors)
    forest = _Forest(tensors)
    resident = not_scheduled(schedule)
    steps = schedule.steps
    first, last = {}, {}
    for i, step in enumerate(steps):
        if step.kind in MEMORY:
            continue
        reads, writes = uses(graph, step)
        for name in list(writes) + list(reads):
            r = forest.find(name)
            first.setdefault(r, i)
            last[r] = i

    def scheduled(name):
        return name in tensors and name not in resident and tensors[name].kind in SCHEDULED

    def merge(i, victim, name):
        """Give ``name`` (written at step i) the storage of ``victim`` (last used at step i)."""
        v, r = forest.find(victim), forest.find(name)
        if (v == r or r != name or not scheduled(v) or not scheduled(r)
                or last.get(v) != i or first.get(r) != i
                or tensors[name].nbytes != tensors[victim].nbytes):
            return False
        forest.alias(name, victim)
        last[v] = last[r]
        return True

    merged = set()
    for i, step in enumerate(steps):
        if step.kind not in (FORWARD, BACKWARD):
            continue
        node = graph.nodes[step.node]
        layer = node.layer
        if not node.bottoms or not node.tops:
            continue
        if step.kind == FORWARD:
            if not layer.INPLACE or layer.ALIAS_TOPS or grads_only:
                continue
            bottom, top = node.bottoms[0], node.tops[0]
            others = {forest.find(b) for b in node.bottoms[1:]}
            if forest.find(bottom) not in others and merge(i, bottom, top):
                merged.add(top)
            continue
        for b, t in layer.grad_inplace():
            dx, dy = node.bottom_grads[b], node.top_grads[t]
            if dx is not None and dy is not None and merge(i, dy, dx):
                merged.add(dx)
        for b in layer.grad_over_bottom():  # where no top gradient took it
            dx = node.bottom_grads[b]
            if dx is not None and merge(i, node.bottoms[b], dx):
                merged.add(dx)
    # Tensors that now alias another take no storage of their own.
    kept = [s for s in steps if not (s.kind in MEMORY and s.tensor in merged)]
    return schedule.replace(kept, tensors=tensors)
