"""The memory passes of issue 4: recomputation (recompute.py), offload and prefetch
(offload.py) and the policies built from them (policy.py).

Where the passes put their steps (Recompute before the backward that reads what it rewrites,
only for cheap layers; every Offload waited for before its device memory goes, every Prefetch
waited for before its tensor is read), that every policy computes bit for bit what baseline
computes (Dropout's mask and BatchNorm's running statistics included), the estimated timeline
of the copies, the budget and host-memory limits, the Runtime's safety net for a missing Wait,
and plan equals run (device peak, arena, host bytes) for every policy."""

import collections
import functools

import numpy as np
import pytest

from superneuron.backend import Backend
from superneuron.graph import Graph
from superneuron.graph.tensors import storage_root as root
from superneuron.layers.fillers import fill
from superneuron.net import Net
from superneuron.netfile.spec import load_spec, loads_spec
from superneuron.runtime.executor import Runtime
from superneuron.scheduler.cost import CostModel, DeviceModel
from superneuron.scheduler.inplace import inplace
from superneuron.scheduler.liveness import Roots, liveness, uses
from superneuron.scheduler.lower import lower
from superneuron.scheduler.policy import POLICIES, apply_policy
from superneuron.scheduler.recompute import recompute, with_recomputes
from superneuron.scheduler.simulate import simulate
from superneuron.scheduler.steps import COPY, MEMORY, Free, Offload, Wait
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig

TINY = "tests/nets/tiny.yaml"
HEAD = """\
name: t
input: {data: [2, 8, 8, 8], label: [2]}
layers:
"""


def _block(i, bottom):
    """conv → BatchNorm (own top) → Scale → ReLU (in place): a checkpoint and three cheap layers."""
    return f"""\
  - {{name: conv{i}, type: Convolution, bottom: {bottom}, top: conv{i}, num_output: 8, kernel_size: 1}}
  - {{name: bn{i}, type: BatchNorm, bottom: conv{i}, top: bn{i}}}
  - {{name: scale{i}, type: Scale, bottom: bn{i}, top: scale{i}, bias_term: true}}
  - {{name: relu{i}, type: ReLU, bottom: scale{i}, top: scale{i}}}
"""


# Three such blocks (a max pooling that keeps the size after the first) on 8x8 maps: pointwise
# convolutions keep the workspaces small, so the peak is the activations kept across the turn,
# which recomputation cuts.
CHAIN = HEAD + _block(1, "data") + """\
  - {name: pool1, type: Pooling, bottom: scale1, top: pool1, pool: MAX, kernel_size: 3, stride: 1, pad: 1}
""" + _block(2, "pool1") + _block(3, "scale2") + """\
  - {name: pool, type: Pooling, bottom: scale3, top: pool, pool: AVE, kernel_size: 8, stride: 8}
  - {name: fc, type: InnerProduct, bottom: pool, top: fc, num_output: 5}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
"""

# The same chain as Caffe writes it: conv → BatchNorm → Scale → ReLU all on one blob, and a
# Dropout in place after a ReLU (whose backward reads the ReLU's top: the graph keeps it).
CAFFE_CHAIN = HEAD + "".join(f"""\
  - {{name: conv{i}, type: Convolution, bottom: {b}, top: conv{i}, num_output: 8, kernel_size: 1}}
  - {{name: bn{i}, type: BatchNorm, bottom: conv{i}, top: conv{i}}}
  - {{name: scale{i}, type: Scale, bottom: conv{i}, top: conv{i}, bias_term: true}}
  - {{name: relu{i}, type: ReLU, bottom: conv{i}, top: conv{i}}}
""" for i, b in ((1, "data"), (2, "conv1"), (3, "conv2"))) + """\
  - {name: drop, type: Dropout, bottom: conv3, top: conv3, dropout_ratio: 0.5}
  - {name: fc, type: InnerProduct, bottom: conv3, top: fc, num_output: 5}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
"""

