"""The encode option of the optimal policy's program (optimal_model.py): Gist's encodings
(encode.py), one binary per *unit*, the encodings that stand or fall together (encode.units:
a max pooling's argmax with the ReLU output it relieves, which then keeps a 1-bit mask; any
other tensor form alone; fp16 only with ``--lossy fp16``).

A unit's effect is read off the schedule the encode pass makes of the net's liveness
schedule, not modelled anew: per compute step, the bytes of its roots live under liveness
less those of its roots and encoded forms live once encoded (an Encode counted at the step
before it, a Decode at the step after it, so an encoded form a step longer than it lives), as
change points the program's running sum of freed bytes takes. A coding step's workspace is
not counted, as a recomputation's is not: it lives at that step alone, which has no row of
its own (where the realised plan goes over, the program is solved again lower); its
cost, the Encode and Decode steps' time under the cost model (and what a Forward that writes
its layer's own form adds: CostModel.encoded_seconds). One encode pass and two
sweeps of the steps in all, whatever the number of units.

A unit excludes every other option of the roots it keeps in a tensor form (keep encoded, or
recompute, offload or swap them), and the recomputation of any root recomputed directly from
one of them: that Recompute would read the root after the turn, which a 1-bit mask cannot
serve (the encode pass would then not encode it). A root it only relieves of a reader (a
ReLU's output that the next convolution still reads whole, whose bottom gradient then takes
its memory: inplace.py) keeps its options: their windows end before that backward, where
what the unit frees begins.
"""

from dataclasses import dataclass

from ..options import PlanOptions
from .context import Context
from .encode import encode, units
from .liveness import Roots, intervals
from .steps import CODING, ENCODE, FORWARD, MEMORY, first_backward


@dataclass
class Unit:
    """Encodings chosen together: the direct forms of ``layers`` (node indices) and the tensor
    forms of ``roots`` (with the roots those layers relieve; ``encoded``: those of them kept in
    a tensor form or left with no reader, which no other option may take); ``seconds``: its Encode and
    Decode steps' time; ``freed``: ``[(compute step, change)]``, the bytes it frees from that
    step on change by ``change`` there (the sum of the changes up to a step is what it frees
    there; negative where the encoded forms add more than the roots give back)."""

    layers: frozenset
    roots: frozenset
    seconds: float
    freed: list
    encoded: frozenset = frozenset()


def units_of(schedule, steps, roots, model, lossy=()):
    """The :class:`Unit` of every encoding the encode pass would choose in ``schedule`` (a
    liveness schedule, with ``steps`` its compute steps and ``roots`` its Roots) under cost
    model ``model``, lossy forms ``lossy``."""
    context = Context(PlanOptions(lossy=tuple(lossy)), model)
    found = units(schedule, context)
    if not found:
        return []
    coded = encode(schedule, context, only=(frozenset().union(*(ls for ls, _ in found)),
                                            frozenset().union(*(rs for _, rs in found))))
    owner = {r: u for u, (_, rs) in enumerate(found) for r in rs}  # a root or an encoded form → its unit
    layer_of = {n: u for u, (layers, _) in enumerate(found) for n in layers}
    coded_steps = [s for s in coded.steps if s.kind not in MEMORY]
    at, seconds, encoded = _coding_costs(coded, coded_steps, len(found), owner, layer_of, model)
    assert len(coded_steps) == len(steps) + sum(s.kind in CODING for s in coded_steps), \
        "the encode pass adds coding steps only"
    events = [{} for _ in found]
    coded_roots = Roots.of(coded)
    turn = first_backward(coded_steps, len(coded_steps))
    read_after = {r for s in coded_steps[turn:] for r in coded_roots.uses(s)[0]}
    for u, (_, rs) in enumerate(found):  # roots no step reads whole after the turn: no stash is left
        encoded[u] |= {r for r in rs if r not in read_after}
    for r, a, b in intervals(coded, coded_steps, coded_roots):
        if r in owner:
            _add(events[owner[r]], at[a], at[b], coded_roots.size(r))
    for r, a, b in intervals(schedule, steps, roots):  # a root the encodings merged into one of theirs
        u = owner.get(coded_roots(r))                    # (a gradient over its bottom) counts as theirs
        if u is not None:
            _add(events[u], a, b, -roots.size(r))
    return [Unit(layers, rs, seconds[u], sorted((i, -v) for i, v in events[u].items() if v), frozenset(encoded[u]))
            for u, (layers, rs) in enumerate(found)]


