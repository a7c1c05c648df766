"""Optimiser-state offload: the optimiser's state (momentum; Adam's two moments) lives in host
memory and comes to the device only around its parameter's update; and, where asked, the
parameters themselves from their update to their next forward.

Where each parameter is updated right after its Backward (update.py), a parameter's state is
read and written by one Update step an iteration, so keeping it resident holds as many bytes
as the parameters all iteration (98 MiB on ResNet-50 with SGD's momentum, twice that with
Adam) for a few steps of use. The pass moves the states worth moving (:func:`_movable`: not
the small ones, nor those updated too soon after the turn for their copy to hide) from the
device's resident region to ``host_resident`` and, around each such Update, inserts:

- ``Prefetch(s) [keep]`` :data:`SLACK` times its copy's time of compute before it (the host
  copy stays: it is the master), and ``Wait(s)`` right before it;
- ``Offload(s)`` right after it, into the host master (no new host place), and ``Wait(s)``
  as far after it; liveness frees the device copy there.

A parameter is read from its Forward to its Update, and then by nothing until the next
iteration's Forward: the last layers', updated first in the backward, sit idle on the device
through most of it, where an iteration under a tight budget peaks. With ``params``, the
parameters worth moving (:func:`_movable_params`: not the small ones, nor those whose copy
cannot run in the forward before them) come in ``SLACK`` times their copy's time ahead of
their first Forward and go out into their host master right after their Update, with the
state: one copy each way an iteration, in the forward where the link's host-to-device half
is idle and in the backward's other half, where the activations' copies are few.

The offload pass, which runs later, queues the activations' copies on the same streams, so a
plan's state and parameter copies are timed again once it has run (:func:`retime`).

The update itself runs on the device, as before, on the same values: the parameters after an
iteration are the same bits (the copies move bytes, nothing is computed on the host, unlike
parameter offload, params.py, whose host optimiser it does not need). The ``optimal`` and
``auto`` policies solve their program with the state moved where their plan with it resident
is slow (optimal.STATE_OVER), with the parameters too where that plan is still slow, and keep
the fastest; it applies where update.py's update in the backward does. A test schedule, which
shares the Runtime's resident layout, takes the training schedule's choice (:func:`like`).
"""

import bisect
import itertools
import weakref

from .liveness import liveness
from .params import prefetched, updates_on_host
from .placement import with_placement
from .steps import (
    ALLOC,
    COMMUNICATION,
    COPY,
    FORWARD,
    FREE,
    LAYER_STEPS,
    MEMORY,
    OFFLOAD,
    PREFETCH,
    UPDATE,
    WAIT,
    Offload,
    Prefetch,
    Wait,
    first_backward,
)
from .timeline import STALL

# How far ahead of its Update a state's copy in starts, and how long after it its copy out is
# waited for: this many times the copy's own time, in the cost model's compute time (at least
# one compute step), since the copies queue behind the offloaded activations' on the streams
# (ResNet-50's largest state, 9 MiB, takes 0.47 ms at 20 GB/s, more than its layer's Backward).
SLACK = 6.0
LOOKAHEAD = 4  # compute steps, without a cost model
# A state smaller than this stays resident: its copy would queue behind the activations'
# prefetches for a few KiB (a Scale's or a BatchNorm's: C floats), stalling the backward. On
# ResNet-50 the states over it are 94 % of the bytes.
SMALLEST = 1 << 20
FORWARD_TAIL = 0.1  # the share of the forward's end a state's copy in may run in (_movable)
# Rounds of retime at most: each moves the copies that its timeline saw waited for, and a wait
# removed brings the steps after it earlier, where the next copy in the queue may be waited for
# in turn (VGG-16 at 1/4, behind fc6's 392 MiB weight: x1.199 after 4 rounds, x1.121 after 8,
# x1.096 from 16 on, when none is left)
RETIME_ROUNDS = 32


def state_of(schedule, grads):
    """The optimiser's state tensors of the parameters of ``grads``, in slot order."""
    optimizer, param_of = schedule.optimizer, _params_of(schedule.graph)
    return [f"{param_of[g]}.{optimizer.state_name(j)}" for g in grads for j in range(optimizer.slots)]


_PARAMS_OF = weakref.WeakKeyDictionary()  # graph → {gradient: its parameter}


def _params_of(graph):
    found = _PARAMS_OF.get(graph)
    if found is None:
        found = _PARAMS_OF[graph] = {g: node.params[k] for node in graph.nodes for k, g in node.param_grads.items()}
    return found


def applies(schedule):
    """Whether ``schedule``'s parameters are updated one layer at a time in its backward (the
    training schedule of update.py's pass), with state to move."""
    return (schedule.optimizer is not None and schedule.optimizer.slots > 0
            and any(s.kind == UPDATE and s.grads for s in schedule.steps))


