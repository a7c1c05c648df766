"""The optimal policy's mixed-integer program (MONeT's joint choice, Steiner et al. 2021, solved
by HiGHS through ``scipy.optimize.milp``): for a budget, which stashed tensors to keep, to
offload or to recompute, and which algorithm each step runs, so that the iteration's
estimated time is least and the bytes live at every step, workspace included, fit.

The model is read off the liveness schedule of the net with its gradients in place (the
realised schedule gets the forward's in-place reuse on top, which only frees more). Its
compute steps are numbered 0..n-1, and:

- a *stash* is a data root used in the forward (last at step ``a``) and read again in the
  backward (first at step ``e``). Each stash has up to three options, binaries summing to
  at most 1 (none: keep it):
  ``recompute`` (a single-input layer's output, or a join's, Eltwise or Concat, from all the
  roots it reads; recompute.py's chains, each root recomputed once, speed-centric): absent
  from steps a+1 .. e-2 (it is recomputed between e-1 and e, beside what e-1 holds: the
  roots it is recomputed from are back there), costs its writers' forward time;
  ``offload`` (offload.py's copies, one step of lookahead): absent from a+1 .. e-2, costs the
  device→host copy, whose Wait comes right after it, and what of the host→device copy the
  step before ``e`` does not hide;
  ``swap`` (a stash whose copies fit its window and that only an expensive layer brings back,
  or, in a program with encodings, a source bigger than it: offload.py's copies, as far ahead
  as they need; optimal_stashes.py):
  absent from the step its copy is done to the step its copy back must start, costs a token
  share of the copies; one copy at a time per stream, so none queues and the window holds.
- a stash from which a chosen root is recomputed must be back before that root's backward:
  for each root recomputed from it (``triggers``, one per path up from that root: a join
  has several), when that root and every root between are recomputed, the stash is on the
  device from that step on (continuous presence variables per stretch between such steps,
  at least the AND of the binaries: see :func:`_triggers`). Paths are followed up to
  optimal_stashes.MAX_JOINS joins; a chain through more may not be recomputed whole
  (optimal_stashes.py).
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

An ``encode`` option (Gist) is one binary per group of encodings that stand or fall
together (optimal_encode.py: a max pooling's argmax with the ReLU mask it makes possible, or
one tensor form): what it frees at each step enters D as the other options' windows do, its
time is its Encode and Decode steps', it excludes the other options of its stashes, and the
realisation hands the chosen groups to the encode pass.
"""

import contextlib
import dataclasses
import itertools
import os
import sys
import time

import numpy as np

from . import optimal_encode, optimal_highs
from .allocator import aligned
from .cost import phase_of
from .inplace import inplace
from .liveness import Roots, intervals, liveness
from .optimal_stashes import Stash, stashes_of  # noqa: F401 (Stash: the program's input, as Model)
from .simulate import simulate
from .steps import LAYER_STEPS, MEMORY, first_backward

MIP_GAP = 0.005  # HiGHS stops once its solution is proven within this of the best
SWAP_COST = 0.02  # of a swap's copy time, its cost in the objective: copies that hide are not free
MIB = float(1 << 20)   # the program counts bytes in MiB and seconds in milliseconds: HiGHS's
MS = 1e3               # tolerances are absolute, and bytes by the billion would lose them


@dataclasses.dataclass
class Choice:
    """A compute step ``step`` (index) whose layer offers ``algos``, each with ``seconds`` and
    ``workspace`` (arena bytes)."""

    step: int
    algos: list
    seconds: list
    workspace: list


@dataclasses.dataclass
class Model:
    """What the program is built from (see the module's docstring): ``live`` (bytes live at
    each compute step under liveness, workspaces aside), ``fixed_workspace`` and
    ``fixed_seconds`` (of the steps without a choice), the stashes, the choices and the
    resident bytes; ``long_chains``: chains of stash indices (recomputable roots, each
    recomputed from the next) that may not all be recomputed (see optimal_stashes.py);
    ``units``: the encodings that may be chosen (optimal_encode.Unit); ``host_fixed``: the
    host bytes taken whatever the choices (parameter offload's: params.py)."""

    n: int
    live: np.ndarray
    fixed_workspace: np.ndarray
    fixed_seconds: float
    stashes: list
    choices: list
    resident: int
    forward_seconds: float = 0.0
    backward_seconds: float = 0.0
    names: list = dataclasses.field(default_factory=list)
    long_chains: list = dataclasses.field(default_factory=list)
    units: list = dataclasses.field(default_factory=list)
    host_fixed: int = 0


