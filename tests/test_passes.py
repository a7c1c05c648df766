"""The memory passes: liveness (which Alloc and Free steps, where), in-place reuse (which
layers share memory), planned placement (never two live tensors in one place), and, for every
network, plan equals run and policy invariance (bit-identical loss and gradients)."""

import functools
import glob
import os
import textwrap

import numpy as np
import pytest
from one_line import raises_one_line

from superneuron.backend import Backend
from superneuron.errors import SNError
from superneuron.graph import Graph
from superneuron.graph.tensors import storage_root as root
from superneuron.layers.fillers import fill
from superneuron.netfile.spec import load_spec
from superneuron.options import PlanOptions
from superneuron.runtime.executor import Runtime
from superneuron.scheduler.inplace import inplace
from superneuron.scheduler.liveness import Roots, liveness, step_roots
from superneuron.scheduler.lower import lower
from superneuron.scheduler.placement import arena_bytes, lifetimes, plan_offsets
from superneuron.scheduler.policy import POLICIES, apply_policy
from superneuron.scheduler.simulate import simulate
from superneuron.scheduler.steps import MEMORY

# paths as the tests load them (from the repository root); found from this file, so that a run
# from another folder fails loudly instead of testing fewer nets
NETS = sorted(f"nets/{os.path.basename(p)}"
              for p in glob.glob(os.path.join(os.path.dirname(__file__), "..", "nets", "*.yaml")))
assert len(NETS) >= 6, NETS
from test_net import SMALL  # noqa: E402  small sizes: an iteration of each net runs in a moment

HEAD = """\
name: t
input: {data: [2, 3, 8, 8], label: [2]}
layers:
"""
TAIL = """\
  - {name: fc, type: InnerProduct, bottom: LAST, top: fc, num_output: 5}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
"""


def graph_of(tmp_path, layers, last):
    path = tmp_path / "net.yaml"
    path.write_text(HEAD + textwrap.indent(textwrap.dedent(layers), "  ") + TAIL.replace("LAST", last))
    return Graph(load_spec(str(path)))


def blocks(schedule):
    """``{compute step: (allocated right before, freed right after)}``, workspaces left out."""
    out, pending, last = {}, set(), None
    for step in schedule.steps:
        if step.kind in MEMORY:
            if step.tensor.startswith("ws:"):
                continue
            if step.kind == "alloc":
                pending.add(step.tensor)
            else:
                out[last][1].add(step.tensor)
        else:
            last = step.describe(schedule.graph).split(" [")[0]
            out[last] = (pending, set())
            pending = set()
    return out


def test_liveness_allocates_at_first_use_and_frees_after_last_on_a_chain(tmp_path):
    g = graph_of(tmp_path, """\
      - {name: conv, type: Convolution, bottom: data, top: conv, num_output: 4, kernel_size: 3, pad: 1}
      - {name: pool, type: Pooling, bottom: conv, top: pool, pool: AVE, kernel_size: 2, stride: 2}
    """, "pool")
    b = blocks(liveness(lower(g)))
    # an average pooling's backward reads neither its bottom nor its top: conv goes at once
    assert b["Forward(input)"] == ({"data", "label"}, set())
    assert b["Forward(conv)"] == ({"conv"}, set())
    assert b["Forward(pool)"] == ({"pool"}, {"conv"})
    assert b["Forward(fc)"] == ({"fc"}, set())
    assert b["Forward(loss)"] == ({"loss"}, {"loss"})        # read once, by the runtime
    # the loss gradient is allocated just before the backward that the runtime fills it for
    assert b["Backward(loss)"] == ({"loss.grad", "fc.grad"}, {"loss.grad", "fc", "label"})
    assert b["Backward(fc)"] == ({"pool.grad"}, {"fc.grad", "pool"})  # fc's backward reads pool
    assert b["Backward(pool)"] == ({"conv.grad"}, {"pool.grad"})
    assert b["Backward(conv)"] == (set(), {"conv.grad", "data"})
    assert len(b) == 9  # five forwards, four backwards (the input has none)


