"""Dynamic convolution workspace (SuperNeurons, Wang et al. 2018): each compute step runs the
fastest algorithm whose workspace fits the memory free at that step.

Workspaces get only what tensors leave. At a step, the bytes free are the budget less the
resident bytes and the scheduled bytes live there (the step's own workspace aside), so the
chosen workspace never lifts the peak over the budget when a smaller algorithm would have
fitted. Without a budget every step gets its fastest algorithm. ``limit`` caps any one
workspace where the layer offers a choice (Caffe's ``--workspace-limit``); the workspace of a
layer with a single algorithm is part of that layer, not a choice, and is left alone. An
algorithm the cost model leaves out (a measured table's float64 check rejected it) is never
chosen, and a step lowered with it is moved to one the model keeps.

The pass runs after liveness and before placement. It rewrites a step's ``algo`` and its
workspace tensor (a new TensorInfo of the chosen size, allocated right before the step and
freed right after it, or none when the algorithm needs none), so the Simulator and the
Runtime simply follow it. Algorithms are ranked by the cost model (scheduler/cost.py).
One sweep over the steps: linear in their number.
"""

import dataclasses
import functools

from ..errors import SNError
from ..sizes import human_bytes
from .allocator import aligned
from .cost import as_model, phase_of
from .liveness import Roots
from .placement import place, tensors_first, with_placement
from .schedule import add_workspace
from .simulate import Replayer
from .steps import ALLOC, LAYER_STEPS, MEMORY, Alloc, Free, with_algorithm
from .walk import Tally, Walker

CHOOSING = LAYER_STEPS  # compute steps whose layer has algorithms


class _LiveAtSteps(Walker):
    """Walks a schedule counting the scheduled bytes live (:class:`walk.Tally`), workspaces
    aside: ``at``, ``{step index: those bytes at that compute step}`` for the steps that
    choose an algorithm."""

    def __init__(self, tensors):
        self.tally, self.at, self.index = Tally(), {}, 0
        super().__init__(tensors, self.tally)

    def run(self, schedule):
        methods = self.methods
        for i, step in enumerate(schedule.steps):
            self.index = i
            methods[step.kind](self, step)
        return self

    def alloc(self, step):
        if self.tensors[step.tensor].kind != "workspace":
            self.device.alloc(step.tensor, aligned(self.tensors[step.tensor].nbytes))

    def _choosing(self, step):
        self.at[self.index] = self.tally.live

    forward = backward = recompute = _choosing


def live_at_steps(schedule):
    """``{step index: scheduled bytes live at that compute step, workspaces aside}``."""
    return _LiveAtSteps(schedule.tensors).run(schedule).at


def choose(algos, seconds, room=None, limit=None):
    """The fastest of ``algos`` (``seconds(algo)``; ties keep the given order) whose workspace
    is at most ``limit`` and, aligned, at most ``room`` bytes (None: no bound); when none fits
    the room, the one with the smallest workspace under the limit; None when none is under it."""
    allowed = [a for a in algos if limit is None or a.workspace <= limit]
    if not allowed:
        return None
    fits = [a for a in allowed if room is None or aligned(a.workspace) <= room]
    if not fits:
        return min(allowed, key=lambda a: a.workspace)
    return min(fits, key=seconds)


def choose_workspaces(schedule, budget=None, limit=None, costs=None, caps=None):
    """``schedule`` with each compute step's algorithm and workspace chosen to fit ``budget``
    (bytes, resident included; None: the fastest), each workspace at most ``limit`` bytes where
    the layer has a choice. ``costs``: a cost.CostModel, a measured table, or None (estimates).
    ``caps``: ``{k: bytes}``, a tighter room for the k-th compute step (see :func:`fit`).
    SNError when no algorithm of a step is within the limit."""
    return _Chooser(schedule, budget, limit, costs).choose(caps)


