"""The optimal policy's encode option (issue 15, part 2; scheduler/optimal_encode.py): per
group of Gist's encodings (a max pooling's argmax with the 1-bit mask of the ReLU output it
relieves), keep the stashes encoded, at the Encode and Decode steps' cost.

On a net of conv → ReLU → max pooling blocks, under the H100 estimates (copies 75 times
slower than a pass over memory, so encoding beats offloading, and recomputing a 64-channel
convolution costs more than encoding its output), at a budget liveness does not fit: the
solver keeps stashes encoded, fits, is no slower than any heuristic that fits (gist among
them), is faster than the same program without the encode option, and its plan, realised by
the encode pass restricted to its choice, runs baseline's losses and gradients bit for bit
with plan equal to run."""

import itertools

import numpy as np
import pytest
from test_encode import RELU_POOL, encoded
from test_memory_passes import assert_same_results, check_copies, graph_of
from test_optimal import optimal_within_budget_and_fastest, planned
from test_optimal_joins import model_of, modelled

from superneuron.errors import SNError
from superneuron.graph.tensors import storage_root
from superneuron.layers.conv import Convolution
from superneuron.scheduler import optimal_encode
from superneuron.scheduler.cost import CostModel
from superneuron.scheduler.encode import encode, units
from superneuron.scheduler.liveness import liveness
from superneuron.scheduler.lower import lower
from superneuron.scheduler.optimal_model import build, solve

GPU = CostModel("gpu")

ORIGINAL_ALGORITHMS = Convolution._algorithms


def conv_relu_pool(blocks=4, channels=64, side=8, batch=4):
    """``blocks`` of 1x1 convolution → ReLU (in place) → 3x3 max pooling (stride 1, so every
    map has one size), then an inner product and the loss."""
    return graph_of(conv_relu_pool_text(blocks, channels, side, batch))


def conv_relu_pool_text(blocks, channels, side, batch):
    """The YAML of :func:`conv_relu_pool`."""
    layers, bottom = [], "data"
    for i in range(1, blocks + 1):
        layers += [f"  - {{name: conv{i}, type: Convolution, bottom: {bottom}, top: conv{i}, num_output: {channels}, "
                   "kernel_size: 1}",
                   f"  - {{name: relu{i}, type: ReLU, bottom: conv{i}, top: conv{i}}}",
                   f"  - {{name: pool{i}, type: Pooling, bottom: conv{i}, top: pool{i}, pool: MAX, kernel_size: 3, "
                   "stride: 1, pad: 1}"]
        bottom = f"pool{i}"
    return (f"name: crp\ninput: {{data: [{batch}, {channels}, {side}, {side}], label: [{batch}]}}\n"
            "layers:\n" + "\n".join(layers) + f"""
  - {{name: fc, type: InnerProduct, bottom: {bottom}, top: fc, num_output: 10}}
  - {{name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}}
""")


def test_optimal_keeps_stashes_encoded_where_that_is_the_cheapest_way_to_fit(monkeypatch):
    graph = conv_relu_pool()
    # baseline's algorithms alone, so that the bits below are baseline's (the program trades
    # im2col's workspace for the chunked algorithm's time where it may, which rounds otherwise)
    monkeypatch.setattr(Convolution, "_algorithms", lambda layer, outputs: ORIGINAL_ALGORITHMS(layer, outputs)[:1])
    budget = planned(graph, "liveness", None, model=GPU)[1].arena_bytes * 19 // 25
    schedule, plan, memo = optimal_within_budget_and_fastest(graph, budget, model=GPU)
    info = memo["optimal"]
    assert info["winner"] == "solver" and info["candidates"]["liveness"] is None  # liveness does not fit
    codecs = encoded(schedule)
    assert set(codecs.values()) == {"argmax", "sign"}  # lossless, and a pool's argmax with its ReLU's mask
    assert len(codecs) < len(encoded(planned(graph, "gist", None, model=GPU)[0]))  # only some: they cost time
    # the program without the encode option finds only slower plans
    with monkeypatch.context() as m:
        m.setattr(optimal_encode, "units_of", lambda *args, **kwargs: [])
        without = {}
        planned(graph, "optimal", budget, without, model=GPU)
    assert info["seconds"] < without["optimal"]["seconds"] * 0.9
    # realised by the encode pass: baseline's results bit for bit, plan equal to run
    check_copies(schedule)
    runtime, run_plan = assert_same_results(graph, schedule, exact=True)[:2]
    assert (runtime.peak_bytes, runtime.arena_bytes) == (plan.peak_bytes, plan.arena_bytes)
    assert runtime.arena_bytes <= budget and runtime.stalls == 0


