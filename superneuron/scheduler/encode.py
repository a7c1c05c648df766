"""Gist's encodings (Jain et al. 2018) as steps: a feature map kept from the forward to the
backward (a *stash*) is kept encoded in between.

For every data root that lives across the forward/backward turn (used before the first
Backward, read after it, never written after it) the pass chooses the smallest form that every
step reading it after the turn can take, and keeps that form only where it is smaller than the
map (layers/codecs.py has the kernels and the byte rules, which the pass learns through the
layers: Layer.encodings, Layer.tensor_encoding):

- a layer's own *direct* form (``Layer.encodings``, ``direct``): max pooling's ``argmax``, one
  byte per output. The layer's Forward writes it in the same pass (``Forward(...,
  encoded=...)``: the operands are at hand there, so on a GPU it costs its own writes alone,
  where an ``Encode`` of its own would read them all again; a Forward that has a workspace
  keeps its algorithm's and is followed by an ``Encode`` instead), and the Backward reads it
  instead of them (``Backward(..., encoded=...)``), so they need not be stashed for it.
  Chosen where the stashes it relieves (in the smallest form their other readers then allow)
  outweigh it, or weigh as much: in conv → ReLU → pool, the
  ReLU's output is then read after the turn by the ReLU's backward alone, which needs only its
  signs, and ReLU's own ``sign`` form (the bits its backward reads itself) takes it.
- ``sign`` (1 bit a value) where every reader's backward needs only the signs (ReLU's top);
- ``fp16`` (half the bytes), only when asked (``--lossy fp16``: Context.lossy), for any float
  stash but labels;
- ``sparse`` is exact for any reader, but how many values it keeps is known only at run time;
  a plan must count what the run will use, to the byte, so it counts the worst case (every
  value, plus the mask): never smaller than the map, so never chosen. Choosing it would need a
  bound on the nonzeros that holds for every batch, which a plan made before the first batch
  does not have.

A tensor form is written by ``Encode(e, codec, source=r)`` right after the last use of ``r``
before the turn and written back by ``Decode`` right before its first reader after it (a write:
liveness frees ``r`` in between and allocates it anew, as for a Prefetch). The pass then runs
liveness again, so it goes after liveness and before offload: an offloaded stash then travels
encoded (offload.py takes encoded roots like data ones), which cuts host bytes and copy time.
Lossless forms keep every result bit for bit (the backward reads the same signs, the same
first maxima); ``fp16`` rounds the stashed values. One sweep to find the stashes, one to
rewrite: linear in the steps.
"""

import numpy as np

from ..graph.tensors import TensorInfo
from .allocator import aligned
from .inplace import inplace
from .liveness import Roots, allocate_live
from .schedule import add_workspace
from .steps import BACKWARD, FORWARD, MEMORY, RECOMPUTE, Backward, Decode, Encode, Forward, first_backward
from .walk import Tally, Walker

TENSOR_CODECS = ("sign", "fp16", "sparse")  # forms of one tensor, each written back by a Decode


