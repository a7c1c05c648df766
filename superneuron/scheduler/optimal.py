"""The ``optimal`` and ``auto`` policies: the fastest schedule that fits the budget, under the
cost model.

``optimal`` solves the mixed-integer program of optimal_model.py (which stashed tensors to
keep, keep encoded, offload or recompute, which algorithm each step runs) with HiGHS, within
work limits rather than a wall clock, so that the same net, options and budget give the same
plan on every run and machine (optimal_highs.py; the Context's ``solver_seconds``, where
given, is only a safety cap), and realises the answer with the machinery of the other
passes, so the Simulator and the Runtime run it unchanged and every guarantee of theirs holds
(plan equals run; baseline's losses bit for bit where the algorithms are baseline's and the
encodings lossless): recompute.py recomputes the chosen roots (each once), then in-place
reuse and liveness, encode.py keeps the chosen stashes encoded (Gist's forms; fp16 only with
``--lossy fp16``), offload.py copies the chosen roots out and back, and workspace.fit gives
each step the fastest algorithm that fits what the tensors leave (at least the solver's
choice, which fitted). optimal_rounds.py solves and realises each program, again under a lower
cap where the realised plan goes over (the program's memory model is not exact to the byte).

HiGHS through scipy takes no starting solution, so the heuristic policies (liveness,
recompute, offload, superneurons, gist) are planned under the same budget too, and the
fastest of all the plans that fit, by the cost model's timeline, wins: ``optimal`` is never
slower than ``superneurons`` or ``gist``. The Context's memo gets ``'optimal'``: the winner,
every candidate's estimate, the solver's status, objective, proven bound and gap, and its
time. A plan found under a smaller budget in the same process is a candidate too, so more
memory never gives a slower plan (optimal_monotone.py).

Every plan of both updates each parameter right after its Backward, its gradient's memory
free from then on, where the optimiser allows (update.py): the same bits, with the gradients
of one layer live at a time instead of all of them resident. Where the solver's plan is over
:data:`STATE_OVER` times liveness's time at full speed (or none fits), the program is solved
again with the optimiser's state on the host, copied to the device around each update
(state.py), so that its resident bytes are the parameters' alone, and the faster plan is kept
(ResNet-50 at a quarter of liveness's arena: x1.306 with the momentum resident, x1.111
without); where that plan is still over it, once more with the parameters on the host too,
from their update to their next forward (x1.097; VGG-16 at a quarter fits only so).

``auto``: liveness without a budget; under one, what ``optimal`` finds (liveness itself
where it fits at full speed, without solving anything; the best heuristic that fits when
the solver runs out of time).

With parameter offload (the Context's ``offload_params``: ``optimal+params``,
``auto+params``): every plan has its parameters, their gradients and the optimiser state on
the host (params.py): the heuristics are their presets with parameter offload, the program is
built from the schedule with its parameter copies in place (so its resident bytes are those
left on the device), and the solver's plan gets them right after its recomputations, as
``superneurons+params`` does.

The planner (policy.py) hands both passes ``presets``, a function ``(name, offload_params) →
passes`` that gives each heuristic's passes: this module plans with them and imports no list
of policies.
"""

import dataclasses

from ..errors import SNError
from ..options import PARAMS
from ..sizes import human_bytes
from . import optimal_monotone
from .liveness import liveness
from .optimal_rounds import placed, programs, relaxation_bound, solved, usable, weigh
from .simulate import simulate
from .state import applies as state_applies
from .state import offload_state
from .update import update_in_backward

# The incumbents: presets of policy.py whose plans the solver's must beat.
HEURISTICS = ("liveness", "recompute", "offload", "superneurons", "gist")
# Where the solver's plan with the optimiser's state resident is slower than this many times
# liveness's at full speed, the program with the state on the host is solved too, and the faster
# plan kept: moving the state frees its bytes for the activations but adds copies, and placing
# plans with them takes longer (ResNet-1001 at 1/3 of liveness's arena: x1.0589 in 111 s of CPU,
# against x1.0674 in 46 s with it resident; ResNet-50 at 1/4: x1.111 against x1.306).
STATE_OVER = 1.10
STATE_NAME = "solver with the state on the host"
PARAMS_NAME = "solver with the state and parameters on the host"
RUNGS = ("solver", STATE_NAME, PARAMS_NAME)  # the solver's programs, each moving more to the host


def optimal(schedule, context, presets):
    """The pass ``optimal``: see the module's docstring (``presets``: ``(name,
    offload_params) → passes``, the heuristics' passes). It takes the baseline schedule and
    ends placed, as every policy does. SNError when no plan fits the budget, naming the budget
    under which none of the solver's can (:func:`lowest_budget`) and the smallest under which a
    heuristic's does."""
    return _fastest(schedule, context, presets, solve_always=True)


