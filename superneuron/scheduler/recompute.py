"""Cost-aware recomputation (SuperNeurons, Wang et al. 2018): the outputs of cheap layers
(ReLU, BatchNorm, Scale, Pooling, LRN, Dropout) are not kept from the forward to the backward
pass; the backward re-runs the cheap layers from the nearest checkpoint instead.

A storage root is *recomputable* when every layer that writes it is cheap, single-input and
not a loss, the first of them reads the final contents of another root (a checkpoint, or a
recomputable root in turn) and the others run in place on it. Everything else is a
*checkpoint*: outputs of convolutions, inner products, joins (Eltwise, Concat) and the roots
that a cheap layer modifies in place after an expensive one wrote them (Caffe's in-place
BatchNorm on a convolution's output). A *segment* is the recomputable roots grown from one
checkpoint.

The pass inserts ``Recompute`` steps before the backward steps that read a recomputable root,
in one of SuperNeurons' two modes, chosen per segment:

- speed-centric: each root of the segment is recomputed once, before the first backward step
  that needs it, and kept through that segment's backward (liveness frees it after its last
  read);
- memory-centric: before each backward step, just what that step reads (and the chain
  leading to it) is recomputed, and freed right after.

Speed-centric is chosen where the segment's bytes fit under the largest working set of any
step (the peak that the largest layer sets anyway), memory-centric where they do not.

Only compute steps change; the memory steps stay those of the input (``liveness`` afterwards
frees each root between its forward and its recomputed uses: a Recompute writes without
reading, so it starts a new live interval). A Recompute runs the layer's forward with
``ctx.recompute`` set, which reproduces Dropout's mask and leaves BatchNorm's running
statistics alone, so results are bit-identical.

With ``joins`` (:func:`recompute_joins`, the pass of the ``+params`` policies, where the host
holds what the device cannot and its memory ends the depth a budget allows), a join (Eltwise,
Concat: cheap, several inputs) is recomputed too where every input it reads is a checkpoint or
recomputable from one without another join: in a ResNet, every other block's sum (its ReLU in
place) is then rebuilt in the backward from the block's input, kept for the block's first
convolution anyway, and its last convolution's output, kept for its BatchNorm anyway (Scale,
Eltwise and ReLU re-run), instead of being kept itself: a fifth less to keep per bottleneck
block on average (12.25 of 30.6 MiB every other block at 14x14, batch 16). Recomputing two joins in a
row would keep the first through the second's backward; one at a time, each recomputed join
is needed only from the backward of the layer it feeds to that of the layer before it. A join
is recomputed once (speed-centric), for the first backward step that reads it.

The optimal policy's choice (:func:`with_recomputes` with ``only``) may recompute more: the
outputs of single-input expensive layers (convolutions, inner products) and of any join,
from every root it reads, each made valid again first (kept, or recomputed before it in the
same gap), all speed-centric; its program decides which (optimal_stashes.py).
"""

from .context import Context
from .liveness import Roots, uses
from .schedule import add_workspace
from .simulate import largest_working_set
from .steps import BACKWARD, Alloc, Free, Recompute


def _writers(graph, roots):
    """``{root: [indices of the nodes that write it]}``, roots and nodes in forward order."""
    writers = {}
    for node in graph.nodes:
        if node.layer.ALIAS_TOPS:
            continue
        for t in node.tops:
            r = roots.scheduled(t)
            if r is not None:
                writers.setdefault(r, []).append(node.index)
    return writers