# Dropout (own top, p = 0.5) between a convolution and a pooling, so recompute redraws its mask.
DROPOUT = HEAD + """\
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 8, kernel_size: 3, pad: 1}
  - {name: drop, type: Dropout, bottom: conv1, top: drop, dropout_ratio: 0.5}
  - {name: pool1, type: Pooling, bottom: drop, top: pool1, pool: MAX, kernel_size: 2, stride: 2}
  - {name: conv2, type: Convolution, bottom: pool1, top: conv2, num_output: 4, kernel_size: 3, pad: 1}
  - {name: relu2, type: ReLU, bottom: conv2, top: conv2}
  - {name: fc, type: InnerProduct, bottom: conv2, top: fc, num_output: 5}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
"""

CHEAP_TYPES = {"BatchNorm", "Scale", "ReLU", "Pooling", "Dropout", "LRN"}
NEVER_RECOMPUTED = {"Convolution", "InnerProduct", "Eltwise", "Concat", "Split",
                    "SoftmaxWithLoss", "Accuracy", "Input"}


@functools.lru_cache(maxsize=None)
def graph_of(text):
    return Graph(loads_spec(text))


@functools.lru_cache(maxsize=None)
def tiny():
    return Graph(load_spec(TINY))


def params_of(graph):
    """Parameters filled as Net fills them (seed 0)."""
    rng = np.random.default_rng(0)
    return {node.params[k]: fill(rng, p.shape, p.filler, p.fan_in, p.fan_out, graph.dtype)
            for node in graph.nodes for k, p in node.param_specs.items()}


def feed_of(graph, seed=1):
    rng = np.random.default_rng(seed)
    feed = {}
    for node in graph.inputs:
        data, label = node.tops
        classes = next(graph.tensors[n.bottoms[0]].shape[1] for n in graph.losses)
        feed[data] = rng.standard_normal(graph.tensors[data].shape).astype(np.float32)
        feed[label] = rng.integers(0, classes, graph.tensors[label].shape).astype(np.float32)
    return feed


def execute(schedule, iteration=0):
    """Run one iteration of ``schedule`` from Net's parameters: ``(runtime, plan, loss,
    {param grad: array}, {state: array})``."""
    graph = schedule.graph
    plan = simulate(schedule)
    runtime = Runtime([schedule], Backend(), capacity=plan.arena_bytes)
    for name, value in params_of(graph).items():
        runtime.resident[name][...] = value
    outputs = runtime.run(schedule, feed_of(graph), iteration=iteration)
    loss = sum(n.loss_weight * outputs[n.name] for n in graph.losses)
    grads = {g: runtime.to_host(g) for n in graph.nodes for g in n.param_grads.values()}
    state = {t: runtime.to_host(t) for n in graph.nodes for t in n.params.values()
             if graph.tensors[t].kind == "state"}
    return runtime, plan, loss, grads, state


@functools.lru_cache(maxsize=None)
def baseline(graph, iteration=0):
    _, _, loss, grads, state = execute(lower(graph), iteration)
    return loss, grads, state


def assert_same_results(graph, schedule, iteration=0, exact=True):
    """``schedule`` computes baseline's loss and gradients bit for bit (not ``exact``: to
    float32 rounding, for a schedule on other algorithms); returns its run."""
    run = execute(schedule, iteration)
    loss, grads, _ = baseline(graph, iteration)
    assert np.isfinite(loss)
    if exact:
        assert run[2] == loss
    else:
        assert run[2] == pytest.approx(loss, rel=1e-5)
    for name, g in grads.items():
        if exact:
            np.testing.assert_array_equal(run[3][name], g, err_msg=name)
        else:
            np.testing.assert_allclose(run[3][name], g, rtol=1e-4, atol=1e-6, err_msg=name)
    return run


def names(schedule, kind):
    return [schedule.graph.nodes[s.node].name for s in schedule.steps if s.kind == kind]


def reads_and_writes(schedule, step, roots):
    """The scheduled roots ``step`` reads and writes (its workspace aside)."""
    reads, writes = uses(schedule.graph, step)
    return ({r for r in map(roots.scheduled, reads) if r}, {r for r in map(roots.scheduled, writes) if r})


# -- recompute ---------------------------------------------------------------------------------

