"""The step vocabulary: every kind of step an iteration is made of, declared once.

A step is a :class:`Step`, an immutable record whose fields are named for what they hold:
``node`` (the graph node a compute step runs), ``tensor`` (the tensor a memory or copy step
acts on), ``algorithm`` and ``workspace`` (the algorithm a compute step runs and the workspace
tensor it uses), ``keep`` (a Prefetch that leaves its host copy for a later one), ``grads``
(the parameter gradients a data-parallel bucket holds, in its order).

:data:`KINDS` says, for each kind, what it names, what it reads and writes, and what device
and host memory it takes and gives back. Those effects are what the passes reason about
(liveness.uses follows ``reads``/``writes``) and what the one interpreter of memory steps
(interpret.py) carries out for both the Simulator and the Runtime. Adding a kind is one entry
here, its executor (runtime/executor.py) and its cost (cost.py).
"""

from dataclasses import dataclass
from typing import NamedTuple

# The kinds, as constants: compare ``step.kind`` with these, never with a string literal.
FORWARD, BACKWARD, RECOMPUTE, UPDATE = "forward", "backward", "recompute", "update"
ALLOC, FREE = "alloc", "free"
OFFLOAD, PREFETCH, WAIT = "offload", "prefetch", "wait"
# Data-parallel training: a bucket's all-reduce across ranks starts, and is waited for.
ALLREDUCE, WAIT_REDUCE = "allreduce", "waitreduce"

COMPUTE = (FORWARD, BACKWARD, RECOMPUTE, UPDATE)
MEMORY = (ALLOC, FREE)
COPY = (OFFLOAD, PREFETCH, WAIT)
LAYER_STEPS = (FORWARD, BACKWARD, RECOMPUTE)  # compute steps that run one layer
COMMUNICATION = (ALLREDUCE, WAIT_REDUCE)


def _layer_forward(graph, step):
    node = graph.nodes[step.node]
    if node.layer.ALIAS_TOPS:  # a view: its tops are its bottom's memory, nothing runs
        return (), ()
    return list(node.bottoms) + list(node.params.values()), node.tops


def _layer_backward(graph, step):
    node = graph.nodes[step.node]
    reads_b, reads_t = node.layer.backward_reads()
    reads = [node.bottoms[i] for i in reads_b] + [node.tops[i] for i in reads_t]
    reads += [g for g in node.top_grads if g is not None] + list(node.params.values())
    writes = [g for g in node.bottom_grads if g is not None] + list(node.param_grads.values())
    return reads, writes


def _reads_its_tensor(graph, step):
    return (step.tensor,), ()


def _writes_its_tensor(graph, step):
    return (), (step.tensor,)


def _nothing(graph, step):
    return (), ()


def _packs_bucket(graph, step):
    return step.grads, (step.tensor,)


def _unpacks_bucket(graph, step):
    return (step.tensor,), step.grads


@dataclass(frozen=True)
class Kind:
    """What a kind of step is: what it names (``'node'``, ``'tensor'`` or nothing); ``uses``,
    ``(graph, step) → (reads, writes)``, the tensors it reads and writes (what liveness
    reasons about: workspaces and resident tensors aside); and, in words, the memory it takes
    (``allocates``) and gives back (``frees``) on the device and on the host, which
    interpret.py carries out."""

    name: str
    names: str
    uses: object
    allocates: str = ""
    frees: str = ""


