"""Steps and the Schedule: one training iteration as a flat program.

Compute steps name a node of the graph (``Forward``, ``Backward``, ``Update``) and carry the
algorithm chosen for them and the workspace tensor they use; memory steps name the tensor whose
storage they take or give back (``Alloc``, ``Free``). Later passes add ``Offload``, ``Prefetch``,
``Wait``, ``Recompute``, ``Encode`` and ``Decode``. A pass is a function Schedule → Schedule.
"""

from dataclasses import dataclass, field

COMPUTE = ("forward", "backward", "recompute", "update")
MEMORY = ("alloc", "free")


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
        name = graph.nodes[self.target].name if self.kind in ("forward", "backward", "recompute") \
            else (self.target or "")
        text = f"{self.kind.capitalize()}({name})"
        if self.algo:
            text += f" [{self.algo}]"
        return text


def Forward(node, algo=None, workspace=None):
    return Step("forward", node, algo, workspace)


def Backward(node, algo=None, workspace=None):
    return Step("backward", node, algo, workspace)


def Update(workspace=None):
    return Step("update", None, None, workspace)


def Alloc(tensor):
    return Step("alloc", tensor)


def Free(tensor):
    return Step("free", tensor)


@dataclass
class Schedule:
    """An iteration: the graph, every tensor it touches (graph tensors, workspaces, optimiser
    state), the resident tensors in placement order, and the steps."""

    graph: object
    tensors: dict
    resident: list
    steps: list = field(default_factory=list)
    train: bool = True
    policy: str = "baseline"

    def replace(self, steps, policy=None):
        """A copy with other steps (what a pass returns)."""
        return Schedule(self.graph, self.tensors, self.resident, list(steps), self.train,
                        policy or self.policy)

    @property
    def resident_bytes(self):
        from ..runtime.arena import aligned
        return sum(aligned(self.tensors[t].nbytes) for t in self.resident)