def check_recompute(schedule):
    """Recompute steps only of cheap layers, each read before anything else writes its top, and
    every backward reading a recomputed root reads the recomputed version, not the forward's."""
    graph, roots = schedule.graph, Roots(schedule)
    steps = [s for s in schedule.steps if s.kind not in MEMORY]
    recomputed = set()
    for i, step in enumerate(steps):
        if step.kind != "recompute":
            continue
        layer = graph.nodes[step.node].layer
        assert layer.type in CHEAP_TYPES and layer.type not in NEVER_RECOMPUTED, layer.type
        assert any(s.kind == "backward" for s in steps[:i]), "a Recompute before the turn"
        _, (r,) = reads_and_writes(schedule, step, roots)
        recomputed.add(r)
        # the next step to touch r reads it: a backward, or a recompute further down the chain
        nxt = next(s for s in steps[i + 1:] if r in set.union(*reads_and_writes(schedule, s, roots)))
        assert nxt.kind in ("backward", "recompute") and r in reads_and_writes(schedule, nxt, roots)[0], \
            f"{step.describe(graph)} is followed by {nxt.describe(graph)}"
    last_writer = {}
    for step in steps:
        reads, writes = reads_and_writes(schedule, step, roots)
        if step.kind == "backward":
            for r in reads & recomputed:
                assert last_writer[r].kind == "recompute", \
                    f"{step.describe(graph)} reads {r} as the forward left it"
        for r in writes:
            last_writer[r] = step
    return recomputed


def test_recompute_reruns_only_cheap_layers_before_the_backward_that_reads_them():
    g = graph_of(CHAIN)
    s = recompute(lower(g))
    recomputed = check_recompute(s)
    # the checkpoints are the convolutions' outputs (bn has a top of its own): never recomputed
    assert not recomputed & {"conv1", "conv2", "conv3"}
    # every BatchNorm, Scale and ReLU (on the Scale's top) and both poolings: backward steps
    # read all their tops (the max pooling's its own, the average pooling's fc's backward)
    cheap = {f"{k}{i}" for k in ("bn", "scale", "relu") for i in (1, 2, 3)} | {"pool1", "pool"}
    assert set(names(s, "recompute")) == cheap
    # the forward is untouched
    assert names(s, "forward") == names(lower(g), "forward")
    assert names(s, "backward") == names(lower(g), "backward")


def test_recompute_keeps_joins_as_checkpoints():
    """tiny.yaml: a fork (Split) of the ReLU's top joined by Eltwise and Concat."""
    g = tiny()
    s = recompute(lower(g))
    recomputed = check_recompute(s)
    types = {g.nodes[s_.node].layer.type for s_ in s.steps if s_.kind == "recompute"}
    assert types == {"Scale", "ReLU", "Pooling", "Dropout"}
    assert not recomputed & {"sum", "concat", "branch_a", "branch_b", "ip"}
    # BatchNorm runs in place on the convolution's output: that root is a checkpoint too
    assert "bn1" not in names(s, "recompute") and "conv1" not in recomputed


def test_speed_centric_recomputes_once_memory_centric_may_recompute_again():
    g = graph_of(CHAIN)
    speed = with_recomputes(lower(g), largest=1 << 60)
    memory = with_recomputes(lower(g), largest=0)
    check_recompute(speed)
    check_recompute(memory)
    once = collections.Counter(names(speed, "recompute"))
    again = collections.Counter(names(memory, "recompute"))
    assert set(once.values()) == {1}
    assert set(again) == set(once)
    # bn1's top is read by the chain recomputed for conv2's backward (through scale1, pool1)
    # and, several backward steps later, by scale1's backward: memory-centric makes it twice
    assert again["bn1"] >= 2 and sum(again.values()) > sum(once.values())
    for s in (speed, memory):
        assert_same_results(g, s)
        assert_same_results(g, liveness(inplace(s)))