def encode(schedule, context=None, only=None):
    """The pass: ``schedule`` (after liveness) with its stashes kept encoded, lossy forms only
    those in ``context.lossy``. ``only``: ``(layers, roots)``, the direct forms of those layers
    (node indices) and the tensor forms of those roots alone (the optimal policy's choice:
    see :func:`units`); None: every one worth keeping."""
    plan = _plan(schedule, context)
    if plan is None:
        return schedule
    steps, tensors = plan.steps, dict(schedule.tensors)
    after, before = {}, {}  # step index → steps to put after it, before it
    direct = plan.direct_forms(None if only is None else only[0])
    for i, node, enc in direct:
        e = f"{node.name}#{enc.codec}"
        shape, dtype = enc.form
        tensors[e] = TensorInfo(e, tuple(shape), np.dtype(dtype), "encoded")
        ws = _workspace(tensors, e, "encode", enc.workspace)
        forward = plan.forward_of[node.index]
        if steps[forward].workspace is None:  # written in the forward's own pass
            steps[forward] = Forward(node.index, steps[forward].algorithm, ws, encoded=e)
        else:
            after.setdefault(forward, []).append(Encode(e, enc.codec, node=node.index, workspace=ws))
        steps[i] = Backward(node.index, steps[i].algorithm, steps[i].workspace, encoded=e)
    for r, (last, first), enc in plan.tensor_forms(steps, None if only is None else only[1]):
        e = f"{r}#{enc.codec}"
        shape, dtype = enc.form
        tensors[e] = TensorInfo(e, tuple(shape), np.dtype(dtype), "encoded")
        ws = _workspace(tensors, e, "encode", enc.workspace)
        after.setdefault(last, []).append(Encode(e, enc.codec, source=r, workspace=ws))
        ws = _workspace(tensors, e, "decode", enc.decode_workspace)
        before.setdefault(first, []).append(Decode(e, enc.codec, r, workspace=ws))
    if not direct and not after:  # nothing encoded
        return schedule
    out = []
    for i, step in enumerate(steps):
        out += before.get(i, ())
        out.append(step)
        out += after.get(i, ())
    # A stash that lost its last reader after the turn may now give its memory to the
    # gradient of the layer that reads it last (inplace.py: Layer.grad_over_bottom).
    rewritten = inplace(schedule.replace(out, tensors=tensors), grads_only=True)
    return allocate_live(rewritten, Roots.of(rewritten))


def units(schedule, context=None):
    """``[(layers, roots)]``: the encodings the pass would choose in ``schedule`` (after
    liveness), and the layers' own forms whose gain is a gradient over its bottom (conv → ReLU
    → conv: the ReLU's signs, so that the second convolution's bottom gradient may take its
    bottom's memory), in groups that stand or fall together: a layer's direct form with the
    roots it relieves (they lose a reader, which may let one of them take a tensor form: conv
    → ReLU → max pool's mask goes with the pool's argmax), and each other tensor form alone. Each is
    ``(frozenset of node indices, frozenset of roots)``; ``encode(..., only=...)`` with the
    union of some of them encodes exactly those (no two share a root)."""
    plan = _plan(schedule, context)
    if plan is None:
        return []
    group = {}  # ("layer", index) or ("root", name) → its group's representative

    def find(x):
        while group.setdefault(x, x) != x:
            x = group[x]
        return x

    for _, node, _ in plan.direct_forms(merges=True):
        for r in plan.relieved[node.index]:
            group[find(("root", r))] = find(("layer", node.index))
    for r, _, _ in plan.tensor_forms(plan.steps):
        find(("root", r))
    out = {}
    for x in list(group):
        layers, roots = out.setdefault(find(x), (set(), set()))
        (layers if x[0] == "layer" else roots).add(x[1])
    return [(frozenset(layers), frozenset(roots)) for layers, roots in out.values()]


def direct_form(layer):
    """``layer``'s own encoded form (an Encoding with ``direct``: its backward reads it), or None."""
    return next((e for e in layer.encodings() if e.direct), None)


def _plan(schedule, context):
    """The :class:`_Stashes` of ``schedule`` (lossy forms: ``context.lossy``), or None where
    nothing is stashed (no training, or no backward)."""
    steps = [s for s in schedule.steps if s.kind not in MEMORY]
    turn = first_backward(steps)
    if not schedule.train or turn is None:
        return None
    return _Stashes(schedule, steps, turn, tuple(getattr(context, "lossy", ()) or ()))


def _bytes(form):
    """The arena bytes of an encoded form's storage, ``(shape, dtype)``."""
    shape, dtype = form
    return aligned(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)


def _workspace(tensors, e, what, nbytes):
    return add_workspace(tensors, f"ws:{e}:{what}", nbytes) if nbytes > 0 else None


