"""The optimal policy recomputes joins (issue 15, part 2): an Eltwise's or a Concat's output
comes back in the backward from every root it reads, kept or recomputed first.

The program against brute force on the models of a small residual net and a small Concat
net (every combination of keeping and recomputing, with the windows, the early returns of
the roots a recomputation reads and the chains it may not recompute whole, as
optimal_model.py states them), and on random triggers; those semantics against the
Simulator (the realised plan never holds more than the model counts); the recompute
machinery's realisation of a chosen join against baseline's results bit for bit, plan equal
to run; the pass on both nets under tight budgets: within them, never slower than a
heuristic that fits, baseline's results."""

import itertools

import numpy as np
import pytest
from test_memory_passes import assert_same_results, check_copies, graph_of
from test_optimal import CPU, budgets, optimal_within_budget_and_fastest, same_algorithms

from superneuron.scheduler.allocator import aligned
from superneuron.scheduler.context import Context
from superneuron.scheduler.liveness import Roots, liveness
from superneuron.scheduler.lower import lower
from superneuron.scheduler.optimal_model import MIP_GAP, Model, Stash, build, solve
from superneuron.scheduler.optimal_rounds import realise
from superneuron.scheduler.recompute import recomputable_roots
from superneuron.scheduler.steps import MEMORY, Free

STEM = """\
name: t
input: {data: [2, 8, 8, 8], label: [2]}
layers:
  - {name: conv0, type: Convolution, bottom: data, top: conv0, num_output: 8, kernel_size: 1}
  - {name: bn0, type: BatchNorm, bottom: conv0, top: conv0}
  - {name: scale0, type: Scale, bottom: conv0, top: conv0, bias_term: true}
  - {name: relu0, type: ReLU, bottom: conv0, top: conv0}
"""
HEAD = """\
  - {name: pool, type: Pooling, bottom: %s, top: pool, pool: AVE, kernel_size: 8, stride: 8}
  - {name: fc, type: InnerProduct, bottom: pool, top: fc, num_output: 5}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
"""
# Three residual blocks, ResNet's basic block with one convolution (Caffe's in-place chains
# included): each block's output (an Eltwise, then a ReLU in place) is read by the next
# block's convolution's backward, and nothing else but the joins is cheap to recompute.
RESIDUAL = """\
name: t
input: {data: [2, 8, 8, 8], label: [2]}
layers:
  - {name: conv0, type: Convolution, bottom: data, top: conv0, num_output: 8, kernel_size: 3, pad: 1}
  - {name: relu0, type: ReLU, bottom: conv0, top: conv0}
""" + "".join(f"""\
  - {{name: c{i}, type: Convolution, bottom: {b}, top: c{i}, num_output: 8, kernel_size: 3, pad: 1}}
  - {{name: bn{i}, type: BatchNorm, bottom: c{i}, top: c{i}}}
  - {{name: scale{i}, type: Scale, bottom: c{i}, top: c{i}, bias_term: true}}
  - {{name: res{i}, type: Eltwise, bottom: [{b}, c{i}], top: res{i}, operation: SUM}}
  - {{name: res{i}_relu, type: ReLU, bottom: res{i}, top: res{i}}}
""" for i, b in ((1, "conv0"), (2, "res1"), (3, "res2"))) + HEAD % "res3"
# Two inception-like modules: two branches joined by a Concat, which the next module reads.
CONCAT = STEM + "".join(f"""\
  - {{name: in{i}_a, type: Convolution, bottom: {b}, top: in{i}_a, num_output: 4, kernel_size: 1}}
  - {{name: in{i}_a_relu, type: ReLU, bottom: in{i}_a, top: in{i}_a}}
  - {{name: in{i}_b, type: Convolution, bottom: {b}, top: in{i}_b, num_output: 4, kernel_size: 3, pad: 1}}
  - {{name: in{i}_b_relu, type: ReLU, bottom: in{i}_b, top: in{i}_b}}
  - {{name: in{i}, type: Concat, bottom: [in{i}_a, in{i}_b], top: in{i}}}
""" for i, b in ((1, "conv0"), (2, "in1"))) + HEAD % "in2"
NETS = {"residual": RESIDUAL, "concat": CONCAT}
JOINS = ("Eltwise", "Concat")