def build(schedule, model, joins=True, lossy=()):
    """The :class:`Model` of ``schedule`` (a training schedule before any pass) under
    ``model`` (a cost.CostModel); ``joins``: joins' outputs may be recomputed too; ``lossy``:
    the lossy encodings that may be chosen besides the lossless ones."""
    return builds(schedule, model, (joins,), lossy)[joins]


def builds(schedule, model, joins=(True, False), lossy=()):
    """``{j: build(schedule, model, j, lossy) for j in joins}``, what the Models share (the
    liveness schedule, the bytes live, the choices, the encodings: ResNet-1001's took 4 s of
    each build) made once."""
    live_schedule = liveness(inplace(schedule, grads_only=True))
    roots = Roots.of(live_schedule)
    graph = schedule.graph
    steps = [s for s in live_schedule.steps if s.kind not in MEMORY]
    n = len(steps)
    live = np.zeros(n + 1)
    for r, a, b in intervals(live_schedule, steps, roots):
        if schedule.tensors[r].kind == "workspace":  # the lowered steps' own: the choices count them
            continue
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
        else:  # an Update (its workspace: the optimiser's scratch), a coding or a copy step
            fastest.append(model.step_seconds(live_schedule, step))
            fixed_seconds += fastest[-1]
            if step.workspace and roots.scheduled(step.workspace):
                fixed_ws[i] = roots.size(step.workspace)
    turn = first_backward(steps, n)
    shared = Model(n, live, fixed_ws, fixed_seconds, [], choices, schedule.resident_bytes,
                   sum(fastest[:turn]), sum(fastest[turn:]),
                   units=optimal_encode.units_of(live_schedule, steps, roots, model, lossy),
                   host_fixed=simulate(live_schedule).host_bytes if schedule.host_resident else 0)
    models = {}
    for j in joins:
        stashes, long_chains = stashes_of(live_schedule, steps, roots, model, fastest, j)
        models[j] = dataclasses.replace(shared, stashes=stashes, long_chains=long_chains)
    return models


@dataclasses.dataclass
class Solution:
    """What the solver found: ``recompute``, ``offload`` and ``swap`` (sets of roots), ``algorithms``
    ({step index: algorithm name}), ``objective`` and ``dual_bound`` (seconds), ``gap`` (the
    proven relative gap), ``status`` (HiGHS's message), ``seconds`` (solving time), ``nodes``
    (branch-and-bound nodes), ``fixed`` (whether the relaxation with its integral part fixed
    gave it: optimal_highs.py), ``runs`` (the seconds of each HiGHS run); the sets
    are None when it found no schedule. ``encode``: ``(layers, roots)``, the encodings chosen
    (encode.py's ``only``)."""

    recompute: set
    offload: set
    swap: set
    algorithms: dict
    objective: float
    dual_bound: float
    gap: float
    status: str
    seconds: float
    encode: tuple = (frozenset(), frozenset())
    nodes: int = 0
    fixed: bool = False
    runs: dict = dataclasses.field(default_factory=dict)


