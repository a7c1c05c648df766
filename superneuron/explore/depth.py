"""The depth search behind sn-depth: the deepest ResNet whose training iteration fits a device
memory budget under each memory policy, found by planning alone (no kernel runs).

The family searched is that of nets/resnet.yaml: depth ``D = 3n + 2`` for ``n >= 16``
bottleneck blocks in stages ``[3, 8, n - 14, 3]``, so every block added goes to the third
stage (14x14 at size 224). The file lays out depths 50, 101 and 152 as the classic
``[3, 4, 6, 3]``, ``[3, 4, 23, 3]`` and ``[3, 8, 36, 3]`` instead, and those break the order
the search relies on (depth 101 needs less than depth 98, whose extra blocks sit in the wider
second stage), so where the net has a ``blocks`` parameter the search sets it too, and depth D
always means ``[3, 8, n - 14, 3]``.

Monotonicity, which the search assumes: when depth D fits the budget under a policy, every
smaller depth of the family fits too. A deeper net has every tensor of a shallower one plus a
block's parameters, gradients, optimiser state and activations, and a policy that fits the
deeper one can treat the extra block as it treats its neighbours. (tests/test_depth.py checks
this by brute force on small settings.)

The search, per policy: first a guess. The *floor* of a depth is the arena of its plan under
a budget of nothing: every tensor the policy can move to the host there, every workspace at
its smallest; it grows by the same bytes with every block added (the parameters, gradients
and optimiser state of a block, plus, for policies that keep activations, the block's
activations at the peak), so the line through the floors of two small depths (cheap to plan)
meets the budget at the depth where the policy's plans stop fitting; where there is host
memory to respect, the guess is the sooner of that and where the line of the floors' host
bytes meets the host memory (short of the answer where the host binds, since a floor puts on
the host all it can: 11 858 blocks' depth against 12 962 for superneurons+params at 12 GiB;
the line of device and host bytes together guessed better there but worse on the tests' small
nets, so the search grows from it instead). The search plans the depth guessed
and its neighbour, and is done when one fits and the other does not (for nets/resnet.yaml
at 224x224 it always is). Otherwise (depth_search.py) it goes on as it would without a guess: grow an upper
bound to just past where a straight line through the last two plans meets the budget (arena
bytes are close to linear in the blocks), going further each time the line falls short,
until a plan does not fit or the cap is reached; then narrow ``(fits, does not fit)`` to
adjacent depths, guessing where a line meets the budget (through the two nearest plans that
do not fit, or else through the two ends) and bisecting after any guess that fails to halve
the interval. Each depth is loaded, built and lowered once for all policies: the searches
run side by side, and every depth asked for is planned under each policy that asks for it.
The guess only saves plans: the answer is the same without it (``guess=False``), by the monotonicity above.

Planning a deep net is the time a search takes (tens of thousands of steps per plan, a
couple of seconds at depth 3000), so the passes are near-linear in the steps and the search
plans few depths: a whole scan of every policy at 12 GiB takes under a minute
(tools/bench_depth.py). The cap (``--max-depth``, default :data:`MAX_DEPTH`) bounds the
search where memory stops binding: with parameter offload the device keeps only BatchNorm's
running statistics, a few KiB per block, so only host memory ends the search, and without
``--host-memory`` nothing does.
"""

import contextlib
import gc
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from .. import planning
from ..backend import planning_kernels
from ..errors import SNError
from ..graph import Graph
from ..net import Net
from ..netfile.spec import load_spec
from ..scheduler.cost import CostModel
from ..train.optim import make_optimizer
from ..train.solver_config import SolverConfig
from .depth_search import MIN_BLOCKS, search

MAX_DEPTH = 5000         # the default cap on the search: 1666 blocks, some 400 000 steps to plan
GUESS_FROM = (MIN_BLOCKS, 2 * MIN_BLOCKS)  # the depths whose floors make the guess


