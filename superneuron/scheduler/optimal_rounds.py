"""The solver's rounds for the ``optimal`` policy (optimal.py): each program of :data:`PHASES`
solved with HiGHS (optimal_model.py), its answer realised with the machinery of the other
passes (:func:`realise`), so that the Simulator and the Runtime run it unchanged, and weighed
as a :class:`Candidate` by the cost model's timeline.

The program's memory model is conservative but not exact (a recomputation's or a coding
step's own workspace, the placement's holes): where the realised plan still goes over, the
program is solved again with the budget lowered by the excess (by half the first excess a
round where only the placement's holes went over), and once a plan fits, between that budget
and the lowest that did not, keeping the fastest that fits.
"""

import dataclasses
import time

from .encode import encode
from .fuse import fuse_recomputes
from .inplace import inplace
from .liveness import Roots, liveness
from .offload import LOOKAHEAD, offload_roots
from .optimal_model import MIP_GAP, builds, solve
from .params import offload_params
from .recompute import with_recomputes
from .simulate import simulate
from .state import retime
from .workspace import fit

ROUNDS = 8  # solves at most, each with the budget lowered by what the last plan went over
# Solves at most in all the programs together: the solver's work limit (with HiGHS's node
# limit, optimal_highs.py), which a wall clock is not, so that a plan is the same on every run
SOLVES = 12
HALVING_BYTES = 1 << 20  # the search between a cap that fits and one that does not stops this close
# A plan that fits but realises this much slower than its program says is probed under: a lower
# cap leaves the placement room for the workspaces the tensors squeezed (GoogLeNet at 1/3 of
# liveness's arena, a program with more swaps: x1.141 solved, x1.166 realised at the budget,
# x1.147 8 MiB under it)
REALISED_LOSS = 0.01
# The solver's programs, in order: (joins' outputs may be recomputed, swaps offered, encodings
# offered, the recomputations fixed to those of an earlier program's last plan, the part of
# the time cap, where one is given, by which it ends). The richest first: with the
# relaxation's integral part fixed (optimal_highs.py) joins' program solves in about a second
# where HiGHS alone took 20 s at its root (ResNet-152 at 1/3 of liveness's arena), and the
# plan it gives is the one to beat, so the rounds of the programs after it whose optimum is
# slower are not realised (their placement is most of a round's time): ResNet-152 at 1/3
# plans in 11 s of CPU time, not 32, to the same steps. Then it with encodings (GoogLeNet's
# best at 1/3, whose program has no plan without them); the quick program without swaps or
# joins, which every net solves to its gap in seconds; with swaps; with encodings too (only
# where the net has some: their plans compete with those before rather than replace them,
# since a plan with small encoded forms may leave the placement more holes); the last offers
# swaps alone on each earlier program's last recomputations (a plan a little over the budget
# may fit so, without the placement's holes of the plans before).
PHASES = ((True, True, False, False, 0.3), (True, True, True, False, 0.4), (False, False, False, False, 0.5),
          (False, True, False, False, 0.6), (False, True, True, False, 0.8), (True, True, False, True, 1.0))


@dataclasses.dataclass
class Candidate:
    """A plan considered: its ``name``, the placed ``schedule``, its Plan, its estimated
    ``seconds``, whether it ``fits`` and the ``context`` it was made under; the solver's
    plans: the roots it ``recomputed``."""

    name: str
    schedule: object
    plan: object
    seconds: float
    fits: bool
    context: object
    recomputed: set = dataclasses.field(default_factory=set)


def usable(candidate, context):
    """Whether ``candidate`` fits the budget of ``context`` and its host memory."""
    host = context.host_memory
    return candidate.fits and (host is None or candidate.plan.host_bytes <= host)


def weigh(name, schedule, context, passes):
    """Plan ``schedule`` with ``passes`` under a Context like ``context`` (its own memo) and
    weigh it; ``name``: what the Candidate is called."""
    context = dataclasses.replace(context, memo={})
    for apply in passes:
        schedule = apply(schedule, context)
    placed, replayed = context.memo.get("replayed", (None, None))
    plan = simulate(schedule, replayed if placed is schedule else None)
    return Candidate(name, schedule, plan, context.model.iteration_seconds(schedule), plan.fits(context.budget),
                     context)


def placed(candidate, context):
    """``candidate``, or where the dynamic allocator's holes lift its arena over the budget
    that its bytes live fit, the same steps at planned offsets (placement.py; the workspaces
    in the room the tensors leave: workspace.fit) when that arena is smaller: the schedule
    carries its offsets, which the Runtime follows."""
    if (candidate.fits or context.placement != "dynamic" or context.budget is None
            or candidate.plan.peak_bytes > context.budget):
        return candidate
    planned = dataclasses.replace(candidate.context.with_options(placement="planned"), memo={})
    placed = fit(candidate.schedule, planned, together=False)  # what fits so: many plans ask
    plan = simulate(placed)
    if plan.arena_bytes >= candidate.plan.arena_bytes:
        return candidate
    return dataclasses.replace(candidate, schedule=placed, plan=plan, fits=plan.fits(context.budget),
                               seconds=context.model.iteration_seconds(placed), context=planned)


