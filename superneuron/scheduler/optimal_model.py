"""The optimal policy's mixed-integer program (MONeT's joint choice, Steiner et al. 2021, solved
by HiGHS through ``scipy.optimize.milp``): for a budget, which stashed tensors to keep, to
offload or to recompute, and which algorithm each step runs, so that the iteration's
estimated time is least and the bytes live at every step, workspace included, fit.

The model is read off the liveness schedule of the net (no in-place reuse: the realised
schedule gets it on top, which only frees more). Its compute steps are numbered 0..n-1, and:

- a *stash* is a data root used in the forward (last at step ``a``) and needed again in the
  backward (first at step ``e``: its first backward read, or the Recompute of a root computed
  from it, which comes before the backward of that root). Each stash has up to two options,
  binaries summing to at most 1 (neither: keep it):
  ``recompute`` (a single-input layer's output; recompute.py's chains, each root recomputed
  once, speed-centric): absent from steps a+1 .. e-1, costs its writers' forward time;
  ``offload`` (offload.py's copies, one step of lookahead): absent from a+1 .. e-2, costs the
  device→host copy, whose Wait comes right after it, and what of the host→device copy the
  step before ``e`` does not hide.
- a *choice* is a compute step whose layer offers algorithms: one binary per algorithm,
  summing to 1, with its time and its workspace, live at that step only.

Every step has one memory row: the bytes liveness keeps live there, less what the options
chosen free there, plus its workspace, at most the budget less the resident bytes. What the
options free at a step is carried by one continuous variable per step, ``D[i] = D[i-1] +
(bytes of options whose window opens at i) - (bytes of those whose window closed at i-1)``,
so the matrix has O(n + stashes + algorithms) nonzeros, not one per (stash, step) pair. It is
MONeT's segment structure: a stash is one window between its checkpoint's uses, and nothing
in the model is quadratic in the steps (Checkmate's n² recompute variables are not needed,
since the recompute machinery decides where a recomputation runs: right before its backward).

An ``encode`` option (Gist) is one more binary per stash: a window like keep's in which the
stash takes its encoded bytes rather than its own (the window's D entry adds ``size - encoded
size``), its time the Encode and Decode steps' cost; its row in the at-most-one constraint
with the others, and the realisation one more set handed to the encode pass.
"""

import time
from dataclasses import dataclass, field

import numpy as np

from ..allocator import aligned
from .cost import phase_of
from .liveness import Roots, intervals, liveness
from .recompute import recomputable_roots
from .steps import BACKWARD, LAYER_STEPS, MEMORY

MIB = float(1 << 20)   # the program counts bytes in MiB and seconds in milliseconds: HiGHS's
MS = 1e3               # tolerances are absolute, and bytes by the billion would lose them


@dataclass
class Stash:
    """A stashed root: ``size`` (arena bytes), its last forward use ``a``, its first backward
    need ``e`` (compute-step indices), and what recomputing (``recompute_seconds``) or
    offloading it (``offload_seconds``) costs, None where that option does not apply."""

    root: str
    size: int
    a: int
    e: int
    recompute_seconds: float = None
    offload_seconds: float = None


@dataclass
class Choice:
    """A compute step ``step`` (index) whose layer offers ``algos``, each with ``seconds`` and
    ``workspace`` (arena bytes)."""

    step: int
    algos: list
    seconds: list
    workspace: list


@dataclass
class Model:
    """What the program is built from (see the module's docstring): ``live`` (bytes live at
    each compute step under liveness, workspaces aside), ``fixed_workspace`` and
    ``fixed_seconds`` (of the steps without a choice), the stashes, the choices and the
    resident bytes."""

    n: int
    live: np.ndarray
    fixed_workspace: np.ndarray
    fixed_seconds: float
    stashes: list
    choices: list
    resident: int
    names: list = field(default_factory=list)