def solve(m, cap, time_limit=None, host_memory=None, swaps=True, recomputed=(), cutoff=None, prune=None):
    """Solve the program of Model ``m`` with at most ``cap`` bytes live at any step besides the
    resident ones, the offloaded stashes' bytes within ``host_memory`` less ``m.host_fixed``
    (None: unbounded); a :class:`Solution`, the same on every run (optimal_highs.py: one
    thread, a fixed seed, at most optimal_highs.NODE_LIMIT branch-and-bound nodes).
    ``time_limit``: a safety cap in seconds (None: none; a solve it ends may differ between
    runs). ``swaps``: offer the swap option (a harder program: its copies' streams are
    constrained too). ``recomputed``: roots that must be recomputed (an earlier solution's:
    the program left is much smaller). ``cutoff`` (seconds): where the program's relaxation
    shows that no answer is faster, none (the sets None, the bound given; optimal_highs.py).
    ``prune`` (seconds): the search drops the answers over it (optimal_highs.py's ``prune``)."""
    from scipy.optimize import LinearConstraint
    from scipy.sparse import coo_array

    columns, cost = [], []  # column j: ("rec"|"off", stash), ("alg", choice, algo), ("presence", stash, tile)
    for k, s in enumerate(m.stashes):
        if s.recompute_seconds is not None:
            columns.append(("rec", k, None))
            cost.append(s.recompute_seconds * MS)
        if s.offload_seconds is not None:
            columns.append(("off", k, None))
            cost.append(s.offload_seconds * MS)
        if s.swap is not None and swaps and (m.units or not s.swap_with_encodings):  # hidden by the compute
            # where the streams keep up: a token cost (some only with encodings: optimal_stashes.py)
            columns.append(("swap", k, None))
            cost.append(SWAP_COST * s.copy_seconds * MS)
    for c, choice in enumerate(m.choices):
        for a, seconds in enumerate(choice.seconds):
            columns.append(("alg", c, a))
            cost.append(seconds * MS)
    optimal_encode.add_columns(m, columns, cost, MS)
    n = m.n
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
        if what in ("alg", "enc") or m.stashes[k].e is None:  # no backward reads it: it frees nothing
            continue
        by_stash.setdefault(k, []).append(j)
        s = m.stashes[k]
        first, end = s.a + 1, s.e - 2  # the steps it is absent from
        if what == "swap":
            first, end = s.swap[0], s.swap[1] - 1
        opening.setdefault(first, []).append((j, s.size / MIB))
        closing.setdefault(end + 1, []).append((j, s.size / MIB))
    for js in by_stash.values():
        if len(js) > 1:
            row([(j, 1.0) for j in js], -np.inf, 1.0)
    rec_of = {k: j for j, (what, k, _) in enumerate(columns) if what == "rec"}
    for chain in m.long_chains:  # never all of a chain past MAX_JOINS joins recomputed
        if all(k in rec_of for k in chain):
            row([(rec_of[k], 1.0) for k in chain], -np.inf, len(chain) - 1.0)
    nx = _triggers(m, columns, cost, row, opening, closing)
    optimal_encode.add_rows(m, columns, row, opening, MIB)
    d0 = nx  # D[i] is column d0 + i
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
        row([(j, m.stashes[k].size / MIB) for j, (what, k, _) in enumerate(columns) if what in ("off", "swap")],
            -np.inf, (host_memory - m.host_fixed) / MIB)
    # One copy at a time on each stream: the swaps' copies never queue, so each ends when the
    # model says (the offload pass times them so) and its window holds; nor does an offload's
    # (which the compute waits for at once, where it is issued and the step before its read):
    # queued behind a swap's, its stall would be that copy's too, and the swap's window late.
    on_stream = {}
    for j, (what, k, _) in enumerate(columns):
        if what == "swap":
            s = m.stashes[k]
            w, p = s.swap
            for i in itertools.chain(range(s.a + 1, w), range(p, s.e)):  # device→host, then host→device
                on_stream.setdefault(("d2h" if i < w and i > s.a else "h2d", i), []).append(j)
    for j, (what, k, _) in enumerate(columns):
        if what == "off":  # its copies' steps, where a swap's copy runs
            s = m.stashes[k]
            for key in (("d2h", s.a + 1), ("h2d", s.e - 1)):
                if key in on_stream:
                    on_stream[key].append(j)
    for js in on_stream.values():
        if len(js) > 1:
            row([(j, 1.0) for j in js], -np.inf, 1.0)

    c = np.concatenate([np.array(cost, dtype=float), np.zeros(n)])
    integrality = np.concatenate([[0.0 if what == "presence" else 1.0 for what, _, _ in columns], np.zeros(n)])
    # D[i] is free in sign: a stash brought back early for a recomputation adds bytes
    lower = [1.0 if what == "rec" and m.stashes[k].root in recomputed else 0.0 for what, k, _ in columns]
    matrix = coo_array((vals, (rows, cols)), shape=(len(lo), nx + n)).tocsr()
    start = time.perf_counter()
    with silenced_output():
        res = optimal_highs.run(c, integrality, (np.concatenate([lower, np.full(n, -np.inf)]),
                                                 np.concatenate([np.ones(nx), np.full(n, np.inf)])),
                                LinearConstraint(matrix, np.array(lo), np.array(hi)), MIP_GAP,
                                time_limit,
                                None if cutoff is None else (cutoff - m.fixed_seconds) * MS,
                                None if prune is None else (prune - m.fixed_seconds) * MS)
    seconds = time.perf_counter() - start
    base = m.fixed_seconds
    dual = None if res.bound is None else base + res.bound / MS
    if res.x is None:
        return Solution(None, None, None, None, None, dual, None, res.message, seconds, nodes=res.nodes,
                        runs=res.seconds)
    x = res.x
    recompute = {m.stashes[k].root for j, (what, k, _) in enumerate(columns) if what == "rec" and x[j] > 0.5}
    offload = {m.stashes[k].root for j, (what, k, _) in enumerate(columns) if what == "off" and x[j] > 0.5}
    swap = {m.stashes[k].root for j, (what, k, _) in enumerate(columns) if what == "swap" and x[j] > 0.5}
    algorithms = {m.choices[c].step: m.choices[c].algos[a].name
                  for j, (what, c, a) in enumerate(columns) if what == "alg" and x[j] > 0.5}
    return Solution(recompute, offload, swap, algorithms, base + res.fun / MS, dual, res.gap, res.message, seconds,
                    optimal_encode.chosen(m, columns, x), res.nodes, res.fixed, res.seconds)