def test_liveness_after_recompute_frees_cheap_outputs_between_forward_and_backward():
    g = graph_of(CHAIN)
    s = liveness(inplace(recompute(lower(g))))
    roots = Roots(s)
    recomputed = {r for st in s.steps if st.kind == "recompute" for r in reads_and_writes(s, st, roots)[1]}
    assert recomputed
    turn = next(i for i, st in enumerate(s.steps) if st.kind == "backward")
    for r in recomputed:
        first_recompute = next(i for i, st in enumerate(s.steps)
                               if st.kind == "recompute" and r in reads_and_writes(s, st, roots)[1])
        assert Free(r) in s.steps[:first_recompute], f"{r} kept from the forward"
        # freed in the forward pass: nothing but the recomputation brings it back
        assert s.steps.index(Free(r)) < turn
    plain = simulate(apply_policy(lower(g), "liveness"))
    plan = simulate(apply_policy(lower(g), "recompute"))
    assert plan.peak_bytes < plain.peak_bytes


def test_recomputed_dropout_draws_the_forwards_mask():
    g = graph_of(DROPOUT)
    s = apply_policy(lower(g), "recompute")
    # the max pooling's backward reads Dropout's top: recomputed, from a mask drawn again
    assert names(s, "recompute") == ["drop", "pool1"]
    assert_same_results(g, s)
    assert_same_results(g, apply_policy(lower(g), "superneurons"))
    # the mask matters: the next iteration draws another and gets other gradients
    assert not np.array_equal(baseline(g, 1)[1]["conv1/weight.grad"], baseline(g)[1]["conv1/weight.grad"])


@pytest.mark.parametrize("policy", ["recompute", "superneurons"])
def test_batchnorm_running_statistics_are_updated_once_under_recompute(policy):
    spec, feed = loads_spec(CHAIN), feed_of(graph_of(CHAIN))
    nets = {p: Net(spec, policy=p, optimizer=make_optimizer(SolverConfig())) for p in ("baseline", policy)}
    losses = {p: net.train_step(feed, 0) for p, net in nets.items()}
    assert losses[policy] == losses["baseline"]
    assert {"bn1", "bn2", "bn3"} <= set(names(nets[policy].schedules["train"], "recompute"))
    for i in (1, 2, 3):
        for stat in ("mean", "variance", "scale_factor"):
            name = f"bn{i}/{stat}"
            base = nets["baseline"].param(name)
            assert np.abs(base).max() > 1e-6, f"{name} was not updated"
            # a second update (sum = f * sum + batch again) would differ
            np.testing.assert_array_equal(nets[policy].param(name), base, err_msg=name)
    for name in nets["baseline"].learnable_names:
        np.testing.assert_array_equal(nets[policy].param(name), nets["baseline"].param(name), err_msg=name)


# -- offload and prefetch ----------------------------------------------------------------------

def check_copies(schedule):
    """Walk the steps as the Runtime would, following each root's contents: an Offload copies
    allocated, current contents and is waited for before its device memory goes; a Prefetch
    brings back a host copy (waited for) of what the tensor held when last written, into
    memory allocated for it, and is waited for before anything touches the tensor; an Apply
    gives back a gradient's host copy that has landed (parameter offload's diet); no step
    touches a tensor while its copy runs; every copy is waited for. Returns the offloaded roots."""
    graph, roots = schedule.graph, Roots(schedule)
    on_device, pending = set(), {}
    host = {t: 0 for t in schedule.host_resident}   # parameter offload: the masters start there
    contents, written = {}, collections.Counter()   # root → the write its device memory holds
    offloaded = set()
    for step in schedule.steps:
        kind, t = step.kind, step.tensor
        label = step.describe(graph)
        if kind == "alloc":
            on_device.add(t)
        elif kind == "free":
            assert t not in pending, f"{label} while its copy runs"
            on_device.discard(t)
        elif kind == "offload":
            assert t in on_device and t not in pending, label
            assert contents.get(t) == written[t], f"{label} of stale contents"
            pending[t], host[t] = "offload", None
            offloaded.add(t)
        elif kind == "prefetch":
            assert t in on_device and t not in pending, label
            assert host.get(t) == written[t], f"{label}: no valid host copy"
            pending[t] = "keep" if step.keep else "prefetch"
        elif kind == "wait":
            assert t in pending, f"{label} without a copy"
            what = pending.pop(t)
            if what == "offload":
                host[t] = contents[t]
            else:
                contents[t] = host[t]
                if what == "prefetch":
                    del host[t]
        elif kind == "apply":  # parameter offload's diet: the host update consumed this copy
            assert t in host and t not in pending and t not in schedule.host_resident, label
            assert host[t] is not None, f"{label} before its copy landed"
            del host[t]
        elif kind != "update":
            reads, writes = reads_and_writes(schedule, step, roots)
            if kind == "backward" and graph.nodes[step.node].loss_weight:  # the Runtime fills the loss gradient
                filled = {roots(g) for g in graph.nodes[step.node].top_grads if g is not None}
                reads, writes = reads - filled, writes | filled
            for r in reads | writes:
                assert r not in pending, f"{label} touches {r} while its copy runs"
                assert r in on_device, f"{label} touches {r}, not on the device"
            for r in reads:
                assert contents.get(r) == written[r], f"{label} reads stale {r}"
            for r in writes - reads:
                written[r] += 1
                contents[r] = written[r]
    assert not pending, f"never waited for: {sorted(pending)}"
    return offloaded