def build(schedule, model):
    """The :class:`Model` of ``schedule`` (a training schedule before any pass) under
    ``model`` (a cost.CostModel)."""
    live_schedule = liveness(schedule)
    roots = Roots.of(live_schedule)
    graph = schedule.graph
    steps = [s for s in live_schedule.steps if s.kind not in MEMORY]
    n = len(steps)
    live = np.zeros(n + 1)
    for r, a, b in intervals(live_schedule, steps, roots):
        live[a] += roots.size(r)
        live[b + 1] -= roots.size(r)
    live = np.cumsum(live)[:n]

    fastest = []   # each step's time with its fastest algorithm (the offload costs use it)
    fixed_ws, fixed_seconds, choices = np.zeros(n), 0.0, []
    for i, step in enumerate(steps):
        if step.kind in LAYER_STEPS:
            layer = graph.nodes[step.node].layer
            phase = phase_of(step)
            algos = model.algorithms(layer, phase)
            seconds = [model.algo_seconds(layer, phase, a) for a in algos]
            fastest.append(min(seconds))
            if len(algos) > 1:
                choices.append(Choice(i, algos, seconds, [aligned(a.workspace) for a in algos]))
                continue
            fixed_ws[i] = aligned(algos[0].workspace) if algos[0].workspace > 0 else 0
            fixed_seconds += seconds[0]
        else:
            fastest.append(model.step_seconds(live_schedule, step))
            fixed_seconds += fastest[-1]
    return Model(n, live, fixed_ws, fixed_seconds, _stashes(live_schedule, steps, roots, model, fastest),
                 choices, schedule.resident_bytes)


def _stashes(schedule, steps, roots, model, fastest):
    """The :class:`Stash` of every data root that lives across the forward/backward turn."""
    graph, tensors = schedule.graph, schedule.tensors
    turn = next((i for i, s in enumerate(steps) if s.kind == BACKWARD), len(steps))
    last_forward, first_backward = {}, {}
    for i, step in enumerate(steps):
        reads, writes = roots.uses(step)
        for r in reads + writes:
            if i < turn:
                last_forward[r] = i
            elif r in reads:
                first_backward.setdefault(r, i)
    recomputable, source = recomputable_roots(schedule, expensive=True)
    # A recomputable root is needed back when the first backward reading it, or any root
    # recomputed from it, runs (its Recompute comes right before): children come later in
    # the forward, so walk the roots in reverse forward order.
    need = dict(first_backward)
    for r in sorted(recomputable, key=lambda r: recomputable[r][0], reverse=True):
        s = source[r]
        if r in need:
            need[s] = min(need.get(s, need[r]), need[r])
    out = []
    for r, a in last_forward.items():
        e = need.get(r)
        info = tensors[r]
        if e is None or info.kind != "data" or e - a < 2:
            continue
        size = roots.size(r)
        stash = Stash(r, size, a, e)
        if r in recomputable:
            stash.recompute_seconds = sum(
                min(model.algo_seconds(graph.nodes[w].layer, "forward", al)
                    for al in model.algorithms(graph.nodes[w].layer, "forward"))
                for w in recomputable[r])
        if e - a >= 3:
            copy = model.copy_seconds(info.nbytes)
            stash.offload_seconds = copy + max(0.0, copy - fastest[e - 1])
        if stash.recompute_seconds is not None or stash.offload_seconds is not None:
            out.append(stash)
    return out


@dataclass
class Solution:
    """What the solver found: ``recompute`` and ``offload`` (sets of roots), ``algorithms``
    ({step index: algorithm name}), ``objective`` and ``dual_bound`` (seconds), ``gap`` (the
    proven relative gap), ``status`` (HiGHS's message), ``seconds`` (solving time); the sets
    are None when it found no schedule."""

    recompute: set
    offload: set
    algorithms: dict
    objective: float
    dual_bound: float
    gap: float
    status: str
    seconds: float


