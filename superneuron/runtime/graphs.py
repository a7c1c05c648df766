"""A training iteration captured once as a CUDA graph and replayed (``sn-train --cuda-graph``,
``Net(spec, cuda_graph=True)``): :class:`IterationGraph`.

An iteration runs on fixed addresses: the arena's offsets are the plan's, the same in every
iteration, and part A left no host synchronisation inside it. So once the walker has queued an
iteration's kernels, copies and events, CUDA can record them (stream capture) and launch the
whole iteration again as one graph, without the host's per-step work. What differs from one
iteration to the next must then reach the kernels through device memory the graph reads,
written before each launch (:meth:`IterationGraph._refresh`):

- the batch, copied into staging buffers on the device (one batch of the inputs, beside the
  arena), which the captured Input and Data steps copy into their tops;
- the learning rate, in the one-kernel SGD's rate tables (Optimizer.refresh).

Where something else changes, or cannot be captured, the run goes on without a graph and says
why in one line (:attr:`IterationGraph.line`), the first reason found: the CPU backend;
data-parallel ranks; parameter offload (its update runs on the host); iter_size > 1 (each
round's losses are checked on the host before the next); a layer with host code of its own (a
Python layer); a layer that draws random numbers (Dropout: its seed is the iteration's, a host
number the graph would repeat); an update that takes host numbers (Optimizer.replay_blocker);
a host sync in the warm-up iteration; a capture that fails (its error). None of these changes a
result: the iteration then runs as it does without the flag.

The sequence: :data:`WARMUP` iterations run as usual but on the capture stream and with a
private memory pool (so that the capture finds the library's scratch already there, and no
memory the graph uses is ever handed to anyone else); the next iteration is captured and
launched; every later one refreshes the inputs and launches the graph. The walker's host-side
record of the captured iteration (the arena's placement, its outputs) stands for every replay.
"""

import collections
import contextlib
import copy

from ..layers import parallel
from ..scheduler.steps import FORWARD

WARMUP = 1  # iterations run normally (on the capture stream) before the one captured
# The arena's record of an iteration's placement (what Allocator.reset starts anew): kept as the
# captured iteration left it, and put back after each replay
PLACEMENT = ("planned", "count", "offsets", "last", "free_blocks", "top", "live", "peak_live", "high_water")


def graph_api(backend):
    """The stream capture of ``backend``: :class:`CudaGraphs` on a GPU; a test's stand-in where
    the backend offers one (``backend.graph_api()``); None on the CPU, which has no graphs."""
    offered = getattr(backend, "graph_api", None)
    if offered is not None:
        return offered()
    if backend.name == "gpu":
        return CudaGraphs(backend.xp, backend.kernels())
    return None


def blocker(runtime, schedule, api):
    """Why ``schedule`` cannot be captured on ``runtime``, as far as can be told before it runs
    (a few words), or None."""
    if api is None:
        return f"{runtime.backend.name.upper()} backend"
    if getattr(api, "unable", None):
        return api.unable
    if runtime.group is not None:
        return f"data-parallel over {runtime.group.size} ranks: the collectives are not captured"
    if runtime.host_update:
        return "parameter offload: the update runs on the host"
    if schedule.rounds > 1:
        return f"iter_size {schedule.rounds}: each round's losses are checked on the host before the next"
    graph = runtime.graph
    for i in sorted({s.node for s in schedule.steps if s.kind == FORWARD}):
        node = graph.nodes[i]
        if node.layer.HOST_CODE:
            return f"a layer with host-side work: {node.layer.type} layer '{node.name}'"
        if node.layer.draws(schedule.train):
            return (f"random numbers drawn each iteration from a host seed: {node.layer.type} layer "
                    f"'{node.name}'")
    return None