class _Chooser:
    """:func:`choose_workspaces` on one schedule, budget, limit and cost model, each step's
    choice made once: a step's choice depends only on the bytes live at it (workspaces aside)
    and its own cap, so the retries of :func:`fit`, each of which caps one more step, choose
    again for the capped steps alone."""

    def __init__(self, schedule, budget=None, limit=None, costs=None):
        self.schedule, self.limit = schedule, limit
        self.model = model = as_model(costs)
        graph = schedule.graph
        live = live_at_steps(schedule)
        free_at = None if budget is None else budget - schedule.resident_bytes
        self.choices = []  # (step index, compute step number, step, layer, phase, algos, room, algo)
        k = -1
        for i, step in enumerate(schedule.steps):
            if step.kind in MEMORY:
                continue
            k += 1
            if step.kind not in CHOOSING:
                continue
            layer = graph.nodes[step.node].layer
            phase = phase_of(step)
            algos = model.algorithms(layer, phase)
            if len(algos) < 2 and algos[0].name == step.algorithm:  # else the model rejected the step's
                continue
            room = None if free_at is None else free_at - live[i]
            algo = choose(algos, functools.partial(model.algo_seconds, layer, phase), room, limit)
            if algo is None:
                small = min(algos, key=lambda a: a.workspace)
                raise SNError(f"{step.describe(graph).split(' [')[0]}: no algorithm fits the workspace limit "
                              f"{human_bytes(limit)} (smallest: {small.name}, {human_bytes(small.workspace)})")
            self.choices.append((i, k, step, layer, phase, algos, room, algo))

    def least(self, schedule):
        """``{k: bytes}``: the least workspace the k-th compute step of ``schedule`` (one of
        :meth:`choose`'s) can run with, for each that has one: its algorithms' smallest where
        it has a choice, else its own."""
        smallest = {k: aligned(min(a.workspace for a in algos)) for _, k, _, _, _, algos, _, _ in self.choices}
        out, k = {}, -1
        for step in schedule.steps:
            if step.kind in MEMORY:
                continue
            k += 1
            if step.workspace:
                out[k] = smallest.get(k, aligned(schedule.tensors[step.workspace].nbytes))
        return out

    def lost(self, rooms):
        """The seconds the steps lose where ``rooms`` (``{k: (offset, bytes)}``, the k-th
        compute step's room) holds a smaller workspace than the one chosen under the budget:
        the fastest algorithm that fits each room against that one."""
        out = 0.0
        for _, k, _, layer, phase, algos, _, algo in self.choices:
            if k in rooms and aligned(algo.workspace) > rooms[k][1]:
                seconds = functools.partial(self.model.algo_seconds, layer, phase)
                fits = choose(algos, seconds, rooms[k][1], self.limit)
                out += seconds(fits) - seconds(algo)
        return out

    def choose(self, caps=None):
        """The schedule with the algorithms chosen, under ``caps`` (as choose_workspaces)."""
        schedule, caps = self.schedule, caps or {}
        tensors = dict(schedule.tensors)
        changed = {}  # step index → (new step, old workspace)
        for i, k, step, layer, phase, algos, room, algo in self.choices:
            if k in caps:
                room = caps[k] if room is None else min(room, caps[k])
                algo = choose(algos, functools.partial(self.model.algo_seconds, layer, phase), room, self.limit)
            ws = step.workspace
            if algo.name == step.algorithm and (tensors[ws].nbytes if ws else 0) == algo.workspace:
                continue
            name = None
            if algo.workspace > 0:
                name = add_workspace(tensors, f"ws:{layer.name}:{step.kind}:{algo.name}", algo.workspace)
            changed[i] = (with_algorithm(step, algo.name, name), ws)
        if not changed:
            return schedule
        out = schedule.replace(_rewrite(list(schedule.steps), changed), tensors=tensors)
        Roots.derive(out, schedule)  # the same tensors and workspaces: share what steps use
        return out


def smallest_workspaces(schedule, costs=None):
    """``schedule`` with every step on its algorithm of smallest workspace: what tensors alone
    need, since workspaces get only what tensors leave (the offload pass sizes by it).
    ``costs``: as for :func:`choose_workspaces`."""
    return choose_workspaces(schedule, budget=schedule.resident_bytes, costs=costs)


TRIES = 8  # how many times fit() gives a smaller workspace to the step whose Alloc crossed


