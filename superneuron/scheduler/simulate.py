"""The Simulator: runs a schedule's memory steps on a planning Arena (no kernels), giving the
bytes live after every step, the peak, the arena size after placement, and the lower bound.

It is a walker (walk.py) on allocators alone (allocator.py): the memory and copy steps do what
the base walker does for the Runtime too, and compute steps nothing, so it makes exactly the
allocator calls the Runtime makes, in the same order, and its figures are the run's to the
byte (plan equals run)."""

import copy
from dataclasses import dataclass, field

from .allocator import Allocator, aligned
from .cost import phase_of, step_seconds  # noqa: F401  (step_seconds: the trace imports it here)
from .liveness import Roots, step_roots
from .steps import FORWARD, FREE, LAYER_STEPS, MEMORY
from .walk import Walker


@dataclass
class Plan:
    """What one iteration costs in device memory under a schedule."""

    peak_bytes: int            # resident + the largest sum of scheduled bytes live at once
    resident_bytes: int
    arena_bytes: int           # resident + the scheduled region's high-water mark after placement
    lower_bound_bytes: int     # resident + the largest working set of any step, each layer step
                               # on its algorithm of smallest workspace (DESIGN.md's lower bound)
    steps: int
    live: list = field(default_factory=list)   # scheduled bytes live after each step
    peak_step: int = 0         # index of the step where the peak is first reached
    host_bytes: int = 0        # the most host memory offloaded tensors (and host-resident ones) take
    # resident + the largest working set with the algorithms this plan chose (the figure sn-plan
    # called its lower bound before: the fastest algorithm's workspace flatters every ratio to it)
    chosen_bound_bytes: int = 0

    def fits(self, budget):
        return budget is None or self.arena_bytes <= budget

    def overflow(self, schedule, budget):
        """``(step index, bytes needed)`` of the first step whose arena exceeds ``budget``."""
        arena = replay(schedule, stop=lambda a: a.high_water > budget)
        return arena.stopped_at, arena.high_water


def working_set(schedule, step, roots=None):
    """Bytes a compute step needs on the device at once: the storage of what it reads and
    writes (:func:`liveness.uses`) and its workspace. ``roots``: a shared liveness.Roots."""
    if step.kind in MEMORY:
        return 0
    roots = roots or Roots(schedule)
    return sum(aligned(schedule.tensors[r].nbytes) for r in step_roots(schedule, step, roots))


def resident_arenas(schedule):
    """``(device, host)``: planning Arenas with ``schedule``'s resident tensors placed and
    nothing else, for :func:`replay` to start from (placing tens of thousands of resident
    tensors costs as much as a short replay; variants of a schedule with the same resident
    tensors can share them)."""
    arena, host = Allocator(None), Allocator(None)
    for name in schedule.host_resident:
        host.place_resident(name, schedule.tensors[name].nbytes)
    for name in schedule.resident:
        arena.place_resident(name, schedule.tensors[name].nbytes)
    return arena, host


class Replayer(Walker):
    """The Simulator: the allocator calls of a schedule's steps made on planning Arenas
    (:func:`replay`), from any step on, and the last Alloc taken back: the workspace pass,
    which gives a step that went over the budget a smaller workspace and tries again, goes on
    from that step instead of starting over (the steps before it are the same). A walker that
    adds to the base's memory and copy effects only the bytes live after each step
    (``arena.live_trace``) and the marks an Alloc may have to give back."""

    def __init__(self, schedule, residents=None):
        if residents is None:
            arena, host = resident_arenas(schedule)
        else:  # copies: reset() gives each its own scheduled state; the resident maps are only read
            arena, host = copy.copy(residents[0]), copy.copy(residents[1])
            host.reset()
        arena.host = host
        arena.reset(schedule.offsets)
        arena.live_trace = []
        arena.stopped_at = None
        self.arena = arena
        super().__init__(schedule.tensors, arena, host)
        self._before = None  # the arena's marks, and where the tensor was last, before the last Alloc

    def alloc(self, step):
        arena = self.arena
        self._before = (arena.high_water, arena.peak_live, arena.last.get(step.tensor))
        super().alloc(step)

    def run(self, schedule, start=0, stop=None):
        """Make the calls of ``schedule``'s steps from ``start`` on (after those before it, of
        this schedule or one whose steps up to there are the same), ending after the first
        step where ``stop(arena)``; that step's index, or None when none stopped it."""
        arena, methods = self.arena, self.methods
        self.tensors = schedule.tensors
        steps = schedule.steps
        trace = arena.live_trace
        for i in range(start, len(steps)):
            methods[steps[i].kind](self, steps[i])
            trace.append(arena.live)
            if stop is not None and stop(arena):
                arena.stopped_at = i
                return i
        arena.stopped_at = None
        return None

    def take_back(self, index, step):
        """Undo the Alloc ``step`` at ``index``, the last step run: the arena is as it was
        before it (freeing the block just placed merges the free blocks back as they were)."""
        arena = self.arena
        assert len(arena.live_trace) == index + 1
        arena.free(step.tensor)
        arena.high_water, arena.peak_live, last = self._before
        if last is None:
            del arena.last[step.tensor]
        else:
            arena.last[step.tensor] = last
        del arena.live_trace[index:]
        arena.stopped_at = None