def depth_of(blocks):
    """The depth of a ResNet of ``blocks`` bottleneck blocks (three layers each, plus the stem
    convolution and the classifier)."""
    return 3 * blocks + 2


def blocks_of(depth):
    """The number of blocks of the deepest family member no deeper than ``depth``."""
    return (depth - 2) // 3


@dataclass
class Probe:
    """One depth planned under one policy."""

    policy: str
    blocks: int
    fits: bool
    peak_bytes: int
    arena_bytes: int          # what must fit the budget: resident + the placed high-water mark
    resident_bytes: int
    host_bytes: int           # the host arena's high-water mark: offloaded tensors (and with +params,
                              # parameters, gradients, optimiser state); 0 where nothing is there
    lower_bound_bytes: int
    steps: int
    est_seconds: float = None  # the cost model's iteration time; computed for fitting plans only
    seconds: float = 0.0       # wall time of this policy's passes and the simulation
    need_bytes: int = None     # what the search weighs against the budget (see Planner.need)

    @property
    def depth(self):
        return depth_of(self.blocks)


@dataclass
class Result:
    """The deepest fitting depth under one policy. ``depth`` 0: not even depth 50 fits;
    ``at_cap``: the cap fits, so the answer is at least ``depth``. ``best`` is the plan of
    ``depth``; ``over`` that of the shallowest depth found not to fit (``depth + 3``, or 50)."""

    policy: str
    depth: int
    at_cap: bool
    best: Probe
    over: Probe
    probes: int

    def as_dict(self):
        """The figures as a JSON-ready dict."""
        best = self.best
        return {
            "policy": self.policy, "depth": self.depth, "blocks": best.blocks if best else 0,
            "at_cap": self.at_cap,
            **{k: getattr(best, k) if best else None
               for k in ("peak_bytes", "arena_bytes", "resident_bytes", "host_bytes",
                         "lower_bound_bytes", "steps", "est_seconds")},
            "next_depth": self.over.depth if self.over else None,
            "next_arena_bytes": self.over.arena_bytes if self.over else None,
            "next_host_bytes": self.over.host_bytes if self.over else None,
            "probes": self.probes,
        }