KINDS = {k.name: k for k in (
    # its bottoms and parameters → its tops
    Kind(FORWARD, "node", _layer_forward),
    # what its layer's backward_reads names, its top gradients, parameters → its bottom
    # gradients and parameter gradients
    Kind(BACKWARD, "node", _layer_backward),
    # as its Forward; writing its tops anew makes their old contents dead
    Kind(RECOMPUTE, "node", _layer_forward),
    # every parameter, gradient and optimiser state, all resident: nothing scheduled
    Kind(UPDATE, "", _nothing),
    Kind(ALLOC, "tensor", _nothing, allocates="the tensor's storage on the device"),
    Kind(FREE, "tensor", _nothing, frees="the tensor's storage on the device"),
    # reads the tensor: its device→host copy starts
    Kind(OFFLOAD, "tensor", _reads_its_tensor, allocates="a host copy of the tensor, unless it is host-resident"),
    # writes the tensor: its host→device copy starts, into storage an Alloc placed
    Kind(PREFETCH, "tensor", _writes_its_tensor),
    # reads the tensor: its copy has ended
    Kind(WAIT, "tensor", _reads_its_tensor, frees="the host copy, after a Prefetch that does not keep it"),
    # reads its gradients (packed into the bucket, which it writes): the bucket's all-reduce
    # across the ranks starts (MPI or NCCL; none runs in the Simulator)
    Kind(ALLREDUCE, "tensor", _packs_bucket),
    # reads the bucket: its all-reduce has ended; writes its gradients, the ranks' average
    Kind(WAIT_REDUCE, "tensor", _unpacks_bucket),
)}


class Step(NamedTuple):
    """One step: its ``kind`` (one of :data:`KINDS`) and the fields that kind names."""

    kind: str
    node: int = None          # compute steps of one layer: the graph node's index
    tensor: str = None        # memory and copy steps: the tensor they act on
    algorithm: str = None     # compute steps: the algorithm chosen
    workspace: str = None     # compute steps: the workspace tensor, if any
    keep: bool = False        # Prefetch: its host copy stays for a later Prefetch
    grads: tuple = ()         # AllReduce, WaitReduce: the gradients in the bucket, in order

    def describe(self, graph):
        """A human-readable line, e.g. ``Forward(conv1) [im2col]`` or ``Prefetch(x) [keep]``."""
        name = graph.nodes[self.node].name if self.kind in LAYER_STEPS else (self.tensor or "")
        text = f"{_TITLES.get(self.kind) or self.kind.capitalize()}({name})"
        if self.algorithm:
            text += f" [{self.algorithm}]"
        elif self.keep:
            text += " [keep]"
        return text


_TITLES = {ALLREDUCE: "AllReduce", WAIT_REDUCE: "WaitReduce"}
_new = tuple.__new__  # memory and copy steps are made by the hundred thousand per plan: no keywords


def Forward(node, algorithm=None, workspace=None):
    return _new(Step, (FORWARD, node, None, algorithm, workspace, False, ()))


def Backward(node, algorithm=None, workspace=None):
    return _new(Step, (BACKWARD, node, None, algorithm, workspace, False, ()))


def Recompute(node, algorithm=None, workspace=None):
    return _new(Step, (RECOMPUTE, node, None, algorithm, workspace, False, ()))


def Update(workspace=None):
    return _new(Step, (UPDATE, None, None, None, workspace, False, ()))


def Alloc(tensor):
    return _new(Step, (ALLOC, None, tensor, None, None, False, ()))


def Free(tensor):
    return _new(Step, (FREE, None, tensor, None, None, False, ()))


def Offload(tensor):
    return _new(Step, (OFFLOAD, None, tensor, None, None, False, ()))


def Prefetch(tensor, keep=False):
    """A host→device copy of ``tensor``; ``keep``: its host copy stays for a later Prefetch."""
    return _new(Step, (PREFETCH, None, tensor, None, None, keep, ()))


def Wait(tensor):
    return _new(Step, (WAIT, None, tensor, None, None, False, ()))


def AllReduce(bucket, grads):
    """Start the all-reduce of ``bucket`` (a tensor), once ``grads`` are packed into it."""
    return _new(Step, (ALLREDUCE, None, bucket, None, None, False, tuple(grads)))


def WaitReduce(bucket, grads):
    """Wait for ``bucket``'s all-reduce and write the ranks' average back into ``grads``."""
    return _new(Step, (WAIT_REDUCE, None, bucket, None, None, False, tuple(grads)))


def with_algorithm(step, algorithm, workspace):
    """``step`` (a compute step) running ``algorithm`` with ``workspace``."""
    return step._replace(algorithm=algorithm, workspace=workspace)
