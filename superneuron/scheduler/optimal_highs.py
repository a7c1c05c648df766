"""HiGHS (through ``scipy.optimize.milp``) run so that the same program gives the same answer
on every run and every machine with the same HiGHS, and soon.

Deterministic: one thread, a fixed random seed, and no time limit unless the caller asks for
one as a safety cap (a solve that a wall clock ends depends on the machine's load). What
bounds the work instead is the program's own structure and a node limit.

Fast: the optimal policy's programs have tight relaxations (ResNet-152 at 1/3 of liveness's
arena: the relaxation's bound 129.138, the optimum 129.252, 0.09 % above), but HiGHS spends
most of a solve at the root separating cuts before its heuristics find a first solution
(21 s of a 22 s solve, on the 2-core machine). So the relaxation is solved first (an LP,
about a second); every integer column it leaves at 0 or 1 is fixed there and the few left
fractional are solved as a small program (RENS, Berthold 2014). Where that solution is within
``gap`` of the relaxation's bound (a bound on the whole program's optimum too), it is the
answer, with that gap proven; else, in a program of more than :data:`ONES_BINARIES` binaries
or where fixing the zeros too left no integer answer, only the columns at 1 are fixed, those
at 0 left free with the fractional ones, and solved again (in a smaller program its answer is
only kept, the whole program solved all the same; ResNet-1001 at 1/3 of liveness's
arena: the last program's 17 fractional binaries of 11 815 could not be completed so, and
with the zeros free a 0.3 % answer came in 0.3 s, where the whole program took 42 s to
0.002 %; ResNet-152 at 1.1 times its lower bound: 288 fractional of 1 910 could not, and the
whole program's search ended at its node limit 3 times over its bound; HiGHS on the whole
program stops at the same ``gap``); else the whole program is solved as before, and where
its search, ended by the node limit, ends on an answer worse than one of the fixed programs
gave, that one is kept.

A caller that would throw away any answer above a ``cutoff`` (the optimal policy: a round
whose optimum cannot beat the best plan realised so far) says so, and where the relaxation's
bound is already above it, nothing more is solved: no answer of the program could be kept,
so the outcome is the same, without the small and the whole programs (ResNet-1001 at 1/3 of
liveness's arena: the programs without joins, 130 s of solving, each skipped after its LP).
Where the relaxation is under the cutoff but the program's answers are not (a loose
relaxation), the search itself is told (``prune``, HiGHS's objective bound) where the caller
allows its search to change: ResNet-50 at 1.1 times its lower bound, with the state on the
host and a cutoff from the plan with the parameters moved too, 56 s of solving to 12.
"""

import time
import warnings
from dataclasses import dataclass, field, replace

import numpy as np

DETERMINISTIC = {"threads": 1, "random_seed": 0}  # HiGHS's options: the same search on every run
NODE_LIMIT = 200  # branch-and-bound nodes at most per program (HiGHS's mip_max_nodes): a work limit
INTEGRAL = 1e-6  # a relaxation's value this close to 0 or 1 is fixed there in the small program
# The ones alone are fixed in programs of more binaries than this (ResNet-1001's: 11 815); in
# smaller ones only where fixing the zeros too left no answer, and their answer is kept only
# where the whole program's is worse: a smaller whole program solves in seconds, to a closer
# answer than the ones' (ResNet-50 at 1/3 of liveness's arena: x1.0825 of liveness's time so,
# x1.0840 with the ones' answer; x1.0737 against x1.0799 after 2026-11-29)
ONES_BINARIES = 5000
# A relaxation's bound counts as above a cutoff only this far above (relative): HiGHS's answers
# meet their rows to a tolerance, so an integer answer may come out a hair under the bound
CUTOFF_MARGIN = 1e-6


@dataclass
class Result:
    """What a run found: ``x`` (None: no solution), ``fun`` (objective), ``bound`` (a proven
    lower bound of the program's optimum, None where unknown), ``gap`` (relative, proven),
    ``message`` (HiGHS's), ``nodes`` (branch-and-bound nodes), ``fixed`` (whether the answer
    came from the relaxation with its integral part fixed), ``seconds`` (of each HiGHS run:
    ``"relaxation"``, ``"small"``, ``"ones"`` (the zeros free too), ``"whole"``)."""

    x: np.ndarray
    fun: float
    bound: float
    gap: float
    message: str
    nodes: int
    fixed: bool = False
    seconds: dict = field(default_factory=dict)