class Planner:
    """Plans the family member of ``n`` blocks under a policy, ``budget`` (bytes) and
    ``host_memory`` (bytes, None: unbounded; what offloading may keep on the host, and a plan
    fits only where its host bytes are within it too, as sn-plan says).

    ``path``, ``overrides`` and ``batch`` are as for spec.load_spec (the overrides must not
    set ``depth`` or ``blocks``: the planner does); ``device`` names the cost model that ranks
    algorithms and estimates iteration times. The optimiser's state is resident, as sn-train
    allocates it (SGD with momentum). The last ``keep`` lowered schedules are kept for the
    other policies (apply_policy leaves its input alone)."""

    def __init__(self, path, budget, overrides=None, batch=None, device="cpu", keep=2, host_memory=None):
        self.path, self.budget, self.batch, self.host_memory = path, budget, batch, host_memory
        self.overrides = dict(overrides or {})
        for key in ("depth", "blocks"):
            if key in self.overrides:
                raise SNError(f"--set {key}: sn-depth chooses the depth itself")
        self.costs = CostModel(device)
        self.kernels = planning_kernels(device)  # cuDNN's algorithms when planning for a GPU here
        self.optimizer = make_optimizer(SolverConfig())
        self.keep = keep
        self._lowered = OrderedDict()
        self.stats = {"builds": 0, "build_seconds": 0.0, "probes": 0, "plan_seconds": 0.0,
                      "floors": 0, "floor_seconds": 0.0}
        first = load_spec(path, overrides={**self.overrides, "depth": depth_of(MIN_BLOCKS)}, batch=batch)
        self.sets_blocks = "blocks" in first.params

    def spec(self, n):
        """The NetSpec of the family member with ``n`` blocks."""
        overrides = {**self.overrides, "depth": depth_of(n)}
        if self.sets_blocks:
            overrides["blocks"] = [3, 8, n - 14, 3]
        return load_spec(self.path, overrides=overrides, batch=self.batch)

    def lowered(self, n):
        """The baseline schedule of ``n`` blocks (built once while among the last ``keep``)."""
        if n in self._lowered:
            self._lowered.move_to_end(n)
            return self._lowered[n]
        start = time.perf_counter()
        schedule = planning.lowered(Graph(self.spec(n), kernels=self.kernels), optimizer=self.optimizer)
        self.stats["builds"] += 1
        self.stats["build_seconds"] += time.perf_counter() - start
        self._lowered[n] = schedule
        while len(self._lowered) > self.keep:
            self._lowered.popitem(last=False)
        return schedule

    def fits(self, plan):
        """Whether a simulate.Plan fits the budget and the host memory."""
        return planning.fits(plan, self.budget, self.host_memory)

    def need(self, plan):
        """What the search weighs against the budget for a simulate.Plan: its arena, or, where
        its host bytes fill more of the host memory than the arena fills of the budget, its
        host bytes at the budget's scale; so it is within the budget exactly where the plan
        fits, and grows with whichever memory binds (the lines the search draws need that)."""
        if self.host_memory is None or plan.host_bytes * self.budget <= plan.arena_bytes * self.host_memory:
            return plan.arena_bytes
        return -(-plan.host_bytes * self.budget // self.host_memory)  # rounded up: over stays over

    def probe(self, policy, n):
        """The :class:`Probe` of ``n`` blocks under ``policy``."""
        schedule = self.lowered(n)
        start = time.perf_counter()
        schedule, plan = planning.plan(schedule, policy, budget=self.budget, host_memory=self.host_memory,
                                       cost=self.costs)
        fits = self.fits(plan)
        probe = Probe(policy, n, fits, plan.peak_bytes, plan.arena_bytes, plan.resident_bytes,
                      plan.host_bytes, plan.lower_bound_bytes, plan.steps,
                      self.costs.iteration_seconds(schedule) if fits else None,
                      need_bytes=self.need(plan))
        probe.seconds = time.perf_counter() - start
        self.stats["probes"] += 1
        self.stats["plan_seconds"] += probe.seconds
        return probe

    def floor(self, policy, n):
        """The simulate.Plan of ``n`` blocks under ``policy`` and a budget of nothing: as much
        on the host as the host memory allows, the smallest workspaces. Its arena is the least
        any budget lets the policy reach, near enough; the guess is made from it."""
        start = time.perf_counter()
        plan = planning.plan(self.lowered(n), policy, budget=0, host_memory=self.host_memory,
                             cost=self.costs)[1]
        self.stats["floors"] += 1
        self.stats["floor_seconds"] += time.perf_counter() - start
        return plan

    def guess(self, floors, max_blocks):
        """The blocks where the line through ``floors`` (``{blocks: floor Plan}`` of two depths)
        meets the budget, or where the line of their host bytes meets the host memory if
        sooner, between :data:`MIN_BLOCKS` and ``max_blocks``. (A floor has on the host all
        that can go there, a plan under a budget only what must: where the host binds, the
        guess falls short, and the search grows from it.)"""
        (n1, a), (n2, b) = sorted(floors.items())
        limit = _limit(n1, a.arena_bytes, n2, b.arena_bytes, self.budget)
        if self.host_memory is not None:
            limit = min(limit, _limit(n1, a.host_bytes, n2, b.host_bytes, self.host_memory))
        return max(MIN_BLOCKS, min(limit, max_blocks))


def _limit(n1, y1, n2, y2, bound):
    """The most blocks whose value on the line through ``(n1, y1)`` and ``(n2, y2)`` is within
    ``bound`` (a large number where the line does not rise)."""
    if y2 <= y1:
        return 1 << 40
    return n1 + (bound - y1) * (n2 - n1) // (y2 - y1)


@contextlib.contextmanager
def _planning():
    """The cyclic garbage collector held off: a search makes and drops millions of objects,
    which reference counting frees (plans make no reference cycles), and the collector's full
    passes over the big graphs and schedules alive cost a fifth of the planning time. (The
    passes' memos live with the schedules, so nothing is left to drop when done.)"""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def deepest(planner, policies, max_depth=MAX_DEPTH, progress=None, guess=True):
    """A :class:`Result` per policy in ``policies``: the deepest member of the family that
    ``planner`` plans whose plan fits its budget (and host memory), up to ``max_depth``.
    ``progress(probe)`` is called after each plan. Each search starts from the guess that the
    floors of :data:`GUESS_FROM` give (``guess=False``: from depth 50, as without one). The
    searches advance together, shallowest request first, so a depth that several policies
    ask for is built once."""
    max_blocks = blocks_of(max_depth)
    if max_blocks < MIN_BLOCKS:
        raise SNError(f"the largest depth ({max_depth}) is under the smallest, {depth_of(MIN_BLOCKS)}")
    with _planning():
        guesses = dict.fromkeys(policies)
        if guess and max_blocks > MIN_BLOCKS:
            floors = {p: {} for p in policies}
            for n in GUESS_FROM:
                for p in policies:
                    floors[p][n] = planner.floor(p, n)
            guesses = {p: planner.guess(floors[p], max_blocks) for p in policies}
        searches = {p: search(planner.budget, max_blocks, guess=guesses[p]) for p in policies}
        wants = {p: next(s) for p, s in searches.items()}
        results = {}
        while wants:
            n = min(wants.values())
            for policy in [p for p, m in wants.items() if m == n]:
                probe = planner.probe(policy, n)
                if progress:
                    progress(probe)
                try:
                    wants[policy] = searches[policy].send(probe)
                except StopIteration as stop:
                    best, over, at_cap, probes = stop.value
                    results[policy] = Result(policy, best.depth if best else 0, at_cap, best, over, probes)
                    del wants[policy]
    return [results[p] for p in policies]


def synthetic_feed(net, rng):
    """Random inputs for ``net``: standard normal data, and integer labels below the class
    count (the channels of the first bottom of its losses) for one-dimensional inputs."""
    classes = min((net.graph.tensors[n.bottoms[0]].shape[1] for n in net.graph.losses), default=2)
    feed = {}
    for name in net.input_names:
        shape = net.input_shape(name)
        if len(shape) == 1:
            feed[name] = rng.integers(0, classes, shape).astype(np.float32)
        else:
            feed[name] = rng.standard_normal(shape).astype(np.float32)
    return feed


def verify(planner, result, device="cpu", iterations=2, seed=0):
    """Train ``iterations`` steps of ``result``'s depth under its policy, the planner's budget
    and host memory on random data, on ``device``; ``{'real_peak_bytes',
    'net_plan_peak_bytes', 'loss', 'equal'}``, ``equal`` when the run's peak is the searched
    plan's peak to the byte. The run plans with the planner's cost model (not a measured
    table cached for this machine), so it makes the plan the search made."""
    net = Net(planner.spec(result.best.blocks), device=device, optimizer=make_optimizer(SolverConfig()),
              memory=planner.budget, policy=result.policy, seed=seed, host_memory=planner.host_memory,
              costs=planner.costs)
    rng = np.random.default_rng(seed)
    loss = None
    for i in range(iterations):
        loss = float(net.train_step(synthetic_feed(net, rng), i))
    return {"real_peak_bytes": int(net.peak_bytes), "net_plan_peak_bytes": net.plans["train"].peak_bytes,
            "loss": loss, "equal": net.peak_bytes == result.best.peak_bytes == net.plans["train"].peak_bytes}