def join_roots(schedule):
    """The roots of ``schedule`` whose first writer is a join, that the optimal policy may
    recompute."""
    recomputable, _ = recomputable_roots(schedule, expensive=True, joins=True)
    graph = schedule.graph
    return {r for r, ws in recomputable.items() if graph.nodes[ws[0]].layer.type in JOINS}


# -- the program against brute force -------------------------------------------------------------

def model_of(text, joins=True, encodings=False):
    """The program's Model of ``text``'s net on the CPU cost model (``joins``: their outputs
    may be recomputed), without algorithm choices (each step on its fastest, counted in the
    fixed time), without swaps, without encodings unless asked (``encodings``), and with
    offload only for the stashes that cannot be recomputed when joins can, so that
    enumerating it stays small (and the Model without joins is the one with them less their
    recomputation)."""
    base = lower(graph_of(text))
    recomputable = {s.root for s in build(base, CPU).stashes if s.recompute_seconds is not None}
    m = build(base, CPU, joins=joins)
    m.fixed_seconds += sum(min(c.seconds) for c in m.choices)
    m.choices = []
    if not encodings:
        m.units = []
    for s in m.stashes:
        s.swap = None
        if s.root in recomputable:
            s.offload_seconds = None
    return m


def modelled(m, choice):
    """``(bytes live at each step, seconds)`` of Model ``m`` with ``choice`` (one of None,
    ``'rec'``, ``'off'`` per stash), or None where the program forbids it, with the
    semantics of optimal_model.py: a recomputed or offloaded stash is absent from a+1 to e-2;
    a freed stash whose trigger is active (every root of its chain recomputed, at a step
    before its own read) is back from that step less one to e-2; a stash no backward reads
    must be recomputed for an active trigger and is then there at that step less one; no
    chain of ``m.long_chains`` is recomputed whole."""
    recomputable = {k for k, s in enumerate(m.stashes) if s.recompute_seconds is not None}
    rec = {k for k, o in enumerate(choice) if o == "rec"}
    if any(set(chain) <= rec for chain in m.long_chains):
        return None
    live, seconds, steps = m.live + m.fixed_workspace, m.fixed_seconds, np.arange(m.n)
    for s, o in zip(m.stashes, choice, strict=True):
        active = [need for need, chain in s.triggers if set(chain) <= rec and set(chain) <= recomputable
                  and need < (m.n if s.e is None else s.e)]
        if o is not None:
            seconds += s.recompute_seconds if o == "rec" else s.offload_seconds
        if s.e is None:
            if active and o != "rec":
                return None
            for need in active:
                live = live + np.where(steps == need - 1, s.size, 0)
            continue
        if o is None:
            continue
        live = live - np.where((steps >= s.a + 1) & (steps <= s.e - 2), s.size, 0)
        if active:
            live = live + np.where((steps >= max(min(active) - 1, s.a + 1)) & (steps <= s.e - 2), s.size, 0)
    return live, seconds


def brute_force(m, cap):
    """``(least objective, its recomputed stash indices)`` of Model ``m`` under ``cap``, by
    enumeration of every stash's options (:func:`modelled`)."""
    options = [[None] + (["rec"] if s.recompute_seconds is not None else [])
               + (["off"] if s.offload_seconds is not None else []) for s in m.stashes]
    best = (None, None)
    for choice in itertools.product(*options):
        found = modelled(m, choice)
        if found is not None and found[0].max() <= cap and (best[0] is None or found[1] < best[0]):
            best = (found[1], {k for k, o in enumerate(choice) if o == "rec"})
    return best


def assert_solver_matches_brute_force(m, cap):
    """The solver's optimum of model ``m`` under ``cap`` is brute force's (or both find none);
    returns the stashes brute force's optimum recomputes (empty where none fits)."""
    best, rec = brute_force(m, cap)
    solution = solve(m, cap, 10.0, swaps=False)
    if best is None:
        assert solution.recompute is None, f"cap {cap}: brute force finds nothing, the solver does"
        return set()
    assert solution.recompute is not None, f"cap {cap}: the solver finds nothing, brute force {best}"
    assert solution.objective == pytest.approx(best, rel=1e-3, abs=1e-9), cap
    return rec