def _recomputable(graph, roots, expensive=False, joins=False):
    """``{root: [writer node indices, forward order]}`` for every recomputable root, and
    ``{root: (source roots)}`` (the roots its first writer reads). ``expensive``: single-input
    layers that are not cheap (convolutions, inner products) may be recomputed too (the
    optimal policy weighs their cost; the cheap-layer rule of SuperNeurons does not).
    ``joins``: so may any join (Eltwise, Concat), from every root it reads; it is valid again
    once each of them is (kept, or recomputed first): the optimal policy's candidates, of
    which its program chooses (:func:`_recomputable_joins` is the ``+params`` policies' rule)."""
    writers = _writers(graph, roots)
    last_writer = {r: w[-1] for r, w in writers.items()}

    def recomputable_writer(node, first):
        layer = node.layer
        if (layer.LOSS or not node.backward or len(node.tops) != 1 or not (layer.CHEAP or expensive)
                or not layer.RECOMPUTABLE):
            return False
        if len(node.bottoms) == 1:
            return 0 not in layer.LABEL_BOTTOMS
        # a join: only as the root's first writer, from its data bottoms alone
        return joins and first and layer.CHEAP and len(node.bottoms) > 1 and not layer.LABEL_BOTTOMS

    ok, source = {}, {}
    for r, ws in writers.items():  # writers' roots come in forward order: sources first
        first = graph.nodes[ws[0]]
        if not all(recomputable_writer(graph.nodes[w], k == 0) for k, w in enumerate(ws)):
            continue
        srcs = tuple(dict.fromkeys(roots.scheduled(b) for b in first.bottoms))
        if any(src is None or src == r or last_writer.get(src, -1) > first.index for src in srcs):
            continue  # reads a root that is rewritten later: its contents are gone
        if any(roots(graph.nodes[w].bottoms[0]) != r for w in ws[1:]):
            continue
        ok[r], source[r] = ws, srcs
    return ok, source


def _recomputable_joins(graph, roots, recomputable, source):
    """``({root: [writer node indices]}, {root: (source roots)})`` of the joins to recompute:
    roots whose first writer is a cheap join (several data inputs, one top, not a loss) and
    whose other writers run in place on it, as for single-input layers, taken in forward
    order where each input is a checkpoint or recomputable from one through single-input
    layers alone (no join chosen before on the way), none of them written after the join."""
    writers = _writers(graph, roots)
    last_writer = {r: w[-1] for r, w in writers.items()}
    chosen, sources = {}, {}

    def through_join(r):
        while r in recomputable:
            (r,) = source[r]  # single-input layers' roots only (no join given)
        return r in chosen

    for r, ws in writers.items():  # in forward order: a join's inputs are decided before it
        first = graph.nodes[ws[0]]
        layer = first.layer
        if (r in recomputable or not layer.CHEAP or layer.LOSS or not first.backward or layer.LABEL_BOTTOMS
                or len(first.bottoms) < 2 or len(first.tops) != 1):
            continue
        rest = [graph.nodes[w] for w in ws[1:]]
        if any(not (n.layer.CHEAP and not n.layer.LOSS and n.backward and len(n.bottoms) == 1
                    and len(n.tops) == 1 and roots(n.bottoms[0]) == r) for n in rest):
            continue
        srcs = tuple(dict.fromkeys(roots.scheduled(b) for b in first.bottoms))
        if (None in srcs or r in srcs or any(last_writer.get(x, -1) > first.index for x in srcs)
                or any(through_join(x) for x in srcs)):
            continue
        chosen[r], sources[r] = ws, srcs
    return chosen, sources


def recomputable_roots(schedule, expensive=False, joins=False):
    """``({root: [writer node indices]}, {root: (source roots)})``: the roots of ``schedule``
    that recomputation may free between the forward and the backward (``expensive``: those of
    convolutions and inner products too; ``joins``: those of every Eltwise and Concat too),
    and the roots each is recomputed from."""
    return _recomputable(schedule.graph, Roots.of(schedule), expensive, joins)


def _chain(r, recomputable, sources, have):
    """The roots to recompute so that ``r`` is valid again, given the roots in ``have`` that
    are valid already (``sources``: root → the roots it is recomputed from)."""
    out, todo = [], [r]
    while todo:
        r = todo.pop()
        if r in recomputable and r not in have and r not in out:
            out.append(r)
            todo.extend(sources[r])
    return out


