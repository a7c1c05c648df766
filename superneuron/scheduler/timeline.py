"""The cost model's clock: one iteration's estimated time, stream by stream.

:class:`Clock` walks a schedule (scheduler/walk.py) adding each compute step's seconds
(CostModel.step_seconds) to the compute stream, queueing the base walker's copies on a
device→host and a host→device stream and the all-reduces on the network, and counting the
waits; CostModel.timeline makes a :class:`Timeline` of it.
"""

import weakref
from dataclasses import dataclass

from .steps import OFFLOAD, PREFETCH
from .walk import Copies, Walker


@dataclass
class Timeline:
    """An iteration's estimated time: ``seconds`` in all, of which ``stall`` waiting for
    copies and ``recompute`` re-running forwards; ``copied`` bytes moved; ``starts``: each
    step's start time on the compute stream; ``spans``: ``(step index, stream, start, end)``
    of every compute step (on :data:`COMPUTE_STREAM`), copy (:data:`D2H`, :data:`H2D`) and
    stall (a Wait holding the compute stream: :data:`STALL`), all-reduce (:data:`NETWORK`) and
    exposed communication (a WaitReduce holding it: :data:`EXPOSED`); ``communication``: the
    seconds of every all-reduce, of which ``exposed`` held the compute stream."""

    seconds: float
    stall: float
    recompute: float
    copied: float
    starts: list
    spans: list = None
    communication: float = 0.0
    exposed: float = 0.0


# The streams of a timeline's spans (a stall and exposed communication are on the compute
# stream, marked apart).
COMPUTE_STREAM, D2H, H2D, STALL = "compute", "device→host", "host→device", "stall"
NETWORK, EXPOSED = "all-reduce", "exposed all-reduce"


class Clock(Walker):
    """The walker of the cost model: the time of each step on its stream. ``now`` is the
    compute stream's clock; copies (the base walker's, started by Offload and Prefetch and
    waited for by Wait) are queued on a device→host and a host→device stream
    (:class:`_Streams`); an AllReduce on the network. It adds the seconds of compute steps
    and the waits; memory steps take none (the base's allocator calls go to no allocator)."""

    def __init__(self, model, schedule):
        self.model, self.schedule = model, schedule
        self.now = self.stall = self.recompute_seconds = self.update_seconds = self.copied = 0.0
        self.communication = self.exposed = self.network = 0.0
        self.starts, self.spans, self.done = [], [], {}  # done: bucket → when its all-reduce ends
        super().__init__(schedule.tensors, copies=_Streams(self))

    def run(self, schedule):
        starts, methods = self.starts, self.methods
        for step in schedule.steps:
            starts.append(self.now)
            methods[step.kind](self, step)
        return self

    def _span(self, stream, start, end):
        self.spans.append((len(self.starts) - 1, stream, start, end))

    def compute(self, step):
        """A compute step holds the compute stream for its :meth:`CostModel.step_seconds`."""
        seconds = self.model.step_seconds(self.schedule, step)
        self._span(COMPUTE_STREAM, self.now, self.now + seconds)
        self.now += seconds
        return seconds

    def recompute(self, step):
        self.recompute_seconds += self.compute(step)

    def update(self, step):
        self.update_seconds += self.compute(step)

    def allreduce(self, step):
        """Packs its bucket on the compute stream, then queues the bucket's sum on the network."""
        self.compute(step)
        seconds = self.model.link.allreduce_seconds(self.tensors[step.tensor].nbytes)
        self.communication += seconds
        self.network = self.done[step.tensor] = max(self.network, self.now) + seconds
        self._span(NETWORK, self.network - seconds, self.network)

    def waitreduce(self, step):
        """Unpacks its bucket, once its all-reduce is done (any wait is *exposed*)."""
        self.now += self.model.step_seconds(self.schedule, step)
        end = self.done[step.tensor]
        if end > self.now:
            self.exposed += end - self.now
            self._span(EXPOSED, self.now, end)
            self.now = end


class _Streams(Copies):
    """The copies of a :class:`Clock`: each queued on its direction's stream, from when it is
    issued or its stream is free; the handle is when it ends, and a Wait before then holds the
    compute stream (a stall)."""

    def __init__(self, clock):
        self.clock = weakref.proxy(clock)  # no cycle: see walk.Walker
        self.free_at = {OFFLOAD: 0.0, PREFETCH: 0.0}

    def start(self, name, nbytes, kind):
        clock = self.clock
        seconds = clock.model.copy_seconds(nbytes)
        clock.copied += nbytes
        end = self.free_at[kind] = max(self.free_at[kind], clock.now) + seconds
        clock._span(D2H if kind == OFFLOAD else H2D, end - seconds, end)
        return end

    def wait(self, name, end, what, planned):
        clock = self.clock
        if end > clock.now:
            clock.stall += end - clock.now
            clock._span(STALL, clock.now, end)
            clock.now = end