def _coding_costs(coded, coded_steps, count, owner, layer_of, model):
    """``(at, seconds, encoded)`` of the ``count`` units in ``coded`` (the encode pass's
    schedule; ``coded_steps``, its steps but the memory ones): ``at``, each coded step's compute
    step in the schedule before the pass (an Encode's, the step it follows); ``seconds``, each
    unit's coding time; ``encoded``, each unit's roots that have a tensor form. Fills ``owner``
    (a root or an encoded form → its unit) with the encoded forms."""
    at, k = [], 0
    seconds, encoded = [0.0] * count, [set() for _ in range(count)]
    for s in coded_steps:
        if s.kind in CODING:
            u = owner[s.source] if s.source is not None else layer_of[s.node]  # a tensor's form, a layer's
            owner[s.tensor] = u
            if s.source is not None:
                encoded[u].add(s.source)
            seconds[u] += model.step_seconds(coded, s)
            at.append(k - 1 if s.kind == ENCODE else k)
        else:
            if s.kind == FORWARD and s.encoded is not None:  # a layer's form, in its forward's pass
                owner[s.encoded] = layer_of[s.node]
                seconds[layer_of[s.node]] += model.encoded_seconds(coded, s)
            at.append(k)
            k += 1
    return at, seconds, encoded


def _add(events, first, last, nbytes):
    """``nbytes`` live from step ``first`` to ``last``, as change points."""
    events[first] = events.get(first, 0) + nbytes
    events[last + 1] = events.get(last + 1, 0) - nbytes


def add_columns(m, columns, cost, ms):
    """One ``('enc', unit)`` column per unit of Model ``m``, its cost its time (``ms``: the
    program's seconds to its unit)."""
    for u, unit in enumerate(m.units):
        columns.append(("enc", u, None))
        cost.append(unit.seconds * ms)


def add_rows(m, columns, row, opening, mib):
    """The units' bytes freed, into the running sum's change points ``opening`` (``mib``: the
    program's bytes to its unit), and their exclusions (see the module's docstring)."""
    stash_of = {s.root: k for k, s in enumerate(m.stashes)}
    options, rec = {}, {}
    for j, (what, k, _) in enumerate(columns):
        if what in ("rec", "off", "swap"):
            options.setdefault(k, []).append(j)
        if what == "rec":
            rec[k] = j
    for j, (what, u, _) in enumerate(columns):
        if what != "enc":
            continue
        unit = m.units[u]
        for i, change in unit.freed:
            if i < m.n:
                opening.setdefault(i, []).append((j, change / mib))
        for r in unit.encoded:
            k = stash_of.get(r)
            if k is None:
                continue
            if options.get(k):
                row([(j, 1.0)] + [(o, 1.0) for o in options[k]], -float("inf"), 1.0)
            readers = {chain[-1] for _, chain in m.stashes[k].triggers if chain[-1] in rec}
            for c in readers:
                row([(j, 1.0), (rec[c], 1.0)], -float("inf"), 1.0)


def chosen(m, columns, x):
    """``(layers, roots)``: the union of the units solution ``x`` encodes (encode.py's
    ``only``)."""
    layers, roots = set(), set()
    for j, (what, u, _) in enumerate(columns):
        if what == "enc" and x[j] > 0.5:
            layers |= m.units[u].layers
            roots |= m.units[u].roots
    return frozenset(layers), frozenset(roots)