def test_liveness_at_a_fork_joined_by_eltwise_and_concat(tmp_path):
    g = graph_of(tmp_path, """\
      - {name: c1, type: Convolution, bottom: data, top: c1, num_output: 4, kernel_size: 1}
      - {name: a, type: Convolution, bottom: c1, top: a, num_output: 4, kernel_size: 1}
      - {name: b, type: Convolution, bottom: c1, top: b, num_output: 4, kernel_size: 1}
      - {name: sum, type: Eltwise, bottom: [a, b], top: sum}
      - {name: cat, type: Concat, bottom: [sum, c1], top: cat}
    """, "cat")
    s = liveness(lower(g))
    b = blocks(s)
    # the Split's tops are views of c1: its forward allocates nothing, and c1 lives until the
    # last backward that reads it through a view (a's, the last convolution to run backward)
    assert b["Forward(c1#split)"] == (set(), set())
    assert b["Forward(c1)"][0] == {"c1"}
    assert "c1" in b["Backward(a)"][1]
    assert not any(s.tensors[st.tensor].alias for st in s.steps if st.kind in MEMORY)
    # an Eltwise SUM and a Concat read nothing in their backward: their bottoms go at once
    assert b["Forward(sum)"] == ({"sum"}, {"a", "b"})
    assert b["Forward(cat)"] == ({"cat"}, {"sum"})
    # each gradient lives from the backward that writes it to the one that reads it
    assert b["Backward(cat)"] == ({"sum.grad", "c1#2.grad"}, {"cat.grad"})
    assert b["Backward(sum)"] == ({"a.grad", "b.grad"}, {"sum.grad"})
    assert b["Backward(b)"] == ({"c1#1.grad"}, {"b.grad"})
    assert b["Backward(c1#split)"] == ({"c1.grad"}, {f"c1#{k}.grad" for k in range(3)})
    assert b["Backward(c1)"] == (set(), {"c1.grad", "data"})


def _check_tight(schedule):
    """Every root a compute step uses is live at it; each Alloc is just before the root's
    first use and each Free just after its last (no memory step lies between them)."""
    roots, live, uses = Roots(schedule), set(), {}
    compute = 0
    for step in schedule.steps:
        if step.kind == "alloc":
            assert step.tensor not in live
            live.add(step.tensor)
            uses[step.tensor] = [compute]
        elif step.kind == "free":
            live.remove(step.tensor)
            assert uses[step.tensor][-1] == compute - 1, step.tensor  # last use: the step before
        else:
            for r in step_roots(schedule, step, roots):
                assert r in live, (step.describe(schedule.graph), r)
                uses[r].append(compute)
            compute += 1
    assert not live
    for name, u in uses.items():
        assert len(u) > 1 and u[1] == u[0], name  # first use: the step after its Alloc


@pytest.mark.parametrize("path", NETS + ["tests/nets/tiny.yaml"])
def test_liveness_is_tight_in_training_and_test_schedules(path):
    g = Graph(load_spec(path, overrides=SMALL.get(path), batch=2))
    for train in (True, False):
        for name in POLICIES:
            _check_tight(apply_policy(lower(g, train=train), name) if name != "baseline"
                         else liveness(lower(g, train=train)))


def test_inplace_relu_after_a_convolution_shares_memory_and_gradient(tmp_path):
    g = graph_of(tmp_path, """\
      - {name: conv, type: Convolution, bottom: data, top: conv, num_output: 4, kernel_size: 3}
      - {name: relu, type: ReLU, bottom: conv, top: relu}
    """, "relu")
    s = inplace(lower(g))
    assert root(s.tensors, "relu") == "conv" and root(s.tensors, "conv.grad") == "relu.grad"
    assert g.tensors["relu"].alias is None and g.tensors["conv.grad"].alias is None  # graph intact
    assert not any(st.tensor in ("relu", "conv.grad") for st in s.steps if st.kind in MEMORY)
    b = blocks(liveness(s))
    assert b["Forward(relu)"] == (set(), set())  # writes over conv
    # writes its bottom gradient over relu.grad; the top it reads, stored in conv, goes after
    assert b["Backward(relu)"] == (set(), {"conv"})


