"""The step vocabulary: every kind of step an iteration is made of, declared once.

A step is a :class:`Step`, an immutable record whose fields are named for what they hold:
``node`` (the graph node a compute step runs), ``tensor`` (the tensor a memory, copy or
coding step acts on: an Encode's or a Decode's is its encoded form), ``encoded`` (the layer's
own encoded form a Forward writes in its pass or a Backward reads instead of its operands),
``algorithm`` and ``workspace`` (the algorithm a compute step runs and the workspace tensor it
uses), ``codec`` (the codec of an Encode's or a Decode's encoded form), ``keep`` (a Prefetch
that leaves its host copy for a later one), ``source`` (the tensor an Encode's or a Decode's
encoded form stands for), ``grads`` (the parameter gradients a data-parallel bucket holds, in
its order), ``fused`` (the layers a Recompute runs in its own pass after its own: fuse.py).

:data:`KINDS` says, for each kind, what it names and what it reads and writes. Those are
what the passes reason about (liveness.uses follows ``reads``/``writes``). What a step
*does* is the walker's (walk.py): one method per kind, the memory and copy effects (device
and host memory taken and given back, copies started and waited for) written once in its
base, the Simulator, the cost model's clock and the Runtime adding their own. Adding a kind
is one entry here, a method in each walker that gives it a meaning, and the pass that
inserts it.
"""

from dataclasses import dataclass
from typing import NamedTuple

# The kinds, as constants: compare ``step.kind`` with these, never with a string literal.
FORWARD, BACKWARD, RECOMPUTE, UPDATE = "forward", "backward", "recompute", "update"
ACCUMULATE = "accumulate"
ALLOC, FREE = "alloc", "free"
OFFLOAD, PREFETCH, WAIT = "offload", "prefetch", "wait"
ENCODE, DECODE = "encode", "decode"
APPLY = "apply"
# Data-parallel training: a bucket's all-reduce across ranks starts, and is waited for.
ALLREDUCE, WAIT_REDUCE = "allreduce", "waitreduce"
# Every copy started and not yet waited for has ended (barrier.py).
BARRIER = "barrier"

COMPUTE = (FORWARD, BACKWARD, RECOMPUTE, ACCUMULATE, UPDATE)
# compute steps that read every gradient, all resident (but an Update that names its gradients:
# update.py's, right after their Backward, reads those alone)
RESIDENT_ONLY = (ACCUMULATE, UPDATE)
MEMORY = (ALLOC, FREE)
COPY = (OFFLOAD, PREFETCH, WAIT, APPLY)  # what the walker does between device and host
CODING = (ENCODE, DECODE)  # Gist's encodings (scheduler/encode.py)
LAYER_STEPS = (FORWARD, BACKWARD, RECOMPUTE)  # compute steps that run one layer
COMMUNICATION = (ALLREDUCE, WAIT_REDUCE)
# what a training program cut to its forward leaves out (Schedule.forward_part)
BACKWARD_PASS = (BACKWARD, ACCUMULATE, UPDATE)


def _layer_forward(graph, step):
    node = graph.nodes[step.node]
    if node.layer.ALIAS_TOPS:  # a view: its tops are its bottom's memory, nothing runs
        return (), ()
    if step.fused is not None:  # and what the layers after it in its pass read and write
        after = [graph.nodes[n] for n in step.fused]
        return ([*node.bottoms, *node.params.values(), *(p for a in after for p in a.params.values())],
                [*node.tops, *(t for a in after for t in a.tops)])
    if step.encoded is not None:  # and its own encoded form, in the same pass (encode.py)
        return list(node.bottoms) + list(node.params.values()), list(node.tops) + [step.encoded]
    return list(node.bottoms) + list(node.params.values()), node.tops


def _operands(node):
    """The bottoms and tops that ``node``'s backward reads."""
    reads_b, reads_t = node.layer.backward_reads()
    return [node.bottoms[i] for i in reads_b] + [node.tops[i] for i in reads_t]


def _layer_backward(graph, step):
    node = graph.nodes[step.node]
    # a Backward that names an encoded form reads it instead of its operands
    reads = [step.encoded] if step.encoded is not None else _operands(node)
    reads += [g for g in node.top_grads if g is not None] + list(node.params.values())
    writes = [g for g in node.bottom_grads if g is not None] + list(node.param_grads.values())
    return reads, writes


def _reads_its_tensor(graph, step):
    return (step.tensor,), ()


def _writes_its_tensor(graph, step):
    return (), (step.tensor,)


def _nothing(graph, step):
    return (), ()


def _encode(graph, step):
    """An Encode reads its source (or, for a layer's own form, its backward's operands)."""
    reads = _operands(graph.nodes[step.node]) if step.source is None else [step.source]
    return reads, (step.tensor,)


def _decode(graph, step):
    return (step.tensor,), (step.source,)


