"""The stashes of the optimal policy's program (optimal_model.py), read off a liveness
schedule: each data root live across the forward/backward turn (or one a recomputation
reads), its window, what recomputing, offloading or swapping it costs, and when it must come
back early for the recomputation of a root computed from it (its triggers: one per path up
from that root, a join having several).
"""

import bisect
import itertools
from dataclasses import dataclass, field

from .fuse import fusable
from .recompute import recomputable_roots
from .steps import BACKWARD

MAX_JOINS = 0  # joins past its first root on a chain of recomputed roots, at most (see _paths_up)


@dataclass
class Stash:
    """A stashed root: ``size`` (arena bytes), its last forward use ``a``, its first backward
    read ``e`` (compute-step indices; None: no backward reads it, it matters only to the
    recomputation of roots computed from it), and what recomputing (``recompute_seconds``) or
    offloading it (``offload_seconds``) costs, None where that option does not apply.
    ``swap``: ``(w, p)`` when it may be *swapped*, offloaded with copies that run ahead of the
    compute as far as their time needs (``copy_seconds`` each way), absent from w to p-1.
    ``triggers``: ``[(step, chain)]``, one per path up from a root recomputed from this one:
    when every root of ``chain`` (stash indices, that root first, then those between) is
    recomputed, this root must be on the device before ``step``, where that root's backward
    reads it."""

    root: str
    size: int
    a: int
    e: int
    recompute_seconds: float = None
    offload_seconds: float = None
    triggers: list = field(default_factory=list)
    swap: tuple = None           # (w, p): absent from w to p-1 when swapped (copies overlapped)
    copy_seconds: float = 0.0
    swap_with_encodings: bool = False  # the swap is offered to the programs with encodings alone


def stashes_of(schedule, steps, roots, model, fastest, joins):
    """``(stashes, long chains)``: the :class:`Stash` of every data root of ``schedule`` (a
    liveness schedule; ``steps``: its compute steps, ``fastest``: each one's time on its
    fastest algorithm under cost model ``model``) that lives across the forward/backward
    turn, or from which such a root may be recomputed (``joins``: a join's output too), and
    the chains of stash indices the program may not recompute whole (:func:`_paths_up`)."""
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
    starts = list(itertools.accumulate(fastest, initial=0.0))  # each step's start, in seconds
    recomputable, source = recomputable_roots(schedule, expensive=True, joins=joins)
    triggers, long_chains = _paths_up(recomputable, source, first_backward, last_forward)
    out, index = [], {}
    for r, a in last_forward.items():
        e = first_backward.get(r)
        info = tensors[r]
        if info.kind != "data" or (e is None and r not in triggers) or (e is not None and e - a < 2):
            continue
        stash = Stash(r, roots.size(r), a, e)
        if r in recomputable:
            writers = recomputable[r]
            stash.recompute_seconds = sum(
                model.fused_seconds(graph.nodes[w].layer) if k and fusable(graph, writers[k - 1], w, roots)
                else min(model.recompute_seconds(graph.nodes[w].layer, al)
                         for al in model.algorithms(graph.nodes[w].layer, "forward"))
                for k, w in enumerate(writers))
        if e is not None and e - a >= 3:
            copy = model.copy_seconds(info.nbytes)
            stash.offload_seconds = copy + max(0.0, copy - fastest[e - 1])
            w = bisect.bisect_left(starts, starts[a + 1] + copy, lo=a + 1)
            p = bisect.bisect_right(starts, starts[e] - copy, hi=e + 1) - 1
            # A swap for checkpoints, joins and roots that only an expensive layer (a
            # convolution) brings back: where the copy streams have room it costs less than
            # that recomputation (ResNet-50 at 1/3 on the H100 estimates: x1.106 against
            # x1.139). Not for the outputs of cheap layers alone, which cost a pass over
            # memory to recompute: each option more makes the program harder (offered those
            # too, ResNet-101 at 1/4 ran out of time and ended at x1.27 against x1.13). Those
            # recomputed from more bytes than their own (a strided pooling's output, from four
            # times its bytes) are offered a swap in the programs with encodings alone: there
            # GoogLeNet's at 1/3 went from x1.150 to x1.131, but offered it, ResNet-101's joins
            # program without encodings at 1/4 took 17 s instead of 7 and ran out of its share
            # (x1.256 against x1.112).
            dear = (r not in recomputable or len(source[r]) > 1  # to bring back by recomputation
                    or any(not graph.nodes[n].layer.CHEAP for n in recomputable[r]))
            if a < w < p < e and (dear or sum(roots.size(s) for s in source[r]) > roots.size(r)):
                stash.swap, stash.copy_seconds, stash.swap_with_encodings = (w, p), copy, not dear
        index[r] = len(out)
        out.append(stash)
    for stash in out:  # chains as stash indices; a root in a chain that is not a stash is kept
        stash.triggers = [(need, tuple(index[c] for c in chain)) for need, chain in triggers.get(stash.root, ())
                          if all(c in index for c in chain)]
    return out, [tuple(index[c] for c in chain) for chain in long_chains if all(c in index for c in chain)]


def _paths_up(recomputable, source, first_backward, last_forward):
    """``({root: [(step, chain)]}, [chain])``: walking up from each recomputable root a
    backward reads (at ``step``) along every path of the roots it is recomputed from (a join
    has several), the roots each path reaches, with the chain that leads there (that root
    first, then those between: when all of it is recomputed, the root reached must be back
    at ``step``); and the chains that reach a join past :data:`MAX_JOINS` others after
    their first root, which the program forbids to recompute whole, so that the paths, which
    double at each join, are followed through at most that many and none is missed.

    With none (the default), a recomputed join comes back from roots that are kept (or
    copied) or recomputed from such roots without a join between: a block's output from the
    block's own branch and the block before's output, itself a checkpoint. A chain of
    recomputed block outputs would bring back, speed-centric, at its first backward read,
    every block output along it, which saves little, and makes the program much harder
    (ResNet-50 at 1/3 of liveness's arena: solved in 4 s with none past the first; not
    solved to its gap in 20 s with one)."""
    triggers, long_chains = {}, set()
    for d in recomputable:
        need = first_backward.get(d)
        if need is None:
            continue
        paths = [((d,), 0)]  # the chain and the joins on it past its first root
        while paths:
            chain, joins = paths.pop()
            for r in source[chain[-1]]:
                if r not in last_forward or r in chain:
                    continue
                triggers.setdefault(r, {})[(need, chain)] = None
                if r not in recomputable:
                    continue
                through = joins + int(len(source[r]) > 1)
                if through <= MAX_JOINS:
                    paths.append((chain + (r,), through))
                else:
                    long_chains.add(chain + (r,))
    return {r: _undominated(found) for r, found in triggers.items()}, sorted(long_chains)


def _undominated(triggers):
    """``triggers`` (``(step, chain)`` pairs) less those that another makes redundant: one at
    an earlier or the same step whose chain is part of this one's (whenever this one fires,
    that one has, no later). A join's output is recomputed from all its sources: the paths
    to a root through one branch are redundant where another reaches it directly."""
    kept = []
    for need, chain in sorted(triggers, key=lambda t: (t[0], len(t[1]))):
        roots = set(chain)
        if not any(n <= need and set(c) <= roots for n, c in kept):
            kept.append((need, chain))
    return kept