def fit(schedule, context, together=True):
    """The pass that ends every policy: :func:`choose_workspaces` under the Context's budget,
    workspace limit and cost model, then placement (placement.place, by the Context's
    placement). One entry, since the workspaces fit the bytes live under the budget, but the
    dynamic allocator's holes may still lift the arena over it: then the workspace whose
    Alloc crossed the budget gets a smaller algorithm, and again, :data:`TRIES` times at most.
    With the dynamic allocator each try replays on from the Alloc that crossed (what comes
    before it is the same). With planned placement under a budget, where the tensors and
    workspaces placed together (as without a budget; first only if ``together``) go over, the
    tensors are placed first and every workspace gets at most the room they leave at its
    step, where it goes (:func:`_in_rooms`: a workspace chosen to fill what the tensors
    leave, placed among them, leaves holes they cannot use). The Context's memo gets
    ``memo['replayed'] = (schedule returned, its whole replay)`` for simulate() where one was
    made."""
    budget, placement, memo, tries = context.budget, context.placement, context.memo, TRIES
    chooser, caps = _Chooser(schedule, budget, context.workspace_limit, context.model), {}
    if budget is None:
        return place(chooser.choose(caps), context)

    def placed_under(caps):
        chosen = chooser.choose(caps)
        if rooms:
            return _in_rooms(chosen, chooser, caps, budget - chosen.resident_bytes)
        return place(chosen, context)

    rooms = placement == "planned" and not together  # the tensors placed first, the workspaces in their rooms
    placed = placed_under(caps)
    replayer, start = Replayer(placed), 0
    while True:
        stop = replayer.run(placed, start, stop=lambda a: a.high_water > budget)
        if stop is None:
            memo["replayed"] = (placed, replayer.arena)  # a whole replay: simulate() need not make it again
            return placed
        step = placed.steps[stop]
        if placement == "planned" and not rooms:  # over with the workspaces among the tensors
            rooms = True
            placed = placed_under(caps)
            replayer, start = Replayer(placed), 0
            continue
        if step.kind != ALLOC or placed.tensors[step.tensor].kind != "workspace":
            return placed  # a tensor overflowed: no workspace to blame
        k = sum(s.kind not in MEMORY for s in placed.steps[:stop])  # the step it serves
        caps[k] = aligned(placed.tensors[step.tensor].nbytes) - 1
        tries -= 1
        placed = placed_under(caps)
        if placement == "dynamic":  # the steps before ``stop`` are the same: go on from there
            replayer.take_back(stop, step)
            start = stop
        else:  # planned offsets change with any lifetime: start over
            replayer, start = Replayer(placed), 0
        if tries == 0:
            replayer.run(placed, start)
            memo["replayed"] = (placed, replayer.arena)
            return placed


def _in_rooms(chosen, chooser, caps, limit):
    """``chosen`` (``chooser``'s schedule under ``caps``) at planned offsets: its tensors placed
    first, each step's workspace capped (in ``caps``, updated) to the largest gap they leave
    at it within ``limit`` bytes, and put in that gap (placement.tensors_first)."""
    offsets, rooms = tensors_first(chosen, limit, chooser.least(chosen), chooser.lost)
    for k, (_, room) in rooms.items():
        caps[k] = min(caps.get(k, room), room)
    chosen = chooser.choose(caps)
    top = max((off + aligned(chosen.tensors[name].nbytes) for name, offs in offsets.items() for off in offs),
              default=0)  # above every tensor: where a workspace its room cannot hold goes
    k = -1
    for step in chosen.steps:
        if step.kind not in MEMORY:
            k += 1
        elif step.kind == ALLOC and chosen.tensors[step.tensor].kind == "workspace":
            if k + 1 not in rooms:  # a workspace where the tensors' plan had none: plan it all
                return with_placement(chosen, "planned")
            at, room = rooms[k + 1]  # it serves the next step
            offsets.setdefault(step.tensor, []).append(at if aligned(chosen.tensors[step.tensor].nbytes) <= room
                                                       else top)
    return dataclasses.replace(chosen, offsets=offsets)


def _rewrite(steps, changed):
    """The steps with each changed compute step put in, its old workspace's Alloc (among the
    memory steps just before it) and Free (just after) dropped and the new one's put right
    around it."""
    drop = set()
    for i, (_, old) in changed.items():
        if old is None:
            continue
        j = i - 1
        while j >= 0 and steps[j].kind in MEMORY and steps[j] != Alloc(old):
            j -= 1
        k = i + 1
        while k < len(steps) and steps[k].kind in MEMORY and steps[k] != Free(old):
            k += 1
        assert steps[j] == Alloc(old) and steps[k] == Free(old), f"workspace '{old}' outlives its step"
        drop.update((j, k))
    out = []
    for i, step in enumerate(steps):
        if i in drop:
            continue
        if i in changed:
            new = changed[i][0]
            if new.workspace:
                out += [Alloc(new.workspace), new, Free(new.workspace)]
            else:
                out.append(new)
        else:
            out.append(step)
    return out