def warm_blocker(runtime, optimizer, draws_before):
    """Why the iteration just run (normally) cannot be captured and replayed, as only running it
    tells, or None: a host sync inside it, random numbers drawn from a host seed (``draws_before``:
    the backend's count before it), an update that takes host numbers."""
    if runtime.syncs_inside:
        return f"a host sync inside the iteration: {next(iter(runtime.syncs_inside))}"
    if runtime.backend.draws != draws_before:
        return "random numbers drawn each iteration from a host seed"
    return optimizer.replay_blocker(runtime.xp)


class IterationGraph:
    """The training iterations of one Runtime, through a CUDA graph where they can be (see the
    module's docstring). :meth:`step` runs one; :attr:`line` says where it stands; ``replays``
    counts the iterations the graph ran after the one it was captured in. ``api``: the stream
    capture (default: :func:`graph_api` of the runtime's backend)."""

    def __init__(self, runtime, schedule, api=None, warmup=WARMUP):
        self.runtime, self.schedule = runtime, schedule
        self.api = graph_api(runtime.backend) if api is None else api
        self.warmup, self.warmed = warmup, 0
        self.reason = blocker(runtime, schedule, self.api)
        self.graph = self.staging = self.checked = self.placed = None
        self.captured_at, self.replays = None, 0

    @property
    def line(self):
        """One line for the user; it changes when the graph is captured or given up, not at
        every replay."""
        if self.reason is not None:
            return f"cuda graph: off ({self.reason})"
        if self.graph is None:
            return (f"cuda graph: on: {self.warmup} warm-up iteration{'s' if self.warmup != 1 else ''}, "
                    f"then one captured and replayed")
        return f"cuda graph: on: captured at iteration {self.captured_at}, replayed since"

    def step(self, feed, iteration, optimizer):
        """One training iteration of the schedule on ``feed`` (host arrays by input name): its
        scalar outputs, as Runtime.run returns them."""
        runtime, schedule = self.runtime, self.schedule
        if self.reason is not None:
            return runtime.run(schedule, feed, iteration, optimizer)
        if self.graph is None and self.warmed < self.warmup:
            return self._warm(feed, iteration, optimizer)
        checked = runtime.check_labels(feed)  # as every iteration's feed is (it may refuse them)
        if self.graph is None:
            return self._capture(feed, iteration, optimizer, checked)
        if checked != self.checked:  # a label layer the capture did not check on the host
            return runtime.run(schedule, feed, iteration, optimizer)
        self._refresh(feed, iteration, optimizer)
        outputs = self._launch(iteration)
        self.replays += 1
        return outputs

    def _warm(self, feed, iteration, optimizer):
        runtime = self.runtime
        draws = runtime.backend.draws
        with self.api.running(pool=True):
            outputs = runtime.run(self.schedule, feed, iteration, optimizer)
        self.warmed += 1
        self.reason = warm_blocker(runtime, optimizer, draws)
        return outputs

    def _capture(self, feed, iteration, optimizer, checked):
        runtime, schedule = self.runtime, self.schedule
        self.checked = checked
        self.staging = {name: runtime.xp.empty(info.shape, info.dtype) for name, info in
                        ((t, runtime.tensors[t]) for n in runtime.graph.inputs for t in n.tops)}
        self._refresh(feed, iteration, optimizer)

        def iteration_steps():
            return runtime.walk_round(schedule, self.staging, (iteration, 0), optimizer, checked=checked)

        copies = runtime.copies.captured() if runtime.copies is not None else contextlib.nullcontext()
        try:
            with self.api.running(pool=True), runtime.backend.watch_allocations() as outside, \
                    parallel.numpy_settings(), copies:
                self.graph = self.api.capture(iteration_steps)
        except Exception as e:  # noqa: BLE001 - nothing ran: the iteration runs as it would without
            self.graph, self.reason = None, f"capture failed: {_one_line(e)}"
            return runtime.run(schedule, feed, iteration, optimizer)
        runtime.outside = outside
        self.captured_at = iteration
        return self._launch(iteration)

    def _launch(self, iteration):
        """Launch the graph, and read its outputs back once it has run: ``iteration``'s."""
        runtime = self.runtime
        with self.api.running(), parallel.numpy_settings():  # (NumPy's: for a stand-in's replay)
            execution = self.api.launch(self.graph)
            outputs = runtime.read_outputs(execution, iteration)
        if self.placed is None:  # the first launch: the captured iteration's placement, kept
            self.placed = {k: copy.copy(getattr(runtime.arena, k)) for k in PLACEMENT}
        self._restore(execution)
        return outputs

    def _refresh(self, feed, iteration, optimizer):
        """Write what changes between iterations where the graph reads it: the batch into the
        staging buffers (converted as the Input layer converts it), the learning rate."""
        backend = self.runtime.backend
        with self.api.running():
            for name, buffer in self.staging.items():
                backend.copy_from_host(buffer, feed[name])
            optimizer.refresh(iteration)

    def _restore(self, execution):
        """The runtime's host-side record as the captured iteration left it (a test pass may
        have placed the arena since), so that views of the last iteration read what it wrote."""
        runtime = self.runtime
        for k, v in self.placed.items():
            setattr(runtime.arena, k, copy.copy(v))
        runtime.schedule, runtime.memory, runtime._labels_checked = self.schedule, execution, self.checked
        runtime.syncs_inside = collections.Counter()  # a replay makes the host wait for nothing inside