class _Stashes:
    """The stashes of ``steps`` (no memory steps; ``turn``: the first Backward) and who reads
    them after the turn: what the pass chooses from."""

    def __init__(self, schedule, steps, turn, lossy):
        self.graph, self.tensors, self.turn, self.lossy = schedule.graph, schedule.tensors, turn, lossy
        self.roots = roots = Roots.of(schedule)
        self.forward_of = {s.node: i for i, s in enumerate(steps[:turn]) if s.kind == FORWARD}
        # A stash's readers: the steps after the turn that read its forward value, up to the
        # first that writes the root; one that writes it without reading it (a recomputation)
        # leaves no forward value to keep; one that reads it and writes it (a gradient over its
        # bottom: inplace.py) is its last reader.
        self.last, self.readers, written, overwritten = {}, {}, set(), set()
        for i, step in enumerate(steps):
            reads, writes = roots.uses(step)
            for r in set(reads) | set(writes):
                if self.tensors[r].kind != "data" or r in written:
                    continue
                if i < turn:
                    self.last[r] = i
                    continue
                if r in reads:
                    self.readers.setdefault(r, []).append(i)
                if r in writes:
                    written.add(r)
                    if r not in reads:
                        overwritten.add(r)
        self.stashed = {r: rs for r, rs in self.readers.items() if r in self.last and r not in overwritten}
        self.steps = steps
        self.relieved = {}  # node index → the stashes its direct form took a reader from

    def _operand_roots(self, node, which):
        """The scheduled roots of ``node``'s operands ``which`` (bottom and top indices)."""
        bottoms, tops = which
        names = [node.bottoms[i] for i in bottoms] + [node.tops[i] for i in tops]
        return {r for r in map(self.roots.scheduled, names) if r is not None}

    def _reads_as(self, step, r):
        """The forms in which ``step`` can read root ``r``: ``'sign'`` where its layer's
        backward needs only the signs of every operand that is ``r``; ``'fp16'`` unless it
        reads ``r`` as a label; ``'sparse'`` always (a step of no layer: none)."""
        if step.kind not in (BACKWARD, RECOMPUTE):
            return set()
        forms, node = {"sparse"}, self.graph.nodes[step.node]
        labels = {self.roots.scheduled(node.bottoms[i]) for i in node.layer.LABEL_BOTTOMS}
        if r not in labels:
            forms.add("fp16")
        if step.kind == BACKWARD and step.encoded is None:
            reads_b, reads_t = node.layer.backward_reads()
            for enc in node.layer.encodings():
                if enc.codec != "sign" or enc.direct:
                    continue
                others = ([i for i in reads_b if i not in enc.bottoms], [i for i in reads_t if i not in enc.tops])
                if (r in self._operand_roots(node, (enc.bottoms, enc.tops))
                        and r not in self._operand_roots(node, others)):
                    forms.add("sign")
        return forms

    def _best(self, r, readers):
        """``(Encoding or None, bytes)``: the smallest form of stash ``r`` that every step in
        ``readers`` can take (None: the map itself, or no stash left when none reads it), as
        the first reader's layer counts it."""
        info = self.tensors[r]
        best = (None, aligned(info.nbytes) if readers else 0)
        if not readers:
            return best
        forms = set.intersection(*(self._reads_as(self.steps[i], r) for i in readers))
        if "fp16" not in self.lossy or info.dtype.kind != "f" or info.dtype.itemsize <= 2:
            forms.discard("fp16")
        layer = self.graph.nodes[self.steps[readers[0]].node].layer if forms else None
        for codec in TENSOR_CODECS:
            if codec in forms:
                enc = layer.tensor_encoding(codec, info.shape, info.dtype)
                nbytes = _bytes(enc.form)
                if nbytes < best[1]:
                    best = (enc, nbytes)
        return best

    def direct_forms(self, layers=None, merges=False):
        """``[(Backward step index, node, Encoding)]``: the layers' own forms worth keeping
        (their Forward before the turn, their Backward after it), in step order; each one
        chosen takes that Backward off the readers of its operands for the next. ``layers``:
        those layers' alone (node indices), whatever they gain (the optimal policy's choice);
        ``merges``: also those whose gain is a gradient over its bottom that they make
        possible (:meth:`_merges`), which the optimal policy's program weighs."""
        chosen = []
        for i in range(self.turn, len(self.steps)):
            step = self.steps[i]
            if step.kind != BACKWARD or step.encoded is not None or step.node not in self.forward_of:
                continue
            if layers is not None and step.node not in layers:
                continue
            node = self.graph.nodes[step.node]
            enc = direct_form(node.layer)
            if enc is None:
                continue
            relieved = [r for r in self._operand_roots(node, node.layer.backward_reads()) if r in self.stashed]
            without = {r: [j for j in self.stashed[r] if j != i] for r in relieved}
            gain = sum(self._best(r, self.stashed[r])[1] - self._best(r, without[r])[1] for r in relieved)
            # as large as its gain (a ReLU's own sign form, against the sign tensor form it
            # would leave): chosen, since its backward then holds no decoded map
            if (layers is not None or gain >= _bytes(enc.form)
                    or merges and any(self._merges(r, without[r]) for r in relieved)):
                self.stashed.update(without)
                self.relieved[node.index] = relieved
                chosen.append((i, node, enc))
        return chosen

    def _merges(self, r, readers):
        """Whether stash ``r``, read after the turn by ``readers`` (step indices), gives its
        memory to a gradient there: the last of them is a Backward whose bottom gradient may
        take that bottom's memory (Layer.grad_over_bottom), the bottom being ``r``."""
        if not readers:
            return False
        step = self.steps[readers[-1]]
        if step.kind != BACKWARD:
            return False
        node = self.graph.nodes[step.node]
        return any(node.bottom_grads[b] is not None and self.roots.scheduled(node.bottoms[b]) == r
                   for b in node.layer.grad_over_bottom())

    def tensor_forms(self, steps, roots=None):
        """``[(root, (last use before the turn, first read after it), Encoding)]`` of every stash
        kept in a tensor form (of ``roots`` alone, where given), the readers being those of
        ``steps`` (after direct_forms)."""
        self.steps = steps
        out = []
        for r, readers in self.stashed.items():
            if readers and (roots is None or r in roots):
                enc = self._best(r, readers)[0]
                if enc is not None:
                    out.append((r, (self.last[r], readers[0]), enc))
        return out