WIDE_THEN_POOLED = """name: wide
input: {data: [4, 8, 32, 32], label: [4]}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 32, kernel_size: 1}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: conv2, type: Convolution, bottom: conv1, top: conv2, num_output: 32, kernel_size: 1}
  - {name: relu2, type: ReLU, bottom: conv2, top: conv2}
  - {name: pool, type: Pooling, bottom: conv2, top: pool, pool: MAX, kernel_size: 4, stride: 4}
  - {name: fc, type: InnerProduct, bottom: pool, top: fc, num_output: 10}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
"""


def test_optimal_takes_a_relus_signs_where_they_let_a_gradient_take_its_input(monkeypatch):
    """conv1 → ReLU → conv2 (wide maps) → ReLU → pool: the step that sets the bytes is conv2's
    backward, with its input, its top's gradient and its input's gradient, three maps, which
    no heuristic gets under. With relu1's backward reading its own signs, conv2's input is read
    last by conv2's backward, whose input gradient then takes its memory (inplace.py): the
    program weighs that form (a unit offered for the merge alone) and fits, with baseline's
    bits and the plan equal to the run. Without the merge nothing fits."""
    # one algorithm (chunked: no workspace for a 1x1), so that baseline's bits are the plan's
    monkeypatch.setattr(Convolution, "_algorithms", lambda layer, outputs: ORIGINAL_ALGORITHMS(layer, outputs)[1:2])
    graph = graph_of(WIDE_THEN_POOLED)
    budget = planned(graph, "liveness", None, model=GPU)[1].arena_bytes * 4 // 5
    schedule, plan, memo = optimal_within_budget_and_fastest(graph, budget, model=GPU)
    info = memo["optimal"]
    assert info["winner"] == "solver" and not any(v for k, v in info["candidates"].items() if k != "solver")
    assert encoded(schedule).get("relu1#sign") == "sign"
    conv2 = next(n for n in graph.nodes if n.name == "conv2")
    assert storage_root(schedule.tensors, conv2.bottom_grads[0]) == storage_root(schedule.tensors, "conv1")
    check_copies(schedule)
    runtime = assert_same_results(graph, schedule, exact=True)[0]
    assert (runtime.peak_bytes, runtime.arena_bytes) == (plan.peak_bytes, plan.arena_bytes)
    assert runtime.arena_bytes <= budget
    monkeypatch.setattr(Convolution, "grad_over_bottom", lambda layer: [])
    with pytest.raises(SNError, match="no schedule fits"):
        planned(graph, "optimal", budget, {}, model=GPU)


def test_the_units_are_the_encode_pass_choices_in_groups_and_restrict_it():
    """Each unit is what encode.py would choose, grouped so a pool's argmax comes with the
    mask of the ReLU output it relieves; the pass restricted to some units encodes just those."""
    s = liveness(lower(graph_of(RELU_POOL)))
    found = units(s)
    named = sorted((sorted(s.graph.nodes[i].name for i in layers), sorted(roots)) for layers, roots in found)
    # with its ReLU's own sign form, which then takes the ReLU output's last reader
    assert named == [(["pool1", "relu1"], ["conv1", "pool1"]), (["pool2", "relu2"], ["conv2", "pool2"])]
    assert encoded(encode(s, only=found[0])) in ({"pool1#argmax": "argmax", "relu1#sign": "sign"},
                                                  {"pool2#argmax": "argmax", "relu2#sign": "sign"})
    both = (found[0][0] | found[1][0], found[0][1] | found[1][1])
    assert encoded(encode(s, only=both)) == encoded(encode(s))