def test_inplace_refused_when_a_later_layer_reads_the_bottom(tmp_path):
    g = graph_of(tmp_path, """\
      - {name: conv, type: Convolution, bottom: data, top: conv, num_output: 3, kernel_size: 1}
      - {name: relu, type: ReLU, bottom: conv, top: relu}
      - {name: sum, type: Eltwise, bottom: [relu, conv], top: sum}
    """, "sum")
    s = inplace(lower(g))
    assert root(s.tensors, "relu") == "relu"
    # its gradients may still share: nothing reads relu.grad after the ReLU's backward (and
    # the sum's first bottom gradient took its top gradient's memory: Eltwise SUM's may)
    assert root(s.tensors, "conv#0.grad") == root(s.tensors, "relu.grad") == "sum.grad"


def test_inplace_refused_after_batchnorm_whose_backward_reads_its_top(tmp_path):
    layers = """\
      - {name: conv, type: Convolution, bottom: data, top: conv, num_output: 4, kernel_size: 3}
      - {name: bn, type: BatchNorm, bottom: conv, top: bn}
      - {name: relu, type: ReLU, bottom: bn, top: relu}
    """
    g = graph_of(tmp_path, layers, "relu")
    s = inplace(lower(g))
    assert root(s.tensors, "bn") == "conv"       # the convolution's backward reads only data
    assert root(s.tensors, "relu") == "relu"     # BatchNorm's backward reads bn
    # testing runs no backward: then the ReLU may overwrite it too
    t = inplace(lower(g, train=False))
    assert root(t.tensors, "relu") == "conv"


def test_inplace_chains_through_layers_whose_backward_reads_nothing(tmp_path):
    g = graph_of(tmp_path, """\
      - {name: conv, type: Convolution, bottom: data, top: conv, num_output: 4, kernel_size: 3}
      - {name: d1, type: Dropout, bottom: conv, top: d1}
      - {name: d2, type: Dropout, bottom: d1, top: d2}
    """, "d2")
    s = inplace(lower(g))
    assert root(s.tensors, "d2") == "conv" and root(s.tensors, "conv.grad") == "d2.grad"