def recompute(schedule, context=None):
    """The pass: the schedule with Recompute steps for every recomputable root a backward
    step reads, each segment speed-centric where it fits under the largest working set of
    ``schedule``. The Context's cost model gives the layers' algorithms."""
    return with_recomputes(schedule, context)


def recompute_joins(schedule, context=None):
    """The pass of the ``+params`` policies: :func:`recompute`, and every other join too (see
    the module's docstring)."""
    return with_recomputes(schedule, context, joins=True)


def with_recomputes(schedule, context=None, largest=None, only=None, joins=False):
    """:func:`recompute`, with ``largest`` (bytes; default: measured on ``schedule``) the
    working set a segment must fit under to be recomputed speed-centric. ``only``: recompute
    just these roots (any of :func:`recomputable_roots` with ``expensive`` and ``joins``),
    speed-centric (each root recomputed once: the optimal policy's cost model counts it so);
    a root left out is a checkpoint. ``joins`` (without ``only``): every other join too,
    where its inputs allow (see the module's docstring)."""
    model = (context or Context()).model
    graph = schedule.graph
    if not schedule.train:
        return schedule
    roots = Roots.of(schedule)
    chosen = only is not None  # the optimal policy's choice: convolutions and joins too
    recomputable, source = _recomputable(graph, roots, expensive=chosen, joins=chosen)
    if chosen:
        recomputable = {r: ws for r, ws in recomputable.items() if r in only}
    sources = dict(source)
    joined = {}
    if joins and not chosen:
        joined, join_sources = _recomputable_joins(graph, roots, recomputable, source)
        recomputable.update(joined)
        sources.update(join_sources)
    if not recomputable:
        return schedule
    if largest is None and only is None:
        largest = largest_working_set(schedule, roots)

    def checkpoint(r):
        """The head of ``r``'s segment: its checkpoint, or the join it is recomputed from (the
        optimal policy's choice: ``r`` itself, each root its own segment, speed-centric)."""
        while r in recomputable and r not in joined and not chosen:
            (r,) = source[r]
        return r

    segments = {}
    for r in recomputable:
        segments.setdefault(checkpoint(r), []).append(r)
    nbytes = {r: schedule.tensors[r].nbytes for r in recomputable}
    speed = {c: chosen or c in joined or sum(nbytes[r] for r in rs) + schedule.tensors[c].nbytes <= largest
             for c, rs in segments.items()}

    tensors = dict(schedule.tensors)
    out = []
    kept = set()       # recomputed speed-centric: valid until their last read
    previous = set()   # recomputed for the previous backward step (memory-centric)
    for step in schedule.steps:
        if step.kind != BACKWARD:
            out.append(step)
            continue
        reads = {roots.scheduled(t) for t in uses(graph, step)[0]}
        chain = set()
        for r in reads:
            if r in recomputable:
                have = kept if speed[checkpoint(r)] else previous & reads
                chain.update(_chain(r, recomputable, sources, have | chain))
        for r in sorted(chain, key=lambda r: recomputable[r][0]):
            for w in recomputable[r]:
                out += _recompute_step(graph, tensors, w, model)
            if speed[checkpoint(r)]:
                kept.add(r)
        previous = chain | (previous & reads)
        out.append(step)
    return schedule.replace(out, tensors=tensors, policy=schedule.policy)


def _recompute_step(graph, tensors, index, model):
    """A Recompute of node ``index`` with its forward algorithm (``model``'s memo of the
    layer's algorithms), between the Alloc and Free of its workspace when it needs one."""
    node = graph.nodes[index]
    algo = model.algorithms(node.layer, "forward")[0]
    if algo.workspace <= 0:
        return [Recompute(index, algo.name)]
    ws = add_workspace(tensors, f"ws:{node.name}:recompute", algo.workspace)
    return [Alloc(ws), Recompute(index, algo.name, ws), Free(ws)]