def find(steps, kind, target=None, start=0):
    """The index of the first step of ``kind`` (on ``target``, unless None) from ``start``."""
    return next(i for i in range(start, len(steps))
                if steps[i].kind == kind and target in (None, steps[i].tensor))


@pytest.mark.parametrize("graph", [tiny, lambda: graph_of(CHAIN)], ids=["tiny", "chain"])
def test_offload_waits_frees_prefetches_and_waits_before_the_backward(graph):
    g = graph()
    s = apply_policy(lower(g), "offload")
    offloaded = check_copies(s)
    assert offloaded
    roots, steps = Roots(s), s.steps
    turn = find(steps, "backward")
    for t in offloaded:
        o = find(steps, "offload", t)
        w, f, p = find(steps, "wait", t, o), find(steps, "free", t, o), find(steps, "prefetch", t, o)
        w2 = find(steps, "wait", t, p)
        b = min(i for i, x in enumerate(steps) if x.kind == "backward" and t in reads_and_writes(s, x, roots)[0])
        # the device memory goes in the forward pass and comes back for the backward
        assert o < w < f < p < w2 < b and f < turn, (t, o, w, f, turn, p, w2, b)
    run = assert_same_results(g, s)
    runtime, plan = run[0], run[1]
    assert plan.host_bytes > 0 and runtime.host_peak == plan.host_bytes
    assert runtime.stalls == 0
    assert plan.peak_bytes < simulate(apply_policy(lower(g), "liveness")).peak_bytes


def test_superneurons_copies_are_valid_and_reuse_host_copies():
    """After recompute, a checkpoint read by a Recompute and later by its writer's backward has
    two gaps; the host copy of the first serves the second (a Prefetch that keeps it)."""
    g = tiny()
    s = apply_policy(lower(g), "superneurons")
    assert check_copies(s)
    keeps = [x.tensor for x in s.steps if x.kind == "prefetch" and x.keep]
    assert keeps
    for t in keeps:  # one Offload, two Prefetches
        assert s.steps.count(Offload(t)) == 1
        assert sum(x.kind == "prefetch" and x.tensor == t for x in s.steps) == 2
    runtime, plan = assert_same_results(g, s)[:2]
    assert runtime.stalls == 0 and runtime.host_peak == plan.host_bytes > 0


def offloads(schedule):
    return sum(s.kind == "offload" for s in schedule.steps)