@pytest.mark.parametrize("lossy", [(), ("fp16",)])
def test_the_program_offers_what_the_encode_pass_may_choose_and_what_each_frees(lossy):
    """A unit frees, over its stashes' windows, their bytes less their encoded forms'; fp16
    units only with --lossy fp16 (a ReLU output a convolution reads has no lossless form)."""
    graph = conv_relu_pool(blocks=2, channels=8, side=4, batch=2)
    m = build(lower(graph), GPU, lossy=lossy)
    roots = {r for u in m.units for r in u.roots}
    assert {"conv1", "conv2", "pool1", "pool2"} <= roots
    assert ("data" in roots) == bool(lossy)  # the convolution's bottom: fp16 or nothing
    for unit in m.units:
        assert unit.seconds > 0
        freed = 0
        for _, change in unit.freed:
            freed += change
        assert freed == 0  # all given back by the end of the iteration
        most = max(sum(c for i, c in unit.freed if i <= k) for k, _ in unit.freed)
        assert most > 0


def brute_force(m, cap):
    """``(least objective, units chosen)`` of Model ``m`` under ``cap``, by enumeration of
    every stash's options and every set of units with the semantics optimal_encode.py states:
    a unit frees what its change points say, excludes every other option of its roots'
    stashes, and the recomputation of a root recomputed directly from one of them."""
    stash_of = {s.root: k for k, s in enumerate(m.stashes)}
    options = [[None] + (["rec"] if s.recompute_seconds is not None else [])
               + (["off"] if s.offload_seconds is not None else []) for s in m.stashes]
    freed = []
    for unit in m.units:
        f = np.zeros(m.n + 1)
        for i, change in unit.freed:
            f[min(i, m.n)] += change
        freed.append(np.cumsum(f)[:m.n])
    best = (None, None)
    for choice in itertools.product(*options):
        found = modelled(m, choice)
        if found is None:
            continue
        for picks in itertools.product((0, 1), repeat=len(m.units)):
            live, seconds, ok = found[0].copy(), found[1], True
            for unit, f, pick in zip(m.units, freed, picks):
                if not pick:
                    continue
                stashes = [stash_of[r] for r in unit.roots if r in stash_of]
                readers = {chain[-1] for k in stashes for _, chain in m.stashes[k].triggers}
                if any(choice[k] is not None for k in stashes) or any(choice[c] == "rec" for c in readers):
                    ok = False
                live, seconds = live - f, seconds + unit.seconds
            if ok and live.max() <= cap and (best[0] is None or seconds < best[0]):
                best = (seconds, picks)
    return best


def test_the_program_with_encodings_finds_the_brute_force_optimum():
    """On a Model of two conv → ReLU → pool blocks (CPU estimates), the
    solver's optimum is brute force's at every cap, and some cap's optimum encodes."""
    m = model_of(conv_relu_pool_text(2, 16, 4, 2), encodings=True)
    assert m.units
    peak, encoded_somewhere = m.live.max(), False
    for fraction in (1.0, 0.9, 0.8, 0.7, 0.6, 0.5):
        cap = int(peak * fraction)
        best, picks = brute_force(m, cap)
        solution = solve(m, cap, 10.0, swaps=False)
        if best is None:
            assert solution.recompute is None, cap
            continue
        assert solution.objective == pytest.approx(best, rel=1e-3, abs=1e-9), cap
        encoded_somewhere |= any(picks)
    assert encoded_somewhere
