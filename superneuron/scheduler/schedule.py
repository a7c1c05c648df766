"""The Schedule: one training iteration as a flat program of steps (steps.py declares them),
with every tensor it touches and where the resident ones live. A pass is a function
(Schedule, context.Context) → Schedule.
"""

from dataclasses import dataclass, field

from ..graph.tensors import TensorInfo
from .allocator import aligned
from .steps import BACKWARD_PASS, MEMORY


@dataclass
class Schedule:
    """An iteration: the graph, every tensor it touches (graph tensors, workspaces, optimiser
    state), the resident tensors in placement order (on the device; ``host_resident``: in host
    memory, where parameter offload keeps parameters, gradients and optimiser state), and the
    steps. ``rounds`` > 1 (Caffe's ``iter_size``): an iteration runs its steps that many times,
    one micro-batch each, and its Update only in the last; an Accumulate step after the
    backward sums the rounds' parameter gradients into resident accumulators. Every round
    starts from an empty arena and makes the same allocator calls, so one round's plan is the
    iteration's."""

    graph: object
    tensors: dict
    resident: list
    steps: list = field(default_factory=list)
    train: bool = True
    policy: str = "baseline"
    offsets: dict = None      # planned placement: tensor → [offset per Alloc], None: dynamic
    host_resident: list = field(default_factory=list)  # kept in host memory (parameter offload)
    # the update needs every gradient at once (clipping by their global norm), so none can be
    # consumed before it (parameter offload keeps them all on the host then)
    whole_update: bool = False
    # The liveness.Roots memo of these tensors (liveness.Roots.of), handed on by replace():
    # it checks that it still serves the schedule it is asked for.
    roots: object = field(default=None, repr=False, compare=False)
    rounds: int = 1
    # the optimiser whose update ends a training iteration (the test schedule of the same net
    # has it too: what the update needs decides the resident layout they share); None: none
    optimizer: object = field(default=None, repr=False, compare=False)

    def replace(self, steps=None, policy=None, tensors=None, offsets=None, resident=None, host_resident=None,
                rounds=None):
        """A copy with other steps, tensors, policy name or planned offsets (what a pass
        returns). Planned offsets stay only while the Alloc and Free steps and the tensors do
        (dropping compute steps, as a forward-only run does, keeps them); ``rounds``: see the
        class."""
        steps = list(self.steps if steps is None else steps)
        if offsets is None and self.offsets is not None and tensors is None:
            memory = [s for s in steps if s.kind in MEMORY]
            if memory == [s for s in self.steps if s.kind in MEMORY]:
                offsets = self.offsets
        return Schedule(self.graph, self.tensors if tensors is None else tensors,
                        self.resident if resident is None else resident, steps, self.train,
                        policy or self.policy, offsets,
                        self.host_resident if host_resident is None else host_resident, self.whole_update,
                        self.roots, self.rounds if rounds is None else rounds, self.optimizer)

    def forward_part(self, rounds=None):
        """The program cut to its forward (a training-mode forward: Net.forward, and
        Net.first_non_finite's check): without its Backward, Accumulate and Update steps."""
        return self.replace([s for s in self.steps if s.kind not in BACKWARD_PASS], rounds=rounds)

    @property
    def resident_bytes(self):
        return sum(aligned(self.tensors[t].nbytes) for t in self.resident)


def add_workspace(tensors, name, nbytes):
    """Put a workspace tensor of ``nbytes`` bytes called ``name`` in ``tensors`` (a schedule's,
    which the caller owns); ``name``."""
    tensors[name] = TensorInfo(name, (nbytes,), "uint8", "workspace")
    return name