def test_offload_under_a_budget_copies_only_what_it_must():
    g = tiny()
    full = apply_policy(lower(g), "offload")
    live = simulate(apply_policy(lower(g), "liveness"))
    # it fits without copies: the tensor cache keeps everything on the device
    s = apply_policy(lower(g), "offload", budget=live.arena_bytes)
    assert not [x for x in s.steps if x.kind in COPY] and simulate(s).host_bytes == 0
    # between what the smallest workspaces need with every copy and with none
    with_all = simulate(apply_policy(lower(g), "offload", budget=1)).peak_bytes
    with_none = simulate(apply_policy(lower(g), "liveness", budget=1)).peak_bytes
    assert with_all < with_none
    budget = (with_all + with_none) // 2
    for placement in ("dynamic", "planned"):
        s = apply_policy(lower(g), "offload", placement=placement, budget=budget)
        assert 0 < offloads(s) < offloads(full)
        check_copies(s)
        assert simulate(s).peak_bytes <= budget
        assert simulate(s).fits(budget)
        if placement == "planned":  # the workspaces in the room the tensors leave: no holes here
            assert simulate(s).arena_bytes == simulate(s).peak_bytes
        # the convolutions get smaller workspaces, hence other algorithms: the same to rounding
        runtime, plan = assert_same_results(g, s, exact=False)[:2]
        assert runtime.stalls == 0 and runtime.host_peak == plan.host_bytes


def test_a_budget_met_stays_met_when_raised_with_dynamic_placement():
    g = tiny()
    with_all = simulate(apply_policy(lower(g), "offload", budget=1)).peak_bytes
    with_none = simulate(apply_policy(lower(g), "liveness", budget=1)).peak_bytes
    met = None
    for budget in range(with_all, with_none + 1, 1024):
        fits = simulate(apply_policy(lower(g), "offload", budget=budget)).fits(budget)
        assert fits or met is None, f"{budget} B does not fit, {met} B did"
        met = budget if fits and met is None else met
    assert met is not None


def test_host_memory_bounds_the_offloaded_bytes():
    g = tiny()
    full = simulate(apply_policy(lower(g), "offload"))
    limit = full.host_bytes // 2
    s = apply_policy(lower(g), "offload", host_memory=limit)
    assert 0 < simulate(s).host_bytes <= limit
    assert 0 < offloads(s) < offloads(apply_policy(lower(g), "offload"))
    assert not [x for x in apply_policy(lower(g), "offload", host_memory=0).steps if x.kind in COPY]
    net = Net(load_spec(TINY), policy="offload", host_memory=limit)
    net.forward_backward(feed_of(g))
    assert 0 < net.host_bytes <= limit


def without(schedule, index):
    return schedule.replace(schedule.steps[:index] + schedule.steps[index + 1:])


def wait_index(schedule, after):
    """The index of the first Wait for a copy started by a step of kind ``after``."""
    started = {}
    for i, step in enumerate(schedule.steps):
        if step.kind in ("offload", "prefetch"):
            started[step.tensor] = step.kind
        elif step.kind == "wait" and started.pop(step.tensor) == after:
            return i


def test_a_missing_wait_for_an_offload_is_a_stall_and_results_stay_right():
    g = tiny()
    s = apply_policy(lower(g), "offload")
    broken = without(s, wait_index(s, "offload"))
    with pytest.raises(AssertionError, match="while its copy runs"):
        check_copies(broken)
    runtime = assert_same_results(g, broken)[0]
    assert runtime.stalls > 0


def test_a_missing_wait_for_a_prefetch_is_a_stall_and_results_stay_right():
    g = tiny()
    s = apply_policy(lower(g), "offload")
    broken = without(s, wait_index(s, "prefetch"))
    runtime = assert_same_results(g, broken)[0]
    assert runtime.stalls == 1


def test_one_missing_wait_is_one_stall():
    g = tiny()
    s = apply_policy(lower(g), "offload")
    runtime = execute(without(s, wait_index(s, "offload")))[0]
    assert runtime.stalls == 1


# -- the estimated timeline --------------------------------------------------------------------

def test_timeline_of_an_offload_schedule():
    g = tiny()
    model = CostModel("cpu")
    live = model.timeline(apply_policy(lower(g), "liveness", costs=model))
    s = apply_policy(lower(g), "offload", costs=model)
    t = model.timeline(s)
    copied = sum(s.tensors[x.tensor].nbytes for x in s.steps if x.kind in ("offload", "prefetch"))
    assert t.copied == copied > 0
    assert live.copied == 0 and live.stall == 0
    assert t.seconds >= live.seconds - 1e-12
    assert len(t.starts) == len(s.steps) and t.starts == sorted(t.starts)
    recomputing = model.timeline(apply_policy(lower(g), "recompute", costs=model))
    assert recomputing.recompute > 0 and recomputing.seconds > live.seconds