def _triggers(m, columns, cost, row, opening, closing):
    """Add the rows and columns that bring a stash back early for the recomputation of a
    root computed from it (Stash.triggers); the number of columns before the D[i] ones.

    A stash freed (recomputed or offloaded) whose triggers are active is on the device from
    the earliest active trigger's step (less one: a Prefetch comes a step ahead) to its own
    read: the steps between its triggers' steps are tiles, and tile k has a continuous
    presence ``p_k`` in [0, 1] with ``p_k >= (recompute binaries of the chain) + freed - len(chain)``
    for every trigger at the tile's first step and ``p_k >= p_{k-1}``, the tile before, so
    for every trigger at or before it (the least it can be is 1 exactly when one is active),
    its bytes added over the tile. A stash that no backward reads (``e`` None) must
    be recomputed for an active trigger (it frees nothing otherwise) and is then on the
    device at the trigger's step; where it cannot be recomputed, the trigger may not fire."""
    rec = {k: j for j, (what, k, _) in enumerate(columns) if what == "rec"}
    off = {}
    for j, (what, k, _) in enumerate(columns):
        if what in ("off", "swap"):
            off.setdefault(k, []).append(j)
    for k, s in enumerate(m.stashes):
        live_chains = []
        for need, chain in s.triggers:
            if need >= (s.e if s.e is not None else m.n) or any(c not in rec for c in chain):
                continue  # later than its own read, or through a root that is never recomputed
            live_chains.append((need, [rec[c] for c in chain]))
        if not live_chains:
            continue
        if s.e is None:
            for need, chain in live_chains:
                if k in rec:  # x_rec[k] >= AND(chain)
                    row([(rec[k], 1.0)] + [(j, -1.0) for j in chain], 1.0 - len(chain), np.inf)
                    at = need - 1
                    j = len(columns)
                    columns.append(("presence", k, at))
                    cost.append(0.0)
                    row([(j, 1.0)] + [(c, -1.0) for c in chain], 1.0 - len(chain), np.inf)
                    opening.setdefault(at, []).append((j, -s.size / MIB))
                    closing.setdefault(at + 1, []).append((j, -s.size / MIB))
                else:
                    row([(j, 1.0) for j in chain], -np.inf, len(chain) - 1.0)
            continue
        freed = ([rec[k]] if k in rec else []) + off.get(k, [])
        bounds = sorted({need for need, _ in live_chains} | {s.e}, reverse=True)
        later = None  # the presence of the tile after this one, which is at least this one's
        for upper, lower in zip(bounds, bounds[1:]):  # the tile of steps lower-1 .. upper-2
            j = len(columns)
            columns.append(("presence", k, lower))
            cost.append(0.0)
            if later is not None:
                row([(later, 1.0), (j, -1.0)], 0.0, np.inf)
            later = j
            for need, chain in live_chains:
                if need == lower:  # and, through the rows above, every later tile
                    row([(j, 1.0)] + [(c, -1.0) for c in chain] + [(f, -1.0) for f in freed],
                        -float(len(chain)), np.inf)
            start, end = max(lower - 1, s.a + 1), upper - 2
            if start <= end:
                opening.setdefault(start, []).append((j, -s.size / MIB))
                closing.setdefault(end + 1, []).append((j, -s.size / MIB))
    return len(columns)


@contextlib.contextmanager
def silenced_output():
    """The process's standard output and error (file descriptors 1 and 2) sent to the null
    device while the block runs: HiGHS (SciPy 1.17's) at times prints a line of its own
    debugging (``HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();``)
    straight to the descriptor, ``disp`` off or not, into sn-plan's and sn-train's output. The
    solver's outcome comes back in its result, so nothing a user needs is lost."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(fd) for fd in (1, 2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            os.dup2(null, fd)
        yield
    finally:
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)
        os.close(null)