def _check_no_overlap(schedule):
    """Interval sweep over the steps: the live tensors, kept sorted by offset, never overlap."""
    import bisect
    offsets, _ = plan_offsets(schedule)
    count, live = {}, []
    for step in schedule.steps:
        if step.kind not in MEMORY:
            continue
        k = count.get(step.tensor, 0)
        off = offsets[step.tensor][k - (step.kind == "free")]
        if step.kind == "free":
            live.remove((off, step.tensor))
            continue
        count[step.tensor] = k + 1
        size = -(-schedule.tensors[step.tensor].nbytes // 256) * 256
        i = bisect.bisect(live, (off, step.tensor))
        if i > 0:
            prev_off, prev = live[i - 1]
            assert prev_off + -(-schedule.tensors[prev].nbytes // 256) * 256 <= off, (prev, step.tensor)
        if i < len(live):
            assert off + size <= live[i][0], (step.tensor, live[i][1])
        live.insert(i, (off, step.tensor))


def test_planned_placement_never_overlaps_and_mostly_beats_dynamic():
    better = 0
    cases = [(p, {}) for p in NETS]  # nets/resnet.yaml is ResNet-50 at full size
    for path, overrides in cases:
        g = Graph(load_spec(path, overrides=overrides))
        for name in POLICIES:
            s = apply_policy(lower(g), name)
            _check_no_overlap(s)
            assert len(lifetimes(s)) == sum(st.kind == "alloc" for st in s.steps)
            planned, dynamic = arena_bytes(s, "planned"), arena_bytes(s, "dynamic")
            assert simulate(s).peak_bytes <= planned
            better += name == "liveness" and planned <= dynamic
    assert better >= len(cases) - 1


def test_planned_placement_under_a_budget_gives_the_workspaces_the_room_the_tensors_leave():
    """Under a budget each step's workspace fills what the tensors leave; placed among the
    tensors, it left holes they could not use. Planned placement now places the tensors first
    and caps each workspace to the room they leave at its step: on the nets of nets/ under
    liveness and superneurons, between the smallest workspaces' peak and the fastest's, it
    fits wherever the dynamic allocator does and in half the cases or more where it does not,
    with never a larger arena."""
    planned_only = dynamic_only = dynamic_over = 0
    for path in sorted(SMALL):
        g = _graph(path)[0]
        for name in ("liveness", "superneurons"):
            low = simulate(apply_policy(lower(g), name, budget=1)).peak_bytes
            high = simulate(apply_policy(lower(g), name)).peak_bytes
            for budget in (low + (high - low) // 4, (low + high) // 2):
                planned = simulate(apply_policy(lower(g), name, placement="planned", budget=budget))
                dynamic = simulate(apply_policy(lower(g), name, placement="dynamic", budget=budget))
                assert planned.arena_bytes <= max(budget, dynamic.arena_bytes), (path, name)
                planned_only += planned.fits(budget) and not dynamic.fits(budget)
                dynamic_only += dynamic.fits(budget) and not planned.fits(budget)
                dynamic_over += not dynamic.fits(budget)
    assert dynamic_only == 0 and dynamic_over >= 4 and 2 * planned_only >= dynamic_over, \
        (planned_only, dynamic_only, dynamic_over)


def test_packing_from_the_floor_up_reaches_the_peak_where_best_fit_leaves_a_hole():
    """Five tensors whose live bytes peak at 5: best fit, in every order, leaves a hole under
    one of them (region 6); packed from the floor up (MiniMalloc's canonical order) they take
    5. On random lifetimes the packing never puts two tensors live together over each other
    and never takes less than the peak."""
    import random

    from superneuron.scheduler.placement import ORDERS, _place

    def peak(spans):
        return max(sum(size for a, b, _, size in spans if a <= t <= b) for t in range(12))

    spans = [(2, 3, "t0", 2), (2, 5, "t1", 1), (1, 7, "t2", 2), (8, 9, "t3", 3), (4, 9, "t4", 2)]
    assert peak(spans) == 5
    assert min(_place(spans, key)[1] for key in ORDERS.values()) == 6
    assert min(_place(spans, key, from_floor=True)[1] for key in ORDERS.values()) == 5
    rng = random.Random(0)
    for _ in range(200):
        spans = [(a, rng.randint(a, 11), f"t{i}", rng.randint(1, 4))
                 for i, a in enumerate(rng.randint(0, 11) for _ in range(rng.randint(2, 12)))]
        for key in ORDERS.values():
            where, region, _ = _place(spans, key, from_floor=True)
            assert region >= peak(spans)
            for i, (a, b, _, size) in enumerate(spans):
                for j, (c, d, _, other) in enumerate(spans[:i]):
                    if a <= d and c <= b:  # live together: apart in the arena
                        assert where[i] + size <= where[j] or where[j] + other <= where[i]


def test_planned_arena_hands_out_the_planned_offsets():
    from superneuron.runtime.arena import ALIGN, Arena
    a = Arena()
    a.place_resident("w", ALIGN)                 # offsets are planned above the resident region
    a.reset({"x": [ALIGN, 0], "y": [0]})         # x is allocated twice: one offset each time
    assert a.alloc("y", ALIGN) == ALIGN and a.alloc("x", ALIGN) == 2 * ALIGN
    a.free("y")
    a.free("x")
    assert a.alloc("x", ALIGN) == ALIGN
    assert a.high_water == 3 * ALIGN and a.peak_bytes == 3 * ALIGN and a.live == ALIGN


def test_planned_offsets_survive_dropping_compute_steps_but_not_memory_steps():
    s = apply_policy(lower(Graph(load_spec("tests/nets/tiny.yaml"))), "liveness", placement="planned")
    forward_only = s.replace([st for st in s.steps if st.kind != "backward"])
    assert forward_only.offsets is s.offsets  # a forward-only run keeps the plan's places
    assert s.replace(s.steps[1:]).offsets is None and s.replace(policy="x").offsets is s.offsets


def test_unknown_policy_and_placement_name_the_known_ones(tmp_path):
    g = Graph(load_spec("tests/nets/tiny.yaml"))
    with raises_one_line(SNError, match="unknown policy 'lifeness'; known: baseline, liveness"):
        apply_policy(lower(g), "lifeness")
    with raises_one_line(SNError, match="known: dynamic, planned"):
        apply_policy(lower(g), "liveness", placement="static")


# -- whole nets on the Runtime -----------------------------------------------------------------

def _params(graph):
    """Parameters filled as Net fills them (seed 0)."""
    rng = np.random.default_rng(0)
    return {node.params[k]: fill(rng, p.shape, p.filler, p.fan_in, p.fan_out, graph.dtype)
            for node in graph.nodes for k, p in node.param_specs.items()}


@functools.lru_cache(maxsize=None)
def _graph(path):
    """The graph of ``path`` at small sizes and its parameters."""
    graph = Graph(load_spec(path, overrides=SMALL[path], batch=1))
    return graph, _params(graph)


def _execute(graph, params, policy, placement, classes=10):
    """One forward and backward under a policy, from ``params``: the plan, the runtime's peak
    and high-water mark, the loss and every parameter gradient."""
    schedule = apply_policy(lower(graph), policy, placement=placement)
    plan = simulate(schedule)
    runtime = Runtime([schedule], Backend(), capacity=plan.arena_bytes)
    for name, value in params.items():
        runtime.resident[name][...] = value
    rng = np.random.default_rng(1)
    feed = {}
    for node in graph.inputs:
        data, label = node.tops
        feed[data] = rng.standard_normal(graph.tensors[data].shape).astype(np.float32)
        feed[label] = rng.integers(0, classes, graph.tensors[label].shape).astype(np.float32)
    outputs = runtime.run(schedule, feed)
    loss = sum(n.loss_weight * outputs[n.name] for n in graph.losses)
    grads = {g: runtime.to_host(g) for n in graph.nodes for g in n.param_grads.values()}
    assert runtime.stalls == 0, "a copy was still running where the plan has no Wait"
    assert runtime.host_peak == plan.host_bytes
    return plan, (runtime.peak_bytes, runtime.arena_bytes), loss, grads


@functools.lru_cache(maxsize=None)
def _run(path, policy, placement):
    return _execute(*_graph(path), policy, placement)


@pytest.mark.parametrize("path", sorted(SMALL))
@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("placement", ["dynamic", "planned"])
def test_plan_equals_run(path, policy, placement):
    plan, (peak, arena), _, _ = _run(path, policy, placement)
    assert peak == plan.peak_bytes and arena == plan.arena_bytes
    assert plan.lower_bound_bytes <= plan.peak_bytes <= plan.arena_bytes


@pytest.mark.parametrize("path", sorted(SMALL))
@pytest.mark.parametrize("policy", sorted(set(POLICIES) - {"baseline"}))
def test_policies_give_bit_identical_results_in_less_memory(path, policy):
    base_plan, _, base_loss, base_grads = _run(path, "baseline", "dynamic")
    for placement in ("dynamic", "planned"):
        plan, _, loss, grads = _run(path, policy, placement)
        assert loss == base_loss and np.isfinite(loss)
        for name, g in base_grads.items():
            np.testing.assert_array_equal(grads[name], g, err_msg=name)
        assert plan.peak_bytes < base_plan.peak_bytes


def test_layers_the_pass_puts_in_place_give_bit_identical_results(tmp_path):
    """BatchNorm, ReLU, Dropout and Softmax writing over their bottoms and bottom gradients,
    and Scale over its bottom gradient (not asked for in the file), compute what they compute
    with tops of their own."""
    g = graph_of(tmp_path, """\
      - {name: conv, type: Convolution, bottom: data, top: conv, num_output: 4, kernel_size: 3}
      - {name: bn, type: BatchNorm, bottom: conv, top: bn}
      - {name: scale, type: Scale, bottom: bn, top: scale, bias_term: true}
      - {name: relu, type: ReLU, bottom: scale, top: relu}
      - {name: drop, type: Dropout, bottom: relu, top: drop}
      - {name: soft, type: Softmax, bottom: drop, top: soft}
    """, "soft")
    s = inplace(lower(g))
    # not Dropout over the ReLU's top, which the ReLU's backward reads; Softmax over Dropout's
    assert [root(s.tensors, t) for t in ("bn", "relu", "drop", "soft")] == ["conv", "scale", "drop", "drop"]
    # the gradients in one chain: Scale's bottom gradient over its top gradient too
    assert {root(s.tensors, t) for t in ("conv.grad", "bn.grad", "scale.grad", "relu.grad")} == {"soft.grad"}
    assert_liveness_gives_baselines_bits(g)


def assert_liveness_gives_baselines_bits(g):
    """One forward and backward of ``g`` under liveness, both placements, gives baseline's loss
    and parameter gradients bit for bit, and the run's bytes are the plan's."""
    params = _params(g)
    base = _execute(g, params, "baseline", "dynamic", classes=5)
    for placement in ("dynamic", "planned"):
        plan, (peak, arena), loss, grads = _execute(g, params, "liveness", placement, classes=5)
        assert loss == base[2] and (peak, arena) == (plan.peak_bytes, plan.arena_bytes)
        for name, grad in base[3].items():
            np.testing.assert_array_equal(grads[name], grad, err_msg=name)


@pytest.mark.parametrize("coeff", ["", ", coeff: [2.0, -0.5]", ", coeff: [1.0, 3.0]"])
def test_gradients_the_pass_puts_over_a_sums_and_a_splits_give_bit_identical_results(tmp_path, coeff):
    """An Eltwise SUM's bottom gradient over its top gradient (its weighted copy written last,
    whichever bottom it is), and a Split's (three readers) over one of the two gradients it
    adds first, compute what they compute with gradients of their own (each layer so handed
    its gradients: layer_harness.check_grad_inplace)."""
    g = graph_of(tmp_path, f"""\
      - {{name: conv, type: Convolution, bottom: data, top: conv, num_output: 4, kernel_size: 3, pad: 1}}
      - {{name: a, type: Convolution, bottom: conv, top: a, num_output: 4, kernel_size: 1}}
      - {{name: b, type: Convolution, bottom: conv, top: b, num_output: 4, kernel_size: 1}}
      - {{name: sum, type: Eltwise, bottom: [a, conv], top: sum{coeff}}}
      - {{name: sum2, type: Eltwise, bottom: [sum, b], top: sum2, operation: SUM}}
    """, "sum2")
    s = inplace(lower(g))
    sums = [n for n in g.nodes if n.layer.type == "Eltwise"]
    shared = [root(s.tensors, dx) == root(s.tensors, n.top_grads[0]) for n in sums for dx in n.bottom_grads if dx]
    assert shared.count(True) == len(sums)  # one bottom gradient of each sum
    split = next(n for n in g.nodes if n.layer.type == "Split")
    assert len(split.tops) == 3
    assert root(s.tensors, split.bottom_grads[0]) in {root(s.tensors, t) for t in split.top_grads[:2]}
    assert_liveness_gives_baselines_bits(g)


def test_a_convolutions_bottom_gradient_takes_its_bottoms_memory_where_its_backward_reads_it_last(tmp_path):
    """An LRN's backward reads its bottom alone, so the convolution after it reads the LRN's
    top last: that convolution's bottom gradient goes over its bottom (Layer.grad_over_bottom),
    the backward holding one map where it held two, with baseline's bits. A ReLU's backward
    reads its top, so the convolution after it keeps its gradient apart."""
    g = graph_of(tmp_path, """\
      - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3, pad: 1}
      - {name: norm, type: LRN, bottom: conv1, top: norm, local_size: 3}
      - {name: conv2, type: Convolution, bottom: norm, top: conv2, num_output: 4, kernel_size: 3, pad: 1}
      - {name: relu, type: ReLU, bottom: conv2, top: relu}
      - {name: conv3, type: Convolution, bottom: relu, top: conv3, num_output: 4, kernel_size: 3, pad: 1}
    """, "conv3")
    s = liveness(inplace(lower(g)))
    conv2, conv3 = (next(n for n in g.nodes if n.name == name) for name in ("conv2", "conv3"))
    assert root(s.tensors, conv2.bottom_grads[0]) == root(s.tensors, "norm")
    assert root(s.tensors, conv3.bottom_grads[0]) not in {root(s.tensors, "relu"), root(s.tensors, "conv2")}
    roots = Roots.of(s)
    backward = next(st for st in s.steps if st.kind == "backward" and st.node == conv2.index)
    assert len([r for r in step_roots(s, backward, roots) if s.tensors[r].kind in ("data", "grad")]) == 2
    assert_liveness_gives_baselines_bits(g)
    # still a stash that may be kept in half precision until that backward reads it
    from superneuron.scheduler.context import Context
    from superneuron.scheduler.encode import encode
    coded = encode(s, Context(PlanOptions(lossy=("fp16",))))
    assert any(st.kind == "decode" and st.source == "norm" for st in coded.steps)
    assert root(coded.tensors, conv2.bottom_grads[0]) == root(coded.tensors, "norm")


def test_a_relus_signs_let_the_next_convolutions_gradient_take_its_input(tmp_path):
    """conv → ReLU → conv: with the ReLU's backward reading its own signs (the encode pass,
    chosen by the optimal policy's program: optimal_encode.py), the second convolution's
    backward reads the ReLU's top last, and its bottom gradient takes that map's memory; the
    encode pass offers the ReLU's form for this alone, and carries it out with baseline's bits."""
    from test_memory_passes import assert_same_results

    from superneuron.scheduler.context import Context
    from superneuron.scheduler.encode import encode, units
    g = graph_of(tmp_path, """\
      - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3, pad: 1}
      - {name: relu, type: ReLU, bottom: conv1, top: conv1}
      - {name: conv2, type: Convolution, bottom: conv1, top: conv2, num_output: 4, kernel_size: 3, pad: 1}
    """, "conv2")
    s = liveness(inplace(lower(g)))
    conv2 = next(n for n in g.nodes if n.name == "conv2")
    relu = next(n for n in g.nodes if n.name == "relu")
    assert root(s.tensors, conv2.bottom_grads[0]) != root(s.tensors, "conv1")  # the ReLU reads it after
    assert encode(s, Context()) is s  # the heuristic keeps nothing: the map is a stash either way
    assert (frozenset({relu.index}), frozenset({"conv1"})) in units(s, Context())
    coded = encode(s, Context(), only=(frozenset({relu.index}), frozenset({"conv1"})))
    assert root(coded.tensors, conv2.bottom_grads[0]) == root(coded.tensors, "conv1")
    before, after = simulate(s), simulate(coded)
    assert after.peak_bytes < before.peak_bytes
    runtime = assert_same_results(g, coded)[0]  # baseline's loss and gradients, bit for bit
    assert runtime.peak_bytes == after.peak_bytes


def test_offload_copies_no_gradient_that_took_its_bottoms_memory():
    """A root whose memory a convolution's bottom gradient took holds a gradient from that
    backward on, which may wait for other branches' backwards (GoogLeNet's inception outputs):
    the offload pass copies forward values only, so no Offload follows a Backward that wrote
    its root (superneurons+params offloads every gap it may)."""
    g = _graph("nets/googlenet.yaml")[0]
    s = apply_policy(lower(g), "superneurons+params")
    roots, written, merged = Roots.of(s), set(), 0
    for step in s.steps:
        if step.kind == "backward":
            data = {r for r in roots.uses(step)[1] if s.tensors[r].kind == "data"}
            merged += len(data)
            written |= data
        elif step.kind == "offload":
            assert roots(step.tensor) not in written, step.tensor
    assert merged >= 5