def offload_state(schedule, context=None, params=False):
    """The pass: see the module's docstring. The states it moves are those of every Update that
    names its gradients, of :data:`SMALLEST` bytes or more, whose copy in can run within the
    forward's tail and the backward before their update (:func:`_movable`); with ``params``,
    the parameters of :data:`SMALLEST` bytes or more whose copy in can run in the forward before
    their first use (:func:`_movable_params`) too."""
    if not applies(schedule):
        return schedule
    steps = [s for s in schedule.steps if s.kind not in MEMORY]
    compute = [i for i, s in enumerate(steps) if s.kind not in COPY + COMMUNICATION]
    model = getattr(context, "model", None)
    if model is None:  # steps, not seconds
        ends = {i: float(k) for k, i in enumerate(compute)}
        copy, span = (lambda nbytes: LOOKAHEAD), (lambda nbytes: LOOKAHEAD)
    else:
        ends = dict(zip(compute, itertools.accumulate(model.step_seconds(schedule, steps[i]) for i in compute)))
        copy, span = model.copy_seconds, (lambda nbytes: SLACK * model.copy_seconds(nbytes))
    rank = {i: k for k, i in enumerate(compute)}
    moved = _movable(schedule, steps, compute, ends, copy)
    firsts = _movable_params(schedule, steps, compute, rank, ends, copy) if params else {}
    if not moved and not firsts:
        return schedule
    tensors, param_of = schedule.tensors, _params_of(schedule.graph)

    def ahead(i, nbytes):  # the latest compute step that ends span(nbytes) before step i starts
        k = rank[i] - 1
        while k > 0 and ends[compute[rank[i] - 1]] - ends[compute[k - 1]] < span(nbytes):
            k -= 1
        return compute[max(k, 0)]

    def behind(i, nbytes):  # the first compute step that ends span(nbytes) after step i
        k = rank[i] + 1
        while k < len(compute) - 1 and ends[compute[k]] - ends[i] < span(nbytes):
            k += 1
        return compute[k] if k < len(compute) else i

    before, after = {}, {}
    for p, i in firsts.items():  # a parameter comes in ahead of its first use
        before.setdefault(ahead(i, tensors[p].nbytes), []).append(Prefetch(p, keep=True))
        before.setdefault(i, []).append(Wait(p))
    for i, step in enumerate(steps):
        if step.kind != UPDATE or not step.grads:
            continue
        state = [s for s in state_of(schedule, step.grads) if s in moved]
        if state:  # the state comes in ahead of its update
            nbytes = sum(tensors[s].nbytes for s in state)
            before.setdefault(ahead(i, nbytes), []).extend(Prefetch(s, keep=True) for s in state)
            before.setdefault(i, []).extend(Wait(s) for s in state)
        for written in (state, [param_of[g] for g in step.grads if param_of[g] in firsts]):
            if written:  # and what it wrote goes back to its host master after it
                after.setdefault(i, []).extend(Offload(t) for t in written)
                nbytes = sum(tensors[t].nbytes for t in written)
                after.setdefault(behind(i, nbytes), []).extend(Wait(t) for t in written)
    out = []
    for i, step in enumerate(steps):
        out += before.get(i, [])
        out.append(step)
        out += after.get(i, [])
    return liveness(_on_host(schedule, moved | set(firsts)).replace(out), context)


def _on_host(schedule, moved):
    """``schedule`` with the tensors of ``moved`` taken from its resident region to its host's."""
    return schedule.replace(resident=[t for t in schedule.resident if t not in moved],
                            host_resident=list(schedule.host_resident) + [t for t in schedule.resident if t in moved])


def _movable(schedule, steps, compute, ends, copy):
    """The states worth moving: those of :data:`SMALLEST` bytes or more whose copy in (``copy``
    of their bytes, ``ends``: each compute step's end) fits in the compute time from the last
    :data:`FORWARD_TAIL` of the forward to their Update. A state whose copy is longer (VGG-16's
    fc6: 392 MiB of momentum, 20 ms each way at 20 GB/s, updated first in the backward) would
    come in early in the forward and stay across the turn, beside the activations there, and
    its copies would crowd theirs on the link."""
    turn = first_backward(steps)
    if turn is None:
        return set()
    forward = [ends[i] for i in compute if i < turn]
    start = forward[-1] * (1 - FORWARD_TAIL) if forward else 0.0
    moved = set()
    for k, i in enumerate(compute):
        step = steps[i]
        if step.kind != UPDATE or not step.grads or k == 0:
            continue
        state = [s for s in state_of(schedule, step.grads) if schedule.tensors[s].nbytes >= SMALLEST]
        if state and ends[compute[k - 1]] - start >= copy(sum(schedule.tensors[s].nbytes for s in state)):
            moved.update(state)
    return moved