@pytest.mark.parametrize("name", sorted(NETS))
def test_the_program_finds_the_brute_force_optimum_with_joins(name):
    m = model_of(NETS[name])
    joins = {k for k, s in enumerate(m.stashes) if s.root in join_roots(lower(graph_of(NETS[name])))}
    assert joins and any(len(s.triggers) > 1 for s in m.stashes)  # the premise: joins, several paths
    peak = m.live.max()
    used_a_join = False
    for fraction in (1.0, 0.9, 0.8, 0.7, 0.6):
        used_a_join |= bool(assert_solver_matches_brute_force(m, int(peak * fraction)) & joins)
    assert used_a_join  # some budget's optimum recomputes a join: the option is exercised


def random_model(rng, n=14):
    """A random Model with what joins bring: stashes that come back early for several
    triggers (each a chain of recomputed stashes, as the paths up from a join's output
    are), one that no backward reads, and a chain that may not be recomputed whole."""
    turn, stashes = n // 2, []
    for k in range(6):
        a = int(rng.integers(0, turn - 2))
        e = None if k == 5 else int(rng.integers(turn + 2, n))
        stashes.append(Stash(f"t{k}", int(rng.integers(1, 9)) << 20, a, e,
                             recompute_seconds=float(rng.uniform(1, 5)) * 1e-3 if k else None,
                             offload_seconds=float(rng.uniform(2, 6)) * 1e-3 if k in (0, 1) and e else None))
    for k, s in enumerate(stashes):
        others = [j for j in range(1, 6) if j != k]
        for _ in range(int(rng.integers(1, 4))):
            need = int(rng.integers(turn + 1, (s.e or n) + 1))
            chain = tuple(int(j) for j in rng.choice(others, size=int(rng.integers(1, 3)), replace=False))
            s.triggers.append((need, chain))
    live = np.zeros(n)
    for s in stashes:
        live[s.a:(s.e if s.e is not None else s.a) + 1] += s.size
    live += rng.integers(1, 4, n) * (1 << 20)
    return Model(n, live, np.zeros(n), 0.01, stashes, [], 0, long_chains=[(1, 2)])


@pytest.mark.parametrize("seed", range(8))
def test_the_program_finds_the_brute_force_optimum_of_random_triggers(seed):
    m = random_model(np.random.default_rng(seed))
    peak = m.live.max()
    for fraction in (1.0, 0.85, 0.7, 0.55, 0.4):
        assert_solver_matches_brute_force(m, int(peak * fraction))


@pytest.mark.parametrize("name", sorted(NETS))
def test_the_model_never_counts_fewer_bytes_than_the_realised_plan_holds(name):
    """For every set of cheap layers' and joins' outputs recomputed that the program allows,
    the realised plan (Simulator) holds at no step more scheduled bytes than the model counts
    at the compute step it belongs to (a Recompute: the step before), workspace included:
    the budget the program meets is met. (It failed while a recomputed stash counted as
    absent up to the step right before its read.)"""
    graph = graph_of(NETS[name])
    base = lower(graph)
    m = build(base, CPU)
    recomputable, _ = recomputable_roots(base, expensive=True, joins=True)
    cheap = [k for k, s in enumerate(m.stashes)
             if s.recompute_seconds is not None and graph.nodes[recomputable[s.root][0]].layer.CHEAP]
    index = {(s.kind, s.node, s.tensor): i for i, s in enumerate(s for s in liveness(base).steps
                                                                 if s.kind not in MEMORY)}
    joins = set()
    for r in range(1, len(cheap) + 1):
        for subset in itertools.combinations(cheap, r):
            choice = ["rec" if k in subset else None for k in range(len(m.stashes))]
            found = modelled(m, choice)
            if found is None:
                continue  # the program forbids it
            plan = realise(base.replace(policy="optimal"), Context(model=CPU),
                           {m.stashes[k].root for k in subset}, set())
            at = 0
            for i, step in enumerate(plan.schedule.steps):
                if step.kind in MEMORY:
                    continue
                at = index.get((step.kind, step.node, step.tensor), at)
                # the step's workspace as realised (the program counts the one it chooses)
                workspace = aligned(plan.schedule.tensors[step.workspace].nbytes) if step.workspace else 0
                counted = found[0][at] - m.fixed_workspace[at] + (workspace if step.kind != "recompute" else 0)
                assert plan.plan.live[i] <= counted, (sorted(m.stashes[k].root for k in subset), step.describe(graph))
            joins |= {m.stashes[k].root for k in subset} & join_roots(base)
    assert joins  # the premise: recomputed joins were among the sets tried