def auto(schedule, context, presets):
    """The pass ``auto``: liveness without a budget, else :func:`optimal`'s choice."""
    return _fastest(schedule, context, presets, solve_always=False)


def _heuristic(name, schedule, context, presets):
    """The Candidate of heuristic ``name`` (a preset), with parameter offload where the
    Context has it (its name then shown with ``+params``)."""
    shown = name + (PARAMS if context.offload_params else "")
    return weigh(shown, schedule, context, presets(name, context.offload_params))


def _fastest(schedule, context, presets, solve_always):
    lowered, schedule = schedule, _prepared(schedule, context)
    info = {"winner": None, "candidates": {}, "solver": None,
            "update_in_backward": schedule is not lowered and schedule.train}
    context.memo["optimal"] = info
    live = _heuristic("liveness", schedule, context, presets)
    info["candidates"][live.name] = live.seconds if usable(live, context) else None
    if context.budget is None or not schedule.train:
        return _win(live, info, context, "no budget: liveness at full speed is the fastest")
    unbounded = _heuristic("liveness", schedule, context.with_options(budget=None), presets)
    if usable(live, context) and live.seconds <= unbounded.seconds:
        return _win(live, info, context, "liveness at full speed fits: nothing is faster")
    if usable(live, context) and not solve_always:
        return _win(live, info, context, None)
    best = [live] if usable(live, context) else []
    for name in HEURISTICS:
        if name != "liveness":
            found = placed(_heuristic(name, schedule, context, presets), context)
            info["candidates"][found.name] = found.seconds if usable(found, context) else None
            best += [found] if usable(found, context) else []
    found = _ladder(schedule, context, info, STATE_OVER * unbounded.seconds)
    best += [found] if found is not None and usable(found, context) else []
    key = optimal_monotone.key_of(schedule, context)
    smaller = optimal_monotone.SMALLER.best_under(key, context.budget)  # a smaller budget's plan fits this one
    if smaller is not None and smaller.context.model is context.model and usable(smaller, context):
        info["candidates"]["smaller budget"] = smaller.seconds
        best.append(dataclasses.replace(smaller, name="smaller budget"))
    if not best:
        floor = lowest_budget(lowered, context)
        under = ("" if floor is None else f"no plan of the solver's can fit under {human_bytes(floor)} (its "
                 "programs have no answer there, whatever they move to the host), and ")
        raise SNError(f"no schedule fits the budget of {human_bytes(context.budget)} (policy {schedule.policy}): "
                      f"{under}a heuristic's plan fits from {human_bytes(smallest_budget(schedule, context, presets))}")
    winner = min(best, key=lambda c: (c.seconds, c.plan.arena_bytes))
    optimal_monotone.SMALLER.keep(key, context.budget, winner)
    return _win(winner, info, context, None)


def _prepared(schedule, context):
    """The schedule whose plans ``optimal`` weighs, from the lowered one: each parameter updated
    right after its backward, where the optimiser allows (update.py; with parameter offload the
    host updates each as its gradient lands)."""
    return schedule if context.offload_params else update_in_backward(schedule, context)


def _ladder(schedule, context, info, over):
    """The solver's fastest plan (a Candidate), else its last, else None, over the rungs: the
    program as it is, then with the optimiser's state on the host, then with the parameters
    too (state.py), each solved only while no plan so far fits within ``over`` seconds. A rung
    whose relaxation's bound at the whole budget is already over ``over`` (no plan of it is
    within) goes after the rungs above it, with their best as its cutoff, so that where they
    beat it its programs end at their relaxations (ResNet-50 at 1.1 times its lower bound: 267
    s of planning to 36 s, to the same plan) and a plan within ``over`` stops the ladder as
    before: where the first rung has one, nothing changes. ``info`` (the pass's memo) takes
    each rung's estimate (None: none fits), the winning rung's solver figures and the bytes it
    moved, and the bounds of the rungs their cutoff ended."""
    later = []
    found = None
    for params in (None, False, True):
        if found is not None and usable(found, context) and found.seconds <= over:
            return found
        moved = schedule if params is None else _moved(schedule, context, params)
        if moved is None:
            continue
        models = programs(moved, context)
        bound = relaxation_bound(models, context)
        if params is not True and (bound is None or bound > over):
            later.append((params, moved, models, bound))
            continue
        found = _rung(moved, context, info, found, params, models, bound)
    for params, moved, models, bound in later:
        found = _rung(moved, context, info, found, params, models, bound, beat=found)
    return found


def _moved(schedule, context, params):
    """``schedule`` with the optimiser's state (and with ``params``, the parameters) on the
    host (state.offload_state), or None where nothing moves."""
    if context.offload_params or not state_applies(schedule):
        return None
    moved = offload_state(schedule, context, params=params)
    return None if moved is schedule else moved