def realise(schedule, context, recompute_roots, offload_roots_, swap_roots=(), encoded=None):
    """``schedule`` (the baseline) with ``recompute_roots`` recomputed, ``offload_roots_``
    offloaded with the offload pass's lookahead and ``swap_roots`` with copies that run as far
    ahead as they need (root names of the schedule before in-place reuse), the encodings of
    ``encoded`` (``(layers, roots)``, encode.py's ``only``; None: none) kept, by the other
    passes' machinery (parameter offload after the recomputations where ``context`` has
    ``offload_params``), then fitted and placed under ``context``."""
    def offloaded(s, ctx):
        roots = Roots.of(s)
        ahead = {roots(r): len(s.steps) for r in swap_roots}
        ahead.update({roots(r): LOOKAHEAD for r in offload_roots_})
        return offload_roots(s, ctx, ahead)

    def recomputed(s, ctx):
        return with_recomputes(s, ctx, only=recompute_roots)

    def kept_encoded(s, ctx):
        layers, roots = encoded
        names = Roots.of(s)  # the roots after in-place reuse
        return encode(s, ctx, only=(layers, {names(r) for r in roots}))

    passes = ((recomputed,) + ((offload_params,) if context.offload_params else ()) + (inplace, liveness)
              + ((kept_encoded,) if encoded and any(encoded) else ()) + (offloaded, retime, fuse_recomputes, fit))
    return weigh("solver", schedule, context, passes)


def programs(schedule, context):
    """The Models of the solver's programs for ``schedule`` (optimal_model.builds; with the
    parameter copies in place where ``context`` offloads them), by whether joins' outputs may
    be recomputed."""
    modelled = offload_params(schedule) if context.offload_params else schedule
    return builds(modelled, context.model, tuple(dict.fromkeys(p[0] for p in PHASES)), context.lossy)


def relaxation_bound(models, context):
    """The relaxation's bound (seconds) of the loosest of ``models``' programs (joins' outputs
    recomputed, swaps and encodings offered) under the whole budget: no plan of any of them is
    faster. None where even it has no answer."""
    loosest = models[True]
    cap = context.budget - loosest.resident
    if cap <= 0:  # the resident bytes alone are over the budget
        return None
    # a cutoff of 0 s: every answer is over it, so the solve ends at the relaxation, with its bound
    return solve(loosest, cap, None, context.host_memory, cutoff=0.0).dual_bound


def solved(schedule, context, info, models=None, beat=None):
    """The solver's best plan that fits (a Candidate), else its last, else None. The programs
    of :data:`PHASES` in turn (by its share of the time cap, where one is given), at most
    :data:`SOLVES` solves in all: with joins recomputed and swaps first, then with encodings,
    then without joins or swaps (a join's output comes back from several roots), with swaps,
    with encodings, then with swaps once for the recomputations of each earlier program's last
    plan, the fastest first, those roots still recomputed (HiGHS takes no starting point; this
    keeps the last programs small, and swaps may make room where a plan went a little over);
    each solved again with a lower cap while its realised plan goes over the budget (the model
    is not exact to the byte), and a round whose optimum is slower than the best plan so far
    not realised. ``models``: the programs' Models (:func:`programs`; None: built here);
    ``beat``: seconds that no plan kept may be over (None: none), from another rung's plan:
    every program's search drops the answers over it."""
    start = time.perf_counter()
    earlier = {}  # earlier: the recomputations of each program's last plan, by its time
    best, last, phases = None, None, []
    info["solver"] = solver = {"phases": phases}
    models = models or programs(schedule, context)
    for joins, swaps, encodings, fixed, share in PHASES:
        model = models[joins]
        until = None if context.solver_seconds is None else start + context.solver_seconds * share
        if encodings and not model.units:
            continue  # nothing to encode: it would be the program before
        if not encodings:
            model = dataclasses.replace(model, units=[])
        for recomputed in sorted(earlier, key=earlier.get) if fixed else [frozenset()]:
            limit = min((t for t in (beat, best and best.seconds) if t is not None), default=None)
            found = _rounds(schedule, context, model, (swaps, recomputed, joins), until, phases, limit, beat)
            phases[-1].update(encodings=encodings, fixed=bool(recomputed))  # fixed: a narrower program
            if found is None:
                continue
            last = found
            if not fixed:
                earlier.setdefault(frozenset(found.recomputed), found.seconds)
            if usable(found, context) and (best is None or found.seconds < best.seconds):
                best, solver["best"] = found, dict(phases[-1])
    solver["seconds"] = time.perf_counter() - start
    shown = solver.get("best") or next((p for p in reversed(phases) if p["rounds"]), phases[0])
    solver.update({k: shown.get(k) for k in ("status", "objective", "dual_bound", "gap")})
    solver["rounds"] = sum(p["rounds"] for p in phases)
    return best or last


