"""The Simulator: runs a schedule's memory steps on a planning Arena (no kernels), giving the
bytes live after every step, the peak, the arena size after placement, and the lower bound.

It makes exactly the allocator calls the Runtime makes, in the same order, so its figures are
the run's figures to the byte (plan equals run)."""

from dataclasses import dataclass, field

from ..runtime.arena import Arena, aligned
from .cost import step_seconds  # noqa: F401  (step times: the cost model; the trace imports it here)
from .liveness import Roots, step_roots
from .schedule import MEMORY


@dataclass
class Plan:
    """What one iteration costs in device memory under a schedule."""

    peak_bytes: int            # resident + the largest sum of scheduled bytes live at once
    resident_bytes: int
    arena_bytes: int           # resident + the scheduled region's high-water mark after placement
    lower_bound_bytes: int     # resident + the largest working set of any step
    steps: int
    live: list = field(default_factory=list)   # scheduled bytes live after each step
    peak_step: int = 0         # index of the step where the peak is first reached
    host_bytes: int = 0        # the most host memory offloaded tensors (and host-resident ones) take

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


def replay(schedule, stop=None):
    """A planning Arena after making ``schedule``'s allocator calls (resident tensors first,
    then every Alloc and Free with its placement); ``stop(arena)`` ends the replay early.
    ``arena.host`` is the host Arena of the offloaded tensors (an Offload takes host memory
    for its tensor, the Wait after its Prefetch gives it back)."""
    arena = Arena(None)
    arena.host = host = Arena(None)
    for name in schedule.host_resident:
        host.place_resident(name, schedule.tensors[name].nbytes)
    pending = {}
    for name in schedule.resident:
        arena.place_resident(name, schedule.tensors[name].nbytes)
    arena.reset(schedule.offsets)
    arena.live_trace = []
    arena.stopped_at = None
    for i, step in enumerate(schedule.steps):
        if step.kind == "alloc":
            arena.alloc(step.target, schedule.tensors[step.target].nbytes)
        elif step.kind == "free":
            arena.free(step.target)
        elif step.kind == "offload":
            if step.target not in host.resident:
                host.alloc(step.target, schedule.tensors[step.target].nbytes)
            pending[step.target] = "offload"
        elif step.kind == "prefetch":
            pending[step.target] = "keep" if step.algo == "keep" else "prefetch"
        elif step.kind == "wait" and pending.pop(step.target) == "prefetch":
            host.free(step.target)
        arena.live_trace.append(arena.live)
        if stop is not None and stop(arena):
            arena.stopped_at = i
            break
    return arena


def simulate(schedule):
    """The Plan of ``schedule``."""
    arena = replay(schedule)
    live = arena.live_trace
    peak_step = live.index(max(live)) if live else 0
    roots = Roots(schedule)
    largest = max((working_set(schedule, s, roots) for s in schedule.steps), default=0)
    return Plan(peak_bytes=arena.peak_bytes, resident_bytes=arena.resident_end,
                arena_bytes=arena.high_water, lower_bound_bytes=arena.resident_end + largest,
                steps=len(schedule.steps), live=live, peak_step=peak_step,
                host_bytes=arena.host.high_water)


def compute_step(schedule, index):
    """The compute step that the step at ``index`` serves (an Alloc is for the next compute
    step, a Free for the previous one), as ``Forward(conv1)``."""
    steps = schedule.steps
    if not steps:
        return "-"
    if steps[index].kind == "free":
        while index > 0 and steps[index].kind in MEMORY:
            index -= 1
    else:
        while index < len(steps) - 1 and steps[index].kind in MEMORY:
            index += 1
    return steps[index].describe(schedule.graph).split(" [")[0]


def overflow_at(schedule, plan, budget):
    """Where a plan first overflows ``budget``: ``(compute step, step index, bytes needed)``.

    That is where the bytes live first exceed the budget (no placement could fit them), or,
    when only the placement's holes overflow it, where the arena first grows past it."""
    step = next((i for i, x in enumerate(plan.live) if plan.resident_bytes + x > budget), None)
    need = plan.peak_bytes
    if step is None:
        step, need = plan.overflow(schedule, budget)
    where = compute_step(schedule, step) if step is not None else "start-up"
    return where, step, max(need, plan.arena_bytes)