def summary(schedule):
    """What ``schedule`` keeps encoded: ``{'tensors': [(encoded tensor, codec, what it stands
    for, its bytes)], 'stash_bytes': bytes of data and encoded tensors live across the turn}``
    (``sn-plan`` prints it beside the same figure under liveness)."""
    found = _Summary(schedule).run(schedule)
    return {"tensors": found.out, "stash_bytes": found.stash or 0}


class _Summary(Walker):
    """The walk of :func:`summary`: what is live at the first Backward (the turn), and each
    encoded form an Encode or a Forward writes."""

    def __init__(self, schedule):
        self.graph, self.tally, self.out, self.stash = schedule.graph, Tally(), [], None
        super().__init__(schedule.tensors, self.tally)

    def backward(self, step):
        if self.stash is None:
            tensors = self.tensors
            self.stash = sum(aligned(tensors[t].nbytes) for t in self.tally.names
                             if tensors[t].kind in ("data", "encoded"))

    def encode(self, step):
        what = step.source or f"{self.graph.nodes[step.node].name}'s backward operands"
        self.out.append((step.tensor, step.codec, what, self.tensors[step.tensor].nbytes))

    def forward(self, step):
        if step.encoded is not None:  # the layer's own form, written in its pass
            node = self.graph.nodes[step.node]
            codec = direct_form(node.layer).codec
            nbytes = self.tensors[step.encoded].nbytes
            self.out.append((step.encoded, codec, f"{node.name}'s backward operands", nbytes))