def run(c, integrality, bounds, constraints, gap, time_limit=None, cutoff=None, prune=None):
    """Minimise ``c @ x`` with ``integrality`` (1: binary within its bounds), ``bounds = (lower,
    upper)``: lower <= x <= upper, and ``constraints`` (a LinearConstraint) to within the relative ``gap``; a
    :class:`Result`. ``time_limit``: a cap in seconds on each HiGHS run (None: none).
    ``cutoff``: where the relaxation's bound is above it, no answer (``x`` None, the bound
    given): the caller keeps none above it. ``prune``: HiGHS's objective bound, past the
    relaxation: its search drops every node whose bound is above it, so a program with no
    answer under it ends soon (its answer, if any, may then be above it); a caller that keeps
    nothing above it and can take a different search passes it (the search differs, so
    answers under it may too)."""
    from scipy.optimize import Bounds
    lower, upper = bounds
    box = Bounds(lower, upper)
    options = {"disp": False, "mip_rel_gap": gap, "node_limit": NODE_LIMIT, **DETERMINISTIC}
    if time_limit is not None:  # a safety cap: where it ends a solve, the answer may vary
        options["time_limit"] = max(time_limit, 0.01)
    seconds = {}
    relaxed = _milp(c, np.zeros_like(integrality), box, constraints, options, seconds,
                    "relaxation")
    if relaxed.x is None:  # infeasible (or capped): the whole program says which
        return _whole(c, integrality, box, constraints, options, seconds)
    if cutoff is not None and relaxed.fun > cutoff + CUTOFF_MARGIN * abs(cutoff):
        return Result(None, None, relaxed.fun, None, "the relaxation's bound is above the cutoff", 0,
                      seconds=seconds)
    if prune is not None:  # HiGHS prunes the nodes whose bound is over it
        options["objective_bound"] = prune
    x, binary = relaxed.x, integrality > 0
    ones = binary & (x >= 1 - INTEGRAL)
    bound = relaxed.fun
    kept, large = None, binary.sum() > ONES_BINARIES  # kept: the best answer of those programs
    for what, pinned in (("small", ones | (binary & (x <= INTEGRAL))), ("ones", ones)):
        if what == "ones" and kept is not None and not large:
            break  # the small program had an answer: the whole program solves closer than the ones'
        low, high = lower.copy(), upper.copy()
        low[pinned] = high[pinned] = np.round(x[pinned])
        res = _milp(c, integrality, Bounds(low, high), constraints, options, seconds, what)
        if res.x is None:
            continue
        found = _fixed(res, bound, seconds)
        if found.gap <= gap and (what == "small" or large):
            return found
        if kept is None or found.fun < kept.fun:
            kept = found
    whole = _whole(c, integrality, box, constraints, options, seconds)
    if prune is not None and whole.bound is not None and whole.bound > max(prune, bound):
        # a search that pruned at ``prune`` says its answer's value is its bound: what it
        # proved is that no answer is under ``prune``
        whole.bound = max(prune, bound)
        whole.gap = None if whole.x is None else _gap(whole.fun, whole.bound)
    if whole.bound is None or whole.bound < bound:
        whole.bound = bound
    if kept is not None and (whole.x is None or kept.fun < whole.fun):  # the whole search ended worse
        return replace(kept, bound=whole.bound, gap=_gap(kept.fun, whole.bound))
    return whole


def _gap(fun, bound):
    """The relative gap of an answer ``fun`` to a proven ``bound`` (0 where under it)."""
    return max(fun - bound, 0.0) / max(abs(fun), 1e-9)


def _fixed(res, bound, seconds):
    """The :class:`Result` of ``res``, a program with the relaxation's integral part fixed,
    against the proven ``bound``."""
    return Result(res.x, res.fun, bound, _gap(res.fun, bound), res.message, _nodes(res), fixed=True, seconds=seconds)


def _whole(c, integrality, box, constraints, options, seconds):
    """The whole program solved by HiGHS (a :class:`Result`; its time added to ``seconds``)."""
    res = _milp(c, integrality, box, constraints, options, seconds, "whole")
    bound = getattr(res, "mip_dual_bound", None)
    gap = getattr(res, "mip_gap", None)
    return Result(res.x, res.fun, None if bound is None or not np.isfinite(bound) else float(bound),
                  None if gap is None or not np.isfinite(gap) else float(gap), res.message, _nodes(res),
                  seconds=seconds)


def _milp(c, integrality, bounds, constraints, options, seconds, what):
    """HiGHS's answer, its time noted in ``seconds[what]``."""
    from scipy.optimize import milp
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # milp hands HiGHS's own options on, and says so
        res = milp(c, integrality=integrality, bounds=bounds, constraints=constraints, options=dict(options))
    seconds[what] = round(time.perf_counter() - start, 2)
    return res


def _nodes(res):
    return int(getattr(res, "mip_node_count", 0) or 0)