class CudaGraphs:
    """CuPy's stream capture: ``Stream.begin_capture``/``end_capture`` make a ``cupy.cuda.Graph``,
    launched on the same stream. The stream is a blocking one, so that work on the default
    stream (the rest of a run: test passes, snapshots) stays ordered with it; cuDNN's handle
    (``kernels``, layers/cudnn.py) is moved onto it while it is current. ``pool``: a memory pool
    of the capture's own, which CuPy allocates from during the warm-up and the capture, so that
    the scratch the graph's kernels use is never handed to anything else."""

    def __init__(self, cupy, kernels=None):
        self.cupy, self.kernels = cupy, kernels
        self.stream = cupy.cuda.Stream()
        self.pool = cupy.cuda.MemoryPool()
        self.unable = None  # why this GPU cannot capture, where that is known at once
        if not hasattr(cupy.cuda.Stream, "begin_capture"):
            self.unable = f"CuPy {getattr(cupy, '__version__', '')} has no stream capture"
        elif kernels is not None and not hasattr(getattr(kernels, "cudnn", None), "set_stream"):
            self.unable = "the cuDNN Frontend cannot move its handle onto the capture stream (no set_stream)"

    @contextlib.contextmanager
    def running(self, pool=False):
        """Work queued meanwhile goes on the capture stream (``pool``: memory from the
        capture's pool)."""
        cuda = self.cupy.cuda
        before = cuda.get_allocator()
        if pool:
            cuda.set_allocator(self.pool.malloc)
        if self.kernels is not None:
            self.kernels.use_stream(self.stream.ptr)
        try:
            with self.stream:
                yield
        finally:
            if self.kernels is not None:
                self.kernels.use_stream(0)
            if pool:
                cuda.set_allocator(before)

    def capture(self, steps):
        """Capture what ``steps()`` queues (nothing runs): a graph whose launch returns what
        ``steps()`` returned (the Execution, whose outputs each launch writes)."""
        stream = self.stream
        stream.begin_capture()
        try:
            result = steps()
        except BaseException:
            with contextlib.suppress(Exception):  # end the broken capture; its error is the first
                stream.end_capture()
            raise
        return _Graph(stream.end_capture(), result)

    def launch(self, graph):
        """Queue the graph on the capture stream; what its capture returned."""
        graph.graph.launch(self.stream)
        return graph.result


class _Graph:
    def __init__(self, graph, result):
        self.graph, self.result = graph, result


def _one_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__