def _movable_params(schedule, steps, compute, rank, ends, copy):
    """``{parameter: the index of its first use}`` of the parameters worth moving: those of
    :data:`SMALLEST` bytes or more, updated by an Update that names their gradients after every
    step that reads them, whose copy in (``copy`` of their bytes) fits in the compute time
    before their first use, a Forward (``rank``: each compute step's place among them,
    ``ends``: its end)."""
    graph, tensors, param_of = schedule.graph, schedule.tensors, _params_of(schedule.graph)
    first, last, updated = {}, {}, {}
    for i, step in enumerate(steps):
        if step.kind in LAYER_STEPS:
            for p in graph.nodes[step.node].params.values():
                first.setdefault(p, i)
                last[p] = i
        elif step.kind == UPDATE:
            updated.update((param_of[g], i) for g in step.grads)
    return {p: i for p, i in first.items()
            if p in updated and updated[p] > last[p] and p in schedule.resident and tensors[p].nbytes >= SMALLEST
            and steps[i].kind == FORWARD and rank[i] > 0 and ends[compute[rank[i] - 1]] >= copy(tensors[p].nbytes)}


def like(schedule, trained):
    """``schedule`` (a test schedule, planned and placed) with the optimiser state and the
    parameters that ``trained`` keeps on the host moved there too: the two share the Runtime's
    resident layout. The test forward reads no state, and its planned offsets count from the
    resident region's end, so for the state nothing else moves; a parameter comes in before
    each step that reads it (params.py's copies), and the plan is placed again.
    ``schedule`` itself where there is nothing to move."""
    moved = {t for t in trained.host_resident
             if trained.tensors[t].kind in ("state", "param") and t in schedule.resident}
    if not moved:
        return schedule
    placed = _on_host(schedule, moved)
    params = {t for t in moved if schedule.tensors[t].kind == "param"}
    if not params:
        return placed
    copied = liveness(placed.replace(prefetched([s for s in placed.steps if s.kind not in MEMORY],
                                                placed.graph, params)))
    return with_placement(copied, "planned") if schedule.offsets is not None else copied


def retime(schedule, context=None):
    """The pass after the offload pass (optimal_rounds.py's realised plans): a state's or a moved
    parameter's copy in that the cost model's timeline waits for (it queued behind the
    activations' prefetches, which the offload pass added after this pass placed it) moved that
    much earlier, with its Alloc, and a copy out waited for moved that much later, with its
    Free, round after round while any is waited for, :data:`RETIME_ROUNDS` rounds at most. The
    steps' order is all that changes; the budget is the placement's to check."""
    model = getattr(context, "model", None)
    moved = {t for t in schedule.host_resident if schedule.tensors[t].kind in ("state", "param")}
    if model is None or not moved or not schedule.train or updates_on_host(schedule):
        return schedule
    steps = list(schedule.steps)
    for _ in range(RETIME_ROUNDS):
        timeline = model.timeline(schedule.replace(steps))
        stalls = {i: end - start for i, stream, start, end in timeline.spans
                  if stream == STALL and steps[i].kind == WAIT and steps[i].tensor in moved}
        if not stalls:
            break
        steps = _moved(steps, stalls, timeline.starts)
    return schedule.replace(steps)


def _moved(steps, stalls, starts):
    """``steps`` with the copies waited for at ``stalls`` (a Wait's index → the seconds it
    stalled) moved (see :func:`retime`); ``starts``: each step's start on the compute stream."""
    early, late, taken = {}, {}, set()  # step index → what goes before it, after it; what moves
    busy = MEMORY + COPY
    waited = {steps[w].tensor for w in stalls}
    of = {}  # tensor → the indices of its memory and copy steps
    for i, s in enumerate(steps):
        if s.tensor in waited and s.kind in busy:
            of.setdefault(s.tensor, []).append(i)
    for w, stalled in stalls.items():
        mine = of[steps[w].tensor]
        copy = max(i for i in mine if i < w and steps[i].kind in (PREFETCH, OFFLOAD))
        if steps[copy].kind == PREFETCH:  # in: its Alloc and Prefetch go that much earlier
            group = [i for i in mine if i <= copy]
            at = bisect.bisect_right(starts, starts[copy] - stalled, hi=copy) - 1  # starts never fall
            while at > 0 and steps[at].kind in busy:
                at -= 1
            at = max(at, 0)
            early.setdefault(_beside(steps, at, -1), []).extend(steps[i] for i in group)
        else:  # out: its Wait and Free go that much later
            group = [i for i in mine if i >= w]
            at = bisect.bisect_left(starts, starts[w] + stalled, lo=w)
            while at < len(steps) and steps[at].kind in busy:
                at += 1
            at = min(at, len(steps) - 1)
            late.setdefault(_beside(steps, at, 1), []).extend(steps[i] for i in group)
        taken.update(group)
    out = []
    for i, step in enumerate(steps):
        out += early.get(i, [])
        if i not in taken:
            out.append(step)
        out += late.get(i, [])
    return out


def _beside(steps, at, way):
    """The index past compute step ``at``'s own memory steps, its Allocs before it (``way``
    -1) or its Frees after it (1): a workspace's Alloc and Free stay right around its step
    (workspace.py rewrites them so)."""
    own = ALLOC if way < 0 else FREE
    while 0 <= at + way < len(steps) and steps[at + way].kind == own:
        at += way
    return at