def _rounds(schedule, context, model, offered, until, phases, beat=None, prune=None):
    """One program (``model``, with ``offered`` = (swaps offered, the roots of ``recomputed``
    recomputed, ``joins``))
    solved until its realised plan fits, at most :data:`ROUNDS` times, each with the cap
    lowered by what the last plan went over, then, once one fits, raised again halfway to the
    lowest cap that did not while rounds and time are left (:data:`HALVING_BYTES` apart at
    least), by ``until`` (a perf_counter time); its fastest realised plan that fits (a
    Candidate), else its last, or None. Notes the program in ``phases``. No answer over
    ``beat`` (seconds) is realised; ``prune`` (seconds: another rung's plan, optimal._ladder)
    is handed to the search itself (optimal_highs.py), which may change only where it is given.

    Realised plans go over where the program's count is not exact to the byte (the
    placement's holes above all), and how far is not smooth in the cap: GoogLeNet at 1/3
    went 5.9 MiB over at the top, 40 MiB over 3 MiB lower and fitted 4.5 MiB lower at x1.17;
    lowering by each excess in turn ended at x1.38. So where only the holes (the arena, not
    the bytes live) went over, the cap is lowered by half the first such excess a round, and
    the search between the caps that fit and those that did not keeps the fastest plan. Then,
    while the fastest plan that fit realises :data:`REALISED_LOSS` slower than its program
    said, caps further under are probed (1/64 of the budget under, then twice as far each
    time), until a program's optimum is no faster than the best realised plan."""
    swaps, recomputed, joins = offered
    phase = {"joins": joins, "swaps": swaps, "rounds": 0, "solves": []}
    solves = phase["solves"]  # each round's cap, objective, solving and realising seconds
    phases.append(phase)
    top = cap = context.budget - model.resident
    found = best = None
    fitted = failed = first_holes = None  # the highest cap whose plan fit, the lowest whose plan did not
    below = top // 64  # how far under the caps tried the next probe goes (doubling)
    for _ in range(ROUNDS):
        left = None if until is None else until - time.perf_counter()
        if (left is not None and left <= 0) or cap <= 0 or sum(p["rounds"] for p in phases) >= SOLVES:
            break
        # what the breaks below would throw away: no answer over it is realised
        limits = ([best[0].seconds] if best else []) + ([beat * (1 + MIP_GAP)] if beat is not None else [])
        solution = solve(model, cap, left, context.host_memory, swaps, recomputed,
                         cutoff=min(limits, default=None), prune=prune and prune * (1 + MIP_GAP))
        solves.append({"cap": int(cap), "objective": solution.objective, "bound": solution.dual_bound,
                       "seconds": solution.runs, "rens": solution.fixed, "nodes": solution.nodes})
        phase["nodes"] = phase.get("nodes", 0) + getattr(solution, "nodes", 0)
        phase.update(rounds=phase["rounds"] + 1, status=solution.status, objective=solution.objective,
                     dual_bound=solution.dual_bound, gap=solution.gap,
                     solve_seconds=phase.get("solve_seconds", 0.0) + solution.seconds)
        if solution.recompute is None or (best is not None and solution.objective >= best[0].seconds):
            break  # no plan, or none at this cap or under it can beat the best realised
        if beat is not None and solution.objective > beat * (1 + MIP_GAP):
            break  # nor an earlier program's best: realising it (seconds of placement) would not pay
        realised = time.perf_counter()
        found = placed(realise(schedule, context, solution.recompute, solution.offload, solution.swap,
                                solution.encode), context)
        realised = time.perf_counter() - realised
        found.recomputed = solution.recompute
        fits = usable(found, context)
        phase["realise_seconds"] = phase.get("realise_seconds", 0.0) + realised
        solves[-1].update(realise_seconds=round(realised, 2), realised=found.seconds, fits=fits)
        if fits and (best is None or found.seconds < best[0].seconds):
            best = found, solution
        shown, chosen = best or (found, solution)
        phase.update(recomputed=len(chosen.recompute), offloaded=len(chosen.offload), swapped=len(chosen.swap),
                     encoded=len(chosen.encode[0] | chosen.encode[1]), realised_seconds=shown.seconds,
                     fits=usable(shown, context))
        if fits:
            fitted = cap if fitted is None else max(fitted, cap)
        else:
            failed = cap if failed is None else min(failed, cap)
        if fitted is not None:  # halve the stretch between the caps that fit and did not
            if failed is not None and failed - fitted >= HALVING_BYTES:
                cap = (fitted + failed) // 2
                continue
            if best[0].seconds <= best[1].objective * (1 + REALISED_LOSS):
                break
            cap, below = min(cap, fitted) - below, 2 * below  # a probe: room to spare for the placement
            continue
        over = found.plan.arena_bytes - context.budget
        if found.plan.peak_bytes <= context.budget:
            first_holes = first_holes or over
            cap = min(cap - 1, top - first_holes * phase["rounds"] // 2)
        else:
            cap -= over
    return best[0] if best else found