def solve(m, cap, time_limit, host_memory=None):
    """Solve the program of Model ``m`` with at most ``cap`` bytes live at any step besides the
    resident ones, the offloaded stashes' bytes within ``host_memory`` (None: unbounded), in
    at most ``time_limit`` seconds; a :class:`Solution`."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_array

    columns, cost = [], []   # column j: ("rec"|"off", stash index) or ("alg", choice, algo)
    for k, s in enumerate(m.stashes):
        if s.recompute_seconds is not None:
            columns.append(("rec", k, None))
            cost.append(s.recompute_seconds * MS)
        if s.offload_seconds is not None:
            columns.append(("off", k, None))
            cost.append(s.offload_seconds * MS)
    for c, choice in enumerate(m.choices):
        for a, seconds in enumerate(choice.seconds):
            columns.append(("alg", c, a))
            cost.append(seconds * MS)
    nx, n = len(columns), m.n
    d0 = nx  # D[i] is column d0 + i
    rows, cols, vals, lo, hi = [], [], [], [], []

    def row(entries, low, high):
        r = len(lo)
        for j, v in entries:
            rows.append(r)
            cols.append(j)
            vals.append(v)
        lo.append(low)
        hi.append(high)

    by_stash, opening, closing = {}, {}, {}
    for j, (what, k, _) in enumerate(columns):
        if what == "alg":
            continue
        by_stash.setdefault(k, []).append(j)
        s = m.stashes[k]
        end = s.e - 1 if what == "rec" else s.e - 2  # the last step it is absent from
        opening.setdefault(s.a + 1, []).append((j, s.size / MIB))
        closing.setdefault(end + 1, []).append((j, s.size / MIB))
    for js in by_stash.values():
        if len(js) > 1:
            row([(j, 1.0) for j in js], -np.inf, 1.0)
    by_choice = {}
    for j, (what, c, _) in enumerate(columns):
        if what == "alg":
            by_choice.setdefault(c, []).append(j)
    for js in by_choice.values():
        row([(j, 1.0) for j in js], 1.0, 1.0)
    for i in range(n):  # D[i] - D[i-1] - opening + closing = 0
        entries = [(d0 + i, 1.0)] + ([(d0 + i - 1, -1.0)] if i else [])
        entries += [(j, -v) for j, v in opening.get(i, ())] + [(j, v) for j, v in closing.get(i, ())]
        row(entries, 0.0, 0.0)
    workspace_of = {}
    for j, (what, c, a) in enumerate(columns):
        if what == "alg":
            workspace_of.setdefault(m.choices[c].step, []).append((j, m.choices[c].workspace[a] / MIB))
    room = (cap - m.live - m.fixed_workspace) / MIB
    for i in range(n):  # live - D[i] + workspace <= cap
        row([(d0 + i, -1.0)] + [(j, v) for j, v in workspace_of.get(i, ()) if v], -np.inf, room[i])
    if host_memory is not None:
        row([(j, m.stashes[k].size / MIB) for j, (what, k, _) in enumerate(columns) if what == "off"],
            -np.inf, host_memory / MIB)

    c = np.concatenate([np.array(cost, dtype=float), np.zeros(n)])
    integrality = np.concatenate([np.ones(nx), np.zeros(n)])
    bounds = Bounds(np.zeros(nx + n), np.concatenate([np.ones(nx), np.full(n, np.inf)]))
    matrix = coo_array((vals, (rows, cols)), shape=(len(lo), nx + n)).tocsr()
    start = time.perf_counter()
    res = milp(c, integrality=integrality, bounds=bounds,
               constraints=LinearConstraint(matrix, np.array(lo), np.array(hi)),
               options={"time_limit": max(time_limit, 0.01), "disp": False, "mip_rel_gap": 1e-3})
    seconds = time.perf_counter() - start
    base = m.fixed_seconds
    dual = getattr(res, "mip_dual_bound", None)
    dual = None if dual is None or not np.isfinite(dual) else base + dual / MS
    gap = getattr(res, "mip_gap", None)
    if res.x is None:
        return Solution(None, None, None, None, dual, None, res.message, seconds)
    x = res.x
    recompute = {m.stashes[k].root for j, (what, k, _) in enumerate(columns) if what == "rec" and x[j] > 0.5}
    offload = {m.stashes[k].root for j, (what, k, _) in enumerate(columns) if what == "off" and x[j] > 0.5}
    algorithms = {m.choices[c].step: m.choices[c].algos[a].name
                  for j, (what, c, a) in enumerate(columns) if what == "alg" and x[j] > 0.5}
    return Solution(recompute, offload, algorithms, base + res.fun / MS, dual,
                    None if gap is None or not np.isfinite(gap) else float(gap), res.message, seconds)
