"""The Simulator: runs a schedule's memory steps on a planning Arena (no kernels), giving the
bytes live after every step, the peak, the arena size after placement, and the lower bound.

It makes exactly the allocator calls the Runtime makes, in the same order, so its figures are
the run's figures to the byte (plan equals run)."""

from dataclasses import dataclass, field

from ..runtime.arena import Arena, aligned


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

    def fits(self, budget):
        return budget is None or self.arena_bytes <= budget

    def overflow(self, schedule, budget):
        """``(step index, bytes needed)`` of the first step whose arena exceeds ``budget``."""
        arena = _replay(schedule, stop=lambda a: a.high_water > budget)
        return arena.stopped_at, arena.high_water


def working_set(schedule, step):
    """Bytes a compute step needs on the device at once: operands, outputs, workspace."""
    graph = schedule.graph
    if step.kind == "update":
        names = []
    elif step.kind in ("forward", "recompute", "backward"):
        node = graph.nodes[step.target]
        names = list(node.bottoms) + list(node.tops)
        if step.kind == "backward":
            names += [g for g in node.top_grads + node.bottom_grads if g]
    else:
        return 0
    roots = {graph.root(t) if t in graph.tensors else t for t in names}
    roots -= set(schedule.resident)
    total = sum(aligned(schedule.tensors[t].nbytes) for t in roots)
    if step.workspace:
        total += aligned(schedule.tensors[step.workspace].nbytes)
    return total


def _replay(schedule, stop=None):
    arena = Arena(None)
    for name in schedule.resident:
        arena.place_resident(name, schedule.tensors[name].nbytes)
    arena.live_trace = []
    arena.stopped_at = None
    for i, step in enumerate(schedule.steps):
        if step.kind == "alloc":
            arena.alloc(step.target, schedule.tensors[step.target].nbytes)
        elif step.kind == "free":
            arena.free(step.target)
        arena.live_trace.append(arena.live)
        if stop is not None and stop(arena):
            arena.stopped_at = i
            break
    return arena


def simulate(schedule):
    """The Plan of ``schedule``."""
    arena = _replay(schedule)
    live = arena.live_trace
    peak_step = live.index(max(live)) if live else 0
    largest = max((working_set(schedule, s) for s in schedule.steps), default=0)
    return Plan(peak_bytes=arena.peak_bytes, resident_bytes=arena.resident_end,
                arena_bytes=arena.high_water, lower_bound_bytes=arena.resident_end + largest,
                steps=len(schedule.steps), live=live, peak_step=peak_step)