def _rung(moved, context, info, found, params, models, bound, beat=None):
    """The faster of ``found`` (the ladder's plan so far, or None) and the solver's plan of
    ``moved``, the schedule of the rung ``params`` (None: as it is; False: the state on the
    host; True: the parameters too), whose Models are ``models`` and relaxation's bound
    ``bound``; ``beat``: a Candidate whose time no realised plan of this rung over is kept
    (its cutoff). ``info`` takes the rung's estimate (under ``"bounded"``, its bound, where
    nothing faster than ``beat`` came), and its solver's figures where it is faster (or the
    first)."""
    name = RUNGS[0 if params is None else 1 + params]
    mine = {"candidates": {}}
    limit = beat.seconds if beat is not None and usable(beat, context) else None
    answer = solved(moved, context, mine, models, limit)
    if answer is None or not usable(answer, context):
        if limit is not None and bound is not None:  # none faster than ``beat``: what is known is its bound
            info.setdefault("bounded", {})[name] = bound
        else:
            info["candidates"][name] = None
        if "solver" not in info:
            info["solver"] = mine["solver"]
        return found if found is not None else answer
    info["candidates"][name] = answer.seconds
    rank = (answer.seconds, RUNGS.index(name))  # at the same time, the rung that moves less
    if found is None or not usable(found, context) or rank < (found.seconds, RUNGS.index(found.name)):
        info["solver"] = mine["solver"]
        if params is not None:
            info["state_offloaded"] = sum(moved.tensors[t].nbytes for t in moved.host_resident)
        else:
            info.pop("state_offloaded", None)
        return dataclasses.replace(answer, name=name)
    return found


def _win(candidate, info, context, proven):
    """``candidate``'s schedule, noted in ``info`` as the winner (``proven``: why nothing can
    be faster, where that is known without the solver)."""
    info.update(winner=candidate.name, seconds=candidate.seconds, proven=proven)
    replayed = candidate.context.memo.get("replayed")
    if replayed is not None:
        context.memo["replayed"] = replayed
    return candidate.schedule


def lowest_budget(schedule, context):
    """A budget (bytes) under which no plan of the solver's fits: one byte over a budget under
    which the relaxation of each of its programs has no answer, within 1/4096 of liveness's
    arena of the smallest with one (a bisection of LPs; having one is monotone in the budget).
    Without a host memory limit, the program that moves the most to the host (the optimiser's
    state and the parameters, where the ladder moves them) is the loosest and alone is solved;
    with one, each rung's (moving more may not fit the host). ``schedule``: the baseline
    (lowered). None where no program has an answer even at liveness's arena."""
    schedule = _prepared(schedule, context)
    rungs = [_moved(schedule, context, True), _moved(schedule, context, False), schedule]
    rungs = [r for r in rungs if r is not None]
    floors = [_floor(programs(r, context), context, schedule) for r in rungs[:1 if context.host_memory is None else 3]]
    return min((f for f in floors if f is not None), default=None)


def _floor(models, context, schedule):
    """One byte over a budget under which ``models``' loosest relaxation has no answer, within
    1/4096 of the bisection's top (liveness's arena of ``schedule`` over the resident bytes);
    None where it has none there."""
    def answered(budget):
        return relaxation_bound(models, context.with_options(budget=budget)) is not None

    lo, hi = models[True].resident, simulate(liveness(schedule)).arena_bytes + models[True].resident
    if not answered(hi):
        return None
    step = max(hi >> 12, 1)
    while hi - lo > step:  # lo: no answer, hi: an answer
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if answered(mid) else (mid, hi)
    return lo + 1


def smallest_candidate_budget(schedule, context, presets):
    """The smallest budget (bytes) under which one of ``optimal``'s heuristic candidates fits:
    :func:`smallest_budget` of the schedule it weighs them on (``schedule``: the lowered one;
    :func:`_prepared`). The solver's own plans may fit under it, none under
    :func:`lowest_budget`."""
    return smallest_budget(_prepared(schedule, context), context, presets)


def smallest_budget(schedule, context, presets):
    """The smallest budget (bytes) under which one of the heuristic plans fits (a bisection
    between the resident bytes and liveness's arena; each probe plans superneurons and
    offload, the policies that go lowest; with parameter offload where ``context`` has it;
    ``presets``: as for :func:`optimal`), to within 1/4096 of it: a budget that fits, and no
    more than that above the smallest (deep nets plan for seconds: each probe counts).
    ``schedule``: as the heuristics plan it (the tradeoff's row), or as ``optimal`` weighs them
    (:func:`smallest_candidate_budget`)."""
    unbounded = _heuristic("liveness", schedule, context.with_options(budget=None), presets)
    lo, hi = unbounded.schedule.resident_bytes, unbounded.plan.arena_bytes

    def fits(budget):
        ctx = context.with_options(budget=budget)
        return any(usable(_heuristic(name, schedule, ctx, presets), ctx) for name in ("superneurons", "offload"))

    while hi - lo > hi >> 12:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    return hi
