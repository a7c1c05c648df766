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

The search, per policy: plan depth 50, then 98; grow an upper bound to just past where a
straight line through the last two plans meets the budget (arena bytes are close to linear in
the blocks), going further each time the line falls short, until a plan does not fit or the
cap is reached; then narrow ``(fits, does not fit)`` to adjacent depths, guessing where a
line meets the budget (through the two nearest plans that do not fit, or else through the two
ends) and bisecting after any guess that fails to halve the interval. Each depth is loaded, built
and lowered once for all policies: the searches run side by side, and every depth asked for
is planned under each policy that asks for it.
"""

import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from .errors import SNError
from .graph import Graph
from .optim import SolverConfig, make_optimizer
from .scheduler.cost import CostModel
from .scheduler.lower import lower
from .scheduler.policy import apply_policy
from .scheduler.simulate import simulate
from .spec import load_spec

MIN_BLOCKS = 16          # depth 50: stages [3, 8, 2, 3]
MAX_DEPTH = 100_000      # the default cap on the search


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
    host_bytes: int           # bytes offloaded to the host at the peak (0 where nothing is)
    lower_bound_bytes: int
    steps: int
    est_seconds: float = None  # the cost model's iteration time; computed for fitting plans only
    seconds: float = 0.0       # wall time of this policy's passes and the simulation

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
            "probes": self.probes,
        }


class Planner:
    """Plans the family member of ``n`` blocks under a policy and ``budget`` (bytes).

    ``path``, ``overrides`` and ``batch`` are as for spec.load_spec (the overrides must not
    set ``depth`` or ``blocks``: the planner does); ``device`` names the cost model that ranks
    algorithms and estimates iteration times. The optimiser's state is resident, as sn-train
    allocates it (SGD with momentum). The last ``keep`` lowered schedules are kept for the
    other policies (apply_policy leaves its input alone)."""

    def __init__(self, path, budget, overrides=None, batch=None, device="cpu", keep=2):
        self.path, self.budget, self.batch = path, budget, batch
        self.overrides = dict(overrides or {})
        for key in ("depth", "blocks"):
            if key in self.overrides:
                raise SNError(f"--set {key}: sn-depth chooses the depth itself")
        self.costs = CostModel(device)
        self.optimizer = make_optimizer(SolverConfig())
        self.keep = keep
        self._lowered = OrderedDict()
        self.stats = {"builds": 0, "build_seconds": 0.0, "probes": 0, "plan_seconds": 0.0}
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
        schedule = lower(Graph(self.spec(n)), train=True, optimizer=self.optimizer)
        self.stats["builds"] += 1
        self.stats["build_seconds"] += time.perf_counter() - start
        self._lowered[n] = schedule
        while len(self._lowered) > self.keep:
            self._lowered.popitem(last=False)
        return schedule

    def probe(self, policy, n):
        """The :class:`Probe` of ``n`` blocks under ``policy``."""
        schedule = self.lowered(n)
        start = time.perf_counter()
        schedule = apply_policy(schedule, policy, budget=self.budget, costs=self.costs)
        plan = simulate(schedule)
        fits = plan.fits(self.budget)
        probe = Probe(policy, n, fits, plan.peak_bytes, plan.arena_bytes, plan.resident_bytes,
                      getattr(plan, "host_bytes", 0), plan.lower_bound_bytes, plan.steps,
                      self.costs.iteration_seconds(schedule) if fits else None)
        probe.seconds = time.perf_counter() - start
        self.stats["probes"] += 1
        self.stats["plan_seconds"] += probe.seconds
        return probe


def search(budget, max_blocks, min_blocks=MIN_BLOCKS):
    """The search for one policy, as a generator: it yields the number of blocks it wants
    planned, is sent back that plan (anything with ``blocks``, ``fits`` and ``arena_bytes``),
    and returns ``(best, over, at_cap, probes)``: the deepest fitting plan (None when
    ``min_blocks`` does not fit), the shallowest plan found not to fit (None at the cap), and
    whether ``best`` is the cap. Assumes fitting is monotone in the number of blocks."""
    probes = 1
    lo = yield min_blocks
    if not lo.fits:
        return None, lo, False, probes
    prev, hi, misses = None, None, 0
    while hi is None:               # grow an upper bound
        if lo.blocks >= max_blocks:
            return lo, None, True, probes
        n = 2 * lo.blocks
        if prev is not None and lo.arena_bytes > prev.arena_bytes:
            # just past where the line through the last two plans meets the budget, but each
            # time the line fell short (its guess fit) at least twice as far on as the last
            least = lo.blocks + max(1, (lo.blocks << misses) // 16)
            n = min(max(int(_crossing(prev, lo, budget)) + 1, least), 16 * lo.blocks)
        p = yield min(n, max_blocks)
        probes += 1
        if p.fits:
            if prev is not None:
                misses += 1
            prev, lo = lo, p
        else:
            hi = p
    above = None                      # the nearest misfit past hi
    ends, bisect = True, False
    while hi.blocks - lo.blocks > 1:  # narrow to adjacent depths
        width = hi.blocks - lo.blocks
        n, guess = (lo.blocks + hi.blocks) // 2, None
        if not bisect and above is not None and above.arena_bytes > hi.arena_bytes:
            guess = "misfits"
            n = int(_crossing(hi, above, budget))
        elif not bisect and ends and hi.arena_bytes > lo.arena_bytes:
            guess = "ends"
            n = int(_crossing(lo, hi, budget))
        p = yield min(max(n, lo.blocks + 1), hi.blocks - 1)
        probes += 1
        if p.fits:
            lo = p
        else:
            above, hi = hi, p
        # a guess that fails to halve the interval is followed by a bisection; the line through
        # the ends is given up for good then, as plans that hug the budget (offloading makes
        # them) leave it flat, but not the misfits' line, which such plans do not flatten
        bisect = guess is not None and hi.blocks - lo.blocks > width // 2
        ends = ends and not (bisect and guess == "ends")
    return lo, hi, False, probes


def _crossing(a, b, budget):
    """Blocks where the line through plans ``a`` and ``b`` (blocks, arena bytes) meets ``budget``."""
    slope = (b.arena_bytes - a.arena_bytes) / (b.blocks - a.blocks)
    return a.blocks + (budget - a.arena_bytes) / slope


def deepest(planner, policies, max_depth=MAX_DEPTH, progress=None):
    """A :class:`Result` per policy in ``policies``: the deepest member of the family that
    ``planner`` plans whose plan fits its budget, up to ``max_depth``. ``progress(probe)`` is
    called after each plan. The searches advance together, shallowest request first, so a
    depth that several policies ask for is built once."""
    max_blocks = blocks_of(max_depth)
    if max_blocks < MIN_BLOCKS:
        raise SNError(f"the largest depth ({max_depth}) is under the smallest, {depth_of(MIN_BLOCKS)}")
    searches = {p: search(planner.budget, max_blocks) for p in policies}
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
    """Train ``iterations`` steps of ``result``'s depth under its policy and the planner's
    budget on random data; ``{'real_peak_bytes', 'net_plan_peak_bytes', 'loss', 'equal'}``,
    ``equal`` when the run's peak is the searched plan's peak to the byte."""
    from .net import Net
    net = Net(planner.spec(result.best.blocks), device=device, optimizer=make_optimizer(SolverConfig()),
              memory=planner.budget, policy=result.policy, seed=seed)
    rng = np.random.default_rng(seed)
    loss = None
    for i in range(iterations):
        loss = float(net.train_step(synthetic_feed(net, rng), i))
    return {"real_peak_bytes": int(net.peak_bytes), "net_plan_peak_bytes": net.plans["train"].peak_bytes,
            "loss": loss, "equal": net.peak_bytes == result.best.peak_bytes == net.plans["train"].peak_bytes}