def test_a_wait_right_after_its_offload_stalls_for_the_whole_copy():
    g = tiny()
    slow = CostModel(DeviceModel("slow", flops=1e11, bandwidth=2e10, copy=1.0))
    s = apply_policy(lower(g), "liveness")
    i = s.steps.index(next(x for x in s.steps if x.kind == "forward" and g.nodes[x.node].name == "conv1"))
    t = root(s.tensors, "conv1")
    steps = s.steps[:i + 1] + [Offload(t), Wait(t)] + s.steps[i + 1:]
    base, timeline = slow.timeline(s), slow.timeline(s.replace(steps))
    # the copy stream is idle: the Wait holds the compute stream for nbytes / (1 byte/s)
    nbytes = s.tensors[t].nbytes
    assert timeline.stall == pytest.approx(nbytes)
    assert timeline.seconds == pytest.approx(base.seconds + nbytes)
    assert timeline.copied == nbytes


# -- plan equals run ---------------------------------------------------------------------------

@pytest.mark.parametrize("graph", [tiny, lambda: graph_of(DROPOUT)], ids=["tiny", "dropout"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("placement", ["dynamic", "planned"])
def test_plan_equals_run_for_every_policy(graph, policy, placement):
    g = graph()
    s = apply_policy(lower(g), policy, placement=placement)
    check_copies(s)
    runtime, plan = assert_same_results(g, s)[:2]
    assert (runtime.peak_bytes, runtime.arena_bytes) == (plan.peak_bytes, plan.arena_bytes)
    assert runtime.host_peak == plan.host_bytes
    assert runtime.stalls == 0
    assert plan.lower_bound_bytes <= plan.peak_bytes <= plan.arena_bytes
    if policy in ("offload", "superneurons", "superneurons+params"):
        assert plan.host_bytes > 0
    else:
        assert plan.host_bytes == 0
    if policy.endswith("+params"):  # only BatchNorm's statistics stay on the device
        assert plan.resident_bytes < apply_policy(lower(g), "superneurons").resident_bytes


@pytest.mark.parametrize("policy", ["liveness", "recompute", "offload", "superneurons"])
def test_caffe_in_place_chains_give_baselines_results_and_plan_equals_run(policy):
    """Every policy on a net written as Caffe writes it (all in place) computes baseline's
    losses and gradients bit for bit, over two iterations (BatchNorm's statistics and the
    Dropout mask carry over), with the kept values freed, offloaded or recomputed like any
    other tensor; and the planned peak is the run's."""
    g = graph_of(CAFFE_CHAIN)
    assert [g.node(f"scale{i}").kept for i in (1, 2, 3)] == [
        f"keeps 'conv{i}@bn{i}', read by the backward of 'scale{i}', 'bn{i}'" for i in (1, 2, 3)]
    assert g.node("drop").kept == "keeps 'conv3@relu3', read by the backward of 'relu3'"
    schedule = apply_policy(lower(g), policy)
    for iteration in (0, 1):
        assert_same_results(g, schedule, iteration)
    spec = loads_spec(CAFFE_CHAIN)
    nets = {p: Net(spec, policy=p, optimizer=make_optimizer(SolverConfig())) for p in ("baseline", policy)}
    for iteration in range(3):
        feed = feed_of(g, seed=iteration)
        losses = {p: net.train_step(feed, iteration) for p, net in nets.items()}
        assert losses[policy] == losses["baseline"] and np.isfinite(losses[policy])
    for name in nets["baseline"].param_names:  # weights and BatchNorm's statistics
        np.testing.assert_array_equal(nets[policy].param(name), nets["baseline"].param(name), err_msg=name)
    assert nets[policy].peak_bytes == nets[policy].plans["train"].peak_bytes
    assert nets[policy].peak_bytes < nets["baseline"].peak_bytes
