"""Steps and the Schedule: one training iteration as a flat program.

Compute steps name a node of the graph (``Forward``, ``Backward``, ``Update``) and carry the
algorithm chosen for them and the workspace tensor they use; memory steps name the tensor whose
storage they take or give back (``Alloc``, ``Free``); copy steps name the tensor they move
between the device and the host (``Offload`` starts a device→host copy, ``Prefetch`` a
host→device copy, ``Wait`` blocks until that tensor's copy is done). ``Recompute`` re-runs a
layer's forward in the backward pass. A pass is a function Schedule → Schedule.
"""

import functools
from dataclasses import dataclass, field

COMPUTE = ("forward", "backward", "recompute", "update")
MEMORY = ("alloc", "free")
COPY = ("offload", "prefetch", "wait")
LAYER_STEPS = ("forward", "backward", "recompute")  # compute steps that run one layer


@dataclass(frozen=True)
class Step:
    """One step: ``kind``; ``target`` (node index for compute steps, tensor name for memory
    steps, None for Update); ``algo`` and ``workspace`` (tensor name) for compute steps."""

    kind: str
    target: object = None
    algo: str = None
    workspace: str = None

    def describe(self, graph):
        """A human-readable line, e.g. ``Forward(conv1) [im2col, ws 1.2 MiB]``."""
        name = graph.nodes[self.target].name if self.kind in LAYER_STEPS else (self.target or "")
        text = f"{self.kind.capitalize()}({name})"
        if self.algo:
            text += f" [{self.algo}]"
        return text


def Forward(node, algo=None, workspace=None):
    return Step("forward", node, algo, workspace)


def Backward(node, algo=None, workspace=None):
    return Step("backward", node, algo, workspace)


def Recompute(node, algo=None, workspace=None):
    return Step("recompute", node, algo, workspace)


# Memory and copy steps are made by the hundred thousand per plan (liveness remakes them all),
# and a frozen dataclass is slow to build; a Step is immutable, so one per tensor is shared.
@functools.lru_cache(maxsize=1 << 20)
def Offload(tensor):
    return Step("offload", tensor)


@functools.lru_cache(maxsize=1 << 20)
def Prefetch(tensor, keep=False):
    """A host→device copy of ``tensor``; ``keep``: its host copy stays for a later Prefetch."""
    return Step("prefetch", tensor, "keep" if keep else None)


@functools.lru_cache(maxsize=1 << 20)
def Wait(tensor):
    return Step("wait", tensor)


def Update(workspace=None):
    return Step("update", None, None, workspace)


@functools.lru_cache(maxsize=1 << 20)
def Alloc(tensor):
    return Step("alloc", tensor)


@functools.lru_cache(maxsize=1 << 20)
def Free(tensor):
    return Step("free", tensor)


def forget_steps():
    """Drop the shared memory and copy steps (a search of many plans does, when it is done,
    rather than keep a deep net's worth of them)."""
    for make in (Offload, Prefetch, Wait, Alloc, Free):
        make.cache_clear()


@dataclass
class Schedule:
    """An iteration: the graph, every tensor it touches (graph tensors, workspaces, optimiser
    state), the resident tensors in placement order (on the device; ``host_resident``: in host
    memory, where parameter offload keeps parameters, gradients and optimiser state), and the
    steps."""

    graph: object
    tensors: dict
    resident: list
    steps: list = field(default_factory=list)
    train: bool = True
    policy: str = "baseline"
    offsets: dict = None      # planned placement: tensor → [offset per Alloc], None: dynamic
    host_resident: list = field(default_factory=list)  # kept in host memory (parameter offload)
    # The planning Arena of a whole replay of exactly these steps and offsets, when a pass
    # made one (the workspace pass checks its placement so), for simulate() to reuse. Not an
    # __init__ argument, so replace() and dataclasses.replace() never carry it over.
    replayed: object = field(default=None, init=False, repr=False, compare=False)

    def replace(self, steps=None, policy=None, tensors=None, offsets=None, resident=None, host_resident=None):
        """A copy with other steps, tensors, policy name or planned offsets (what a pass
        returns). Planned offsets stay only while the Alloc and Free steps and the tensors do
        (dropping compute steps, as a forward-only run does, keeps them)."""
        steps = list(self.steps if steps is None else steps)
        if offsets is None and self.offsets is not None and tensors is None:
            memory = [s for s in steps if s.kind in MEMORY]
            if memory == [s for s in self.steps if s.kind in MEMORY]:
                offsets = self.offsets
        return Schedule(self.graph, self.tensors if tensors is None else tensors,
                        self.resident if resident is None else resident, steps, self.train,
                        policy or self.policy, offsets,
                        self.host_resident if host_resident is None else host_resident)

    @property
    def resident_bytes(self):
        from ..runtime.arena import aligned
        return sum(aligned(self.tensors[t].nbytes) for t in self.resident)


def root(tensors, name):
    """The tensor whose memory ``name`` uses in ``tensors`` (a schedule's, which may alias more
    than the graph's: see the in-place pass); names not in ``tensors`` are their own root."""
    info = tensors.get(name)
    while info is not None and info.alias is not None:
        name = info.alias
        info = tensors.get(name)
    return name