def _updates(graph, step):
    """An Update reads the gradients it names (every resident one where it names none)."""
    return step.grads, ()


def _packs_bucket(graph, step):
    return step.grads, (step.tensor,)


def _unpacks_bucket(graph, step):
    return (step.tensor,), step.grads


@dataclass(frozen=True)
class Kind:
    """What a kind of step is: what it names (``'node'``, ``'tensor'`` or nothing); ``uses``,
    ``(graph, step) → (reads, writes)``, the tensors it reads and writes (what liveness
    reasons about: workspaces and resident tensors aside). The memory it takes and gives back
    is the method of its name in walk.Walker."""

    name: str
    names: str
    uses: object


KINDS = {k.name: k for k in (
    # its bottoms and parameters → its tops
    Kind(FORWARD, "node", _layer_forward),
    # what its layer's backward_reads names, its top gradients, parameters → its bottom
    # gradients and parameter gradients
    Kind(BACKWARD, "node", _layer_backward),
    # as its Forward (and that of the ReLU it runs in the same pass, if any); writing its tops
    # anew makes their old contents dead
    Kind(RECOMPUTE, "node", _layer_forward),
    # iter_size > 1: every parameter gradient → its accumulator (Schedule.rounds), all
    # resident: nothing scheduled
    Kind(ACCUMULATE, "", _nothing),
    # the parameters of the gradients it names (scheduled, update.py: right after their
    # Backward), or of every resident gradient where it names none; parameters and optimiser
    # state are resident
    Kind(UPDATE, "", _updates),
    # places the tensor on the device (walk.Walker.alloc)
    Kind(ALLOC, "tensor", _nothing),
    # gives the tensor's device storage back
    Kind(FREE, "tensor", _nothing),
    # reads the tensor: a host copy is taken (unless it is host-resident), its device→host
    # copy starts
    Kind(OFFLOAD, "tensor", _reads_its_tensor),
    # writes the tensor: its host→device copy starts, into storage an Alloc placed
    Kind(PREFETCH, "tensor", _writes_its_tensor),
    # reads the tensor: its copy has ended (after a Prefetch that does not keep it, the host
    # copy goes back)
    Kind(WAIT, "tensor", _reads_its_tensor),
    # its source (a layer's own form: what that layer's backward reads) → its encoded form, the
    # tensor it names (in ``codec``)
    Kind(ENCODE, "tensor", _encode),
    # the encoded form it names → its source anew (a write: the source's old contents are dead)
    Kind(DECODE, "tensor", _decode),
    # parameter offload: the host update of a gradient's parameter, begun when the gradient's
    # copy landed (its Wait), is done: the gradient's host copy, which it consumed, goes back;
    # nothing on the device
    Kind(APPLY, "tensor", _nothing),
    # reads its gradients (packed into the bucket, which it writes): the bucket's all-reduce
    # across the ranks starts (MPI or NCCL; none runs in the Simulator)
    Kind(ALLREDUCE, "tensor", _packs_bucket),
    # reads the bucket: its all-reduce has ended; writes its gradients, the ranks' average
    Kind(WAIT_REDUCE, "tensor", _unpacks_bucket),
    # waits for every copy under way (each as its Wait would); names and touches no tensor
    Kind(BARRIER, "", _nothing),
)}


class Step(NamedTuple):
    """One step: its ``kind`` (one of :data:`KINDS`) and the fields that kind names."""

    kind: str
    node: int = None          # compute steps of one layer: the graph node's index
    tensor: str = None        # memory, copy and coding steps: the tensor they act on (Encode,
    #                           Decode: the encoded form; AllReduce, WaitReduce: the bucket)
    algorithm: str = None     # compute steps: the algorithm chosen
    workspace: str = None     # compute steps: the workspace tensor, if any
    keep: bool = False        # Prefetch: its host copy stays for a later Prefetch
    source: str = None        # Encode, Decode: the tensor the encoded form stands for
    grads: tuple = ()         # AllReduce, WaitReduce: the gradients in the bucket, in order;
    #                           Update: the gradients whose parameters it updates (none: all)
    fused: tuple = None       # a Recompute: the nodes its layer's pass runs after it, in order
    #                           (fuse.py): the ReLU in place on its top; or a BatchNorm's Scale,
    #                           then maybe the ReLU in place on the Scale's top
    codec: str = None         # Encode, Decode: the codec of the encoded form (layers/codecs.py)
    encoded: str = None       # a Forward: the layer's own encoded form it writes in the same pass
    #                           (encode.py); a Backward: that form, read instead of its operands

    def describe(self, graph):
        """A human-readable line, e.g. ``Forward(conv1) [im2col]``, ``Prefetch(x) [keep]`` or
        ``Encode(conv1#sign) [sign]``."""
        runs_a_layer = KINDS[self.kind].names == "node"
        name = graph.nodes[self.node].name if runs_a_layer else (self.tensor or "")
        text = f"{_TITLES.get(self.kind) or self.kind.capitalize()}({name})"
        if self.algorithm or self.codec:
            text += f" [{self.algorithm or self.codec}]"
        elif self.keep:
            text += " [keep]"
        if self.encoded:  # the encoded form a Backward reads, a Forward writes
            text += f" {'reads' if self.kind == BACKWARD else 'writes'} {self.encoded}"
        for n in self.fused or ():
            text += f" + {graph.nodes[n].layer.type}({graph.nodes[n].name})"
        return text