def largest_working_set(schedule, roots=None, smallest=False):
    """The largest :func:`working_set` of ``schedule``'s steps (0 when it has none); with
    ``smallest``, each layer step counted with the smallest workspace of its layer's algorithms
    for its phase instead of the one chosen (what no choice of algorithms can go under)."""
    roots = roots or Roots.of(schedule)
    size, uses, scheduled = roots.size, roots.uses, roots.scheduled
    least = {}  # (node, phase) → the smallest workspace, aligned: layers work theirs out per call
    largest = 0
    for step in schedule.steps:
        if step.kind in MEMORY:
            continue
        reads, writes = uses(step)
        touched = set(writes + reads)
        extra = 0
        if smallest and step.kind in LAYER_STEPS:
            key = (step.node, phase_of(step))
            extra = least.get(key)
            if extra is None:
                algos = schedule.graph.nodes[step.node].layer.algorithms(key[1])
                extra = least[key] = aligned(min((a.workspace for a in algos), default=0))
            if step.kind == FORWARD and step.encoded is not None and step.workspace:
                touched.add(step.workspace)  # its encoded form's scratch (encode.py): no choice
        elif step.workspace and scheduled(step.workspace):
            touched.add(step.workspace)
        largest = max(largest, sum(map(size, touched)) + extra)
    return largest


def replay(schedule, stop=None, residents=None):
    """A planning Arena after making ``schedule``'s allocator calls (resident tensors first,
    then every Alloc and Free with its placement); ``stop(arena)`` ends the replay early.
    ``arena.host`` is the host Arena of the offloaded tensors (an Offload takes host memory
    for its tensor, the Wait after its Prefetch gives it back). ``residents``: the
    :func:`resident_arenas` of ``schedule`` (or of one with the same resident tensors), left
    unchanged."""
    replayer = Replayer(schedule, residents)
    replayer.run(schedule, stop=stop)
    return replayer.arena


def simulate(schedule, replayed=None):
    """The Plan of ``schedule``; ``replayed``: the planning Arena of a whole :func:`replay` of
    it already made (the workspace pass makes one: context.Context.memo), else it is made."""
    arena = replayed or replay(schedule)
    live = arena.live_trace
    peak_step = live.index(max(live)) if live else 0
    roots = Roots.of(schedule)
    chosen, smallest = largest_working_set(schedule, roots), largest_working_set(schedule, roots, smallest=True)
    return Plan(peak_bytes=arena.peak_bytes, resident_bytes=arena.resident_end,
                arena_bytes=arena.high_water, lower_bound_bytes=arena.resident_end + smallest,
                steps=len(schedule.steps), live=live, peak_step=peak_step,
                host_bytes=arena.host.high_water, chosen_bound_bytes=arena.resident_end + chosen)


def compute_step(schedule, index):
    """The compute step that the step at ``index`` serves (an Alloc is for the next compute
    step, a Free for the previous one), as ``Forward(conv1)``."""
    steps = schedule.steps
    if not steps:
        return "-"
    if steps[index].kind == FREE:
        while index > 0 and steps[index].kind in MEMORY:
            index -= 1
    else:
        while index < len(steps) - 1 and steps[index].kind in MEMORY:
            index += 1
    return steps[index].describe(schedule.graph).split(" [")[0]


def overflow_at(schedule, plan, budget):
    """Where a plan that does not fit ``budget`` first exceeds it, as a dict: ``step`` (the
    compute step, as ``Forward(conv1)``, or ``'the resident tensors'`` when they alone exceed
    it), ``step_index`` (None for the resident tensors), ``bytes_at_step`` (the device bytes
    there) and ``needs_bytes`` (the arena the plan needs: what the budget would have to be).

    The budget is first exceeded where the bytes live first pass it (no placement could fit
    them), or, when only the placement's holes lift the arena over it, where the arena first
    grows past it. The peak may come later: it is the Plan's ``peak_step``."""
    needs = max(plan.peak_bytes, plan.arena_bytes)
    if plan.resident_bytes > budget:
        return {"step": "the resident tensors", "step_index": None, "bytes_at_step": plan.resident_bytes,
                "needs_bytes": needs}
    step = next((i for i, x in enumerate(plan.live) if plan.resident_bytes + x > budget), None)
    if step is not None:
        there = plan.resident_bytes + plan.live[step]
    else:
        step, there = plan.overflow(schedule, budget)
    return {"step": compute_step(schedule, step) if step is not None else "start-up", "step_index": step,
            "bytes_at_step": there, "needs_bytes": needs}