# -- the realisation and the pass ----------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(NETS))
def test_a_recomputed_join_is_realised_with_baselines_results(name):
    """Every join recomputed, and the cheap layers' outputs it reads: each join's output is
    freed after the forward and written again after it by its Recompute, after those of its
    recomputed sources, and a backward reads it after; baseline's results bit for bit (the
    algorithms are baseline's), plan equal to run."""
    graph = graph_of(NETS[name])
    base = lower(graph).replace(policy="optimal")
    recomputable, source = recomputable_roots(base, expensive=True, joins=True)
    joins = join_roots(base)
    chosen = joins | {b for j in joins for b in source[j] if b in recomputable
                      and graph.nodes[recomputable[b][0]].layer.CHEAP}
    found = realise(base, Context(model=CPU), chosen, set())
    steps = [s for s in found.schedule.steps if s.kind in ("forward", "backward", "recompute")]
    recomputed = [graph.nodes[s.node] for s in steps if s.kind == "recompute"]
    assert ("Eltwise" if name == "residual" else "Concat") in {n.layer.type for n in recomputed}
    roots = Roots.of(found.schedule)
    for i, step in enumerate(steps):
        node = graph.nodes[step.node]
        if step.kind != "recompute" or node.layer.type not in JOINS:
            continue
        (top,) = {roots.scheduled(t) for t in node.tops}
        for b in {roots.scheduled(b) for b in node.bottoms} & chosen:  # its sources came back first
            assert any(s.kind == "recompute" and b in {roots.scheduled(t) for t in graph.nodes[s.node].tops}
                       for s in steps[:i]), (node.name, b)
        assert all(s.kind != "forward" for s in steps[i:]), node.name  # after the forward pass
        at = found.schedule.steps.index(step)
        assert Free(top) in found.schedule.steps[:at], node.name  # not kept from the forward
        assert any(s.kind == "backward" and top in roots.uses(s)[0] for s in steps[i + 1:]), node.name
    assert same_algorithms(found.schedule, graph)
    runtime = assert_same_results(graph, found.schedule, exact=True)[0]
    assert (runtime.peak_bytes, runtime.arena_bytes) == (found.plan.peak_bytes, found.plan.arena_bytes)


@pytest.mark.parametrize("name", sorted(NETS))
def test_optimal_with_joins_fits_tight_budgets_beats_the_heuristics_and_gives_baselines_results(name):
    graph = graph_of(NETS[name])
    levels, _ = budgets(graph)
    for budget in levels:
        schedule, plan, _ = optimal_within_budget_and_fastest(graph, budget)
        check_copies(schedule)
        runtime = assert_same_results(graph, schedule, exact=same_algorithms(schedule, graph))[0]
        assert (runtime.peak_bytes, runtime.arena_bytes) == (plan.peak_bytes, plan.arena_bytes)


def test_joins_lower_the_programs_optimum():
    """With joins' recomputation offered, the program's optimum is never above its optimum
    without (every plan of the one is a plan of the other; within the solver's gap), and
    below it on the residual net where only recomputing a block output keeps the cost down
    (the models of the brute-force test: recomputation or nothing where it applies)."""
    with_joins, without = model_of(RESIDUAL), model_of(RESIDUAL, joins=False)
    lower_somewhere = False
    for fraction in (0.9, 0.8, 0.7, 0.6):
        cap = int(with_joins.live.max() * fraction)
        a, b = solve(with_joins, cap, 10.0, swaps=False), solve(without, cap, 10.0, swaps=False)
        if b.objective is not None:
            assert a.objective is not None and a.objective <= b.objective * (1 + MIP_GAP), fraction
        lower = b.objective is None or a.objective < b.objective * (1 - MIP_GAP)
        lower_somewhere |= a.objective is not None and lower
    assert lower_somewhere


def test_the_solver_cannot_print_into_our_output(capfd):
    """What C++ code writes straight to descriptors 1 and 2 during a solve (HiGHS's stray
    debugging line) is dropped; what is printed before and after is not."""
    import os

    from superneuron.scheduler.optimal_model import silenced_output
    print("before", flush=True)
    with silenced_output():
        os.write(1, b"HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();\n")
        os.write(2, b"to stderr\n")
    print("after", flush=True)
    out, err = capfd.readouterr()
    assert out == "before\nafter\n" and err == ""