_TITLES = {ALLREDUCE: "AllReduce", WAIT_REDUCE: "WaitReduce"}
_new = tuple.__new__  # memory and copy steps are made by the hundred thousand per plan: no keywords


def Forward(node, algorithm=None, workspace=None, encoded=None):
    """The forward of node ``node``; ``encoded``: the layer's own encoded form (Layer.encodings,
    ``direct``) that it writes in the same pass, for its Backward to read."""
    return _new(Step, (FORWARD, node, None, algorithm, workspace, False, None, (), None, None, encoded))


def Backward(node, algorithm=None, workspace=None, encoded=None):
    """The backward of node ``node``; ``encoded``: the encoded form (a layer's own, see
    Layer.encodings) it reads instead of its bottoms and tops."""
    return _new(Step, (BACKWARD, node, None, algorithm, workspace, False, None, (), None, None, encoded))


def Recompute(node, algorithm=None, workspace=None, fused=None):
    """Node ``node``'s forward again, for the backward; ``fused``: the nodes its pass runs
    after it (a tuple: the in-place ReLU on its top, Layer.fuses_relu; or a BatchNorm's Scale,
    then maybe that Scale's ReLU, BatchNorm.fuses_scale)."""
    return _new(Step, (RECOMPUTE, node, None, algorithm, workspace, False, None, (), fused, None, None))


def Accumulate():
    """Adds this round's parameter gradients to their accumulators (``Schedule.rounds`` > 1)."""
    return _new(Step, (ACCUMULATE, None, None, None, None, False, None, (), None, None, None))


def Update(workspace=None, grads=()):
    """The optimiser's update of the parameters of ``grads`` (none: of every resident gradient)."""
    return _new(Step, (UPDATE, None, None, None, workspace, False, None, tuple(grads), None, None, None))


def Alloc(tensor):
    return _new(Step, (ALLOC, None, tensor, None, None, False, None, (), None, None, None))


def Free(tensor):
    return _new(Step, (FREE, None, tensor, None, None, False, None, (), None, None, None))


def Offload(tensor):
    return _new(Step, (OFFLOAD, None, tensor, None, None, False, None, (), None, None, None))


def Prefetch(tensor, keep=False):
    """A host→device copy of ``tensor``; ``keep``: its host copy stays for a later Prefetch."""
    return _new(Step, (PREFETCH, None, tensor, None, None, keep, None, (), None, None, None))


def Wait(tensor):
    return _new(Step, (WAIT, None, tensor, None, None, False, None, (), None, None, None))


def Encode(tensor, codec, source=None, node=None, workspace=None):
    """Write ``tensor``, the ``codec`` form of ``source`` (or, with ``node`` and no source, the
    form of what that layer's backward reads, which its backward then reads itself)."""
    return _new(Step, (ENCODE, node, tensor, None, workspace, False, source, (), None, codec, None))


def Decode(tensor, codec, source, workspace=None):
    """Write ``source`` back from ``tensor``, its ``codec`` form."""
    return _new(Step, (DECODE, None, tensor, None, workspace, False, source, (), None, codec, None))


def Apply(grad):
    """The host update of ``grad``'s parameter (parameter offload) is done: its host copy goes."""
    return _new(Step, (APPLY, None, grad, None, None, False, None, (), None, None, None))


def AllReduce(bucket, grads):
    """Start the all-reduce of ``bucket`` (a tensor), once ``grads`` are packed into it."""
    return _new(Step, (ALLREDUCE, None, bucket, None, None, False, None, tuple(grads), None, None, None))


def WaitReduce(bucket, grads):
    """Wait for ``bucket``'s all-reduce and write the ranks' average back into ``grads``."""
    return _new(Step, (WAIT_REDUCE, None, bucket, None, None, False, None, tuple(grads), None, None, None))


def Barrier():
    """Wait for every copy started and not yet waited for."""
    return _new(Step, (BARRIER, None, None, None, None, False, None, (), None, None, None))


def first_backward(steps, default=None):
    """The index of the first Backward in ``steps`` (where the forward turns back), else
    ``default``."""
    return next((i for i, s in enumerate(steps) if s.kind == BACKWARD), default)


def with_algorithm(step, algorithm, workspace):
    """``step`` (a compute step) running ``algorithm`` with ``workspace``."""
    return step._replace(algorithm=algorithm, workspace=workspace)
