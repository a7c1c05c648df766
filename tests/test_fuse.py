"""Fused recomputation (scheduler/fuse.py): a Scale or a two-way Eltwise sum recomputed with
the in-place ReLU after it in one pass gives the bits of the two passes, and the schedules
that fuse them give baseline's losses and gradients bit for bit, for less estimated time."""

import numpy as np
import pytest
from layer_harness import build
from test_memory_passes import assert_same_results, execute

from superneuron.graph import Graph
from superneuron.layers import parallel
from superneuron.layers.base import Algo, Context
from superneuron.layers.norm import ScaleAfter
from superneuron.netfile.spec import load_spec
from superneuron.scheduler import fuse
from superneuron.scheduler.context import Context as Planning
from superneuron.scheduler.cost import CostModel
from superneuron.scheduler.liveness import Roots
from superneuron.scheduler.lower import lower
from superneuron.scheduler.optimal_stashes import stashes_of
from superneuron.scheduler.policy import LAST, LIVENESS, apply_policy
from superneuron.scheduler.recompute import recompute_joins
from superneuron.scheduler.simulate import simulate
from superneuron.scheduler.steps import MEMORY

CASES = [("Scale", [(4, 6, 5, 7)], {"bias_term": True}), ("Scale", [(4, 6, 5, 7)], {"bias_term": False}),
         ("Scale", [(4, 6)], {"bias_term": True}), ("Scale", [(3, 4, 6, 5)], {"axis": 2, "bias_term": True}),
         ("Eltwise", [(4, 6, 5, 7), (4, 6, 5, 7)], {})]


def _values(shape, rng):
    """Normal values with zeros, negative zeros and NaNs among them: where max(x, 0) could
    differ from a careless fused form."""
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[::11], flat[5::13], flat[7::29] = 0.0, -0.0, np.nan
    return x


def _forward(layer, params, bottoms, xp, relu):
    top = xp.zeros(layer.top_shapes[0], layer.dtype)
    layer.forward(Context(xp, recompute=True, relu=relu), bottoms, [top], params)
    return top


def _then_relu(layer, params, bottoms, xp):
    """The layer's forward, then ReLU's forward in place on its top: what the fused pass replaces."""
    relu, _ = build("ReLU", [layer.top_shapes[0]], dtype=np.float32)
    top = _forward(layer, params, bottoms, xp, False)
    relu.forward(Context(xp), [top], [top], {})
    return top


@pytest.mark.parametrize("type_name, shapes, cfg", CASES)
@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("cache_bytes", [None, 64])
def test_a_fused_relu_gives_the_bits_of_the_relu_after_it(type_name, shapes, cfg, threads, cache_bytes,
                                                          monkeypatch):
    """Layer.fuses_relu's contract: the forward with ctx.relu writes what the forward and then
    an in-place ReLU write, bit for bit (NaNs, zeros and -0.0 included), on one thread and
    split over several, its output taken whole or a few values at a time (``CACHE_BYTES``)."""
    if cache_bytes:
        monkeypatch.setattr(parallel, "CACHE_BYTES", cache_bytes)
    layer, params = build(type_name, shapes, dtype=np.float32, **cfg)
    assert layer.fuses_relu()
    rng = np.random.default_rng(3)
    bottoms = [_values(s, rng) for s in shapes]
    fused = _forward(layer, params, bottoms, np, True)
    assert np.array_equal(fused.view(np.uint32), _then_relu(layer, params, bottoms, np).view(np.uint32))
    assert not np.array_equal(fused.view(np.uint32), _forward(layer, params, bottoms, np, False).view(np.uint32))


def test_only_one_pass_forms_fuse():
    """An Eltwise that is not a plain sum of two bottoms makes more than one pass: it does not
    offer to fuse, so the pass never asks it."""
    assert not build("Eltwise", [(2, 3), (2, 3), (2, 3)], dtype=np.float32)[0].fuses_relu()
    assert not build("Eltwise", [(2, 3), (2, 3)], dtype=np.float32, coeff=[1.0, -1.0])[0].fuses_relu()
    assert not build("Eltwise", [(2, 3), (2, 3)], dtype=np.float32, operation="MAX")[0].fuses_relu()
    assert not build("ReLU", [(2, 3)], dtype=np.float32)[0].fuses_relu()


def _resnet():
    return Graph(load_spec("nets/resnet_cifar.yaml", overrides={"depth": 8, "size": 8}, batch=2))


def _recompute(graph, fused=True):
    """``graph`` with its cheap layers and every other join recomputed (the ``recompute+params``
    policy's recomputation, without its parameter offload), fuse.py's pass left out unless
    ``fused``."""
    schedule, context = lower(graph), Planning()
    for apply in (recompute_joins,) + LIVENESS + LAST:
        if fused or apply is not fuse.fuse_recomputes:
            schedule = apply(schedule, context)
    return schedule


def test_recompute_fuses_each_scale_and_sum_with_its_relu_and_keeps_baselines_bits():
    """Recomputed, a CIFAR ResNet's Scales and block sums each run their ReLU
    in their pass, which is then no step of its own; the losses and gradients are baseline's
    bit for bit; the estimated time is the unfused schedule's less the ReLUs' passes (their
    flops kept)."""
    graph = _resnet()
    schedule, unfused = _recompute(graph), _recompute(graph, fused=False)
    into = {n: s.node for s in schedule.steps if s.fused is not None for n in s.fused}
    assert {graph.nodes[n].layer.type for n in into.values()} == {"Scale", "Eltwise"}
    assert all(len(s.fused) == 1 for s in schedule.steps if s.fused is not None)
    assert not any(s.kind == "recompute" and s.node in into for s in schedule.steps)
    assert all(any(s.kind == "recompute" and s.node == relu for s in unfused.steps) for relu in into)
    assert not any(s.fused is not None for s in unfused.steps)
    assert_same_results(graph, schedule)
    model = CostModel("gpu")
    gained = model.iteration_seconds(unfused) - model.iteration_seconds(schedule)
    passes = sum(model.step_seconds(unfused, s) - model.fused_seconds(graph.nodes[s.node].layer)
                 for s in unfused.steps if s.kind == "recompute" and s.node in into)
    assert gained > 0 and gained == pytest.approx(passes, rel=1e-9)


def test_the_offload_pass_times_recomputed_relus_as_the_fusion_leaves_them():
    """fuse.seconds_once_fused, by which the offload pass (before the fusion) times its copies:
    each step of the unfused schedule at what it will cost once fused, a ReLU taken into the
    Recompute before it at what it adds there; in all, the fused schedule's compute time."""
    graph, model = _resnet(), CostModel("gpu")
    schedule, unfused = _recompute(graph), _recompute(graph, fused=False)
    into = {n for s in schedule.steps if s.fused is not None for n in s.fused}
    steps = [s for s in unfused.steps if s.kind not in MEMORY]
    seconds = fuse.seconds_once_fused(unfused, steps, model)
    for step, t in zip(steps, seconds, strict=True):
        if step.kind == "recompute" and step.node in into:
            assert t == model.fused_seconds(graph.nodes[step.node].layer) < model.step_seconds(unfused, step)
        else:
            assert t == model.step_seconds(unfused, step)
    assert sum(seconds) == pytest.approx(sum(model.step_seconds(schedule, s) for s in schedule.steps), rel=1e-12)


def _scaled_resnet():
    """A CIFAR ResNet big enough for its maps to outweigh its parameters, planned by optimal
    at 45 % of liveness's activations (H100 estimates): it recomputes units whole."""
    graph = Graph(load_spec("nets/resnet_cifar.yaml", overrides={"depth": 8, "size": 16}, batch=16))
    live = simulate(apply_policy(lower(graph), "liveness"))
    budget = int(live.resident_bytes + 0.45 * (live.arena_bytes - live.resident_bytes))
    return graph, budget


def test_a_batchnorm_recomputed_before_its_scale_writes_both_in_one_pass_with_the_same_bits(monkeypatch):
    """Where optimal recomputes a unit whole, each BatchNorm recomputed right before its Scale
    becomes one step, ``Recompute(bn, fused=(scale, relu))``, at the Scale's place (its top
    allocated before it, the BatchNorm's workspace around it); the run gives the unfused plan's
    losses and gradients bit for bit, no higher a peak, and the estimate loses each Scale's
    pass but its writes. Where the BatchNorm's scratch beside the Scale's top would lift the
    peak, nothing is fused."""
    graph, budget = _scaled_resnet()
    model = CostModel("gpu")
    schedule = apply_policy(lower(graph), "optimal", memory=budget, costs=model)
    monkeypatch.setattr(fuse, "scale_fusable", lambda *args: False)  # the same plan, no Scale taken in
    unfused = apply_policy(lower(graph), "optimal", memory=budget, costs=model)
    monkeypatch.undo()
    def recomputed(plan):
        return sorted(n for s in plan.steps if s.kind == "recompute" for n in (s.node, *(s.fused or ())))
    assert recomputed(schedule) == recomputed(unfused)
    steps = [s for s in schedule.steps if s.fused is not None and graph.nodes[s.node].layer.type == "BatchNorm"]
    assert len(steps) >= 2
    for step in steps:
        scale, relu = (graph.nodes[n] for n in step.fused)
        assert (scale.layer.type, relu.layer.type) == ("Scale", "ReLU")
        assert not any(s.kind == "recompute" and s.node in step.fused for s in schedule.steps)
        i = schedule.steps.index(step)
        before = [(s.kind, s.tensor) for s in schedule.steps[:i]]
        assert ("alloc", scale.tops[0]) in before and ("alloc", step.workspace) in before
        assert (schedule.steps[i + 1].kind, schedule.steps[i + 1].tensor) == ("free", step.workspace)
    plan = simulate(schedule)
    assert plan.peak_bytes <= simulate(unfused).peak_bytes and plan.arena_bytes <= budget
    # (optimal's algorithms at the H100's rates are not baseline's: the unfused plan's bits)
    ran, before = execute(schedule), execute(unfused)
    assert np.isfinite(ran[2]) and ran[2] == before[2]
    for name, grad in before[3].items():
        np.testing.assert_array_equal(ran[3][name], grad, err_msg=name)
    def compute(plan):  # the compute stream's seconds (the timeline adds the copies' waits)
        return sum(model.step_seconds(plan, s) for s in plan.steps)
    scales = 0.0  # each Scale's own pass, less its writes (its ReLU is in the pass either way)
    for node in (graph.nodes[t.fused[0]] for t in steps):
        own = model.algo_seconds(node.layer, "forward", node.layer.algorithms("forward")[0])
        scales += own - model.fused_seconds(node.layer, schedule.tensors[node.tops[0]].nbytes)
    assert scales > 0 and compute(unfused) - compute(schedule) == pytest.approx(scales, rel=1e-9)
    assert model.iteration_seconds(schedule) < model.iteration_seconds(unfused)
    # the BatchNorm's scratch made larger than any room: no BatchNorm takes its Scale in
    bn = next(n.layer for n in graph.nodes if n.layer.type == "BatchNorm")
    huge = [Algo("default", 1 << 40)]
    monkeypatch.setattr(type(bn), "algorithms", lambda layer, phase: huge)
    assert not any(s.fused is not None and graph.nodes[s.node].layer.type == "BatchNorm"
                   for s in fuse.fuse_recomputes(unfused).steps)


@pytest.mark.parametrize("bias, relu", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_a_batchnorm_writing_its_scale_gives_the_bits_of_the_scale_after_it(bias, relu, threads, monkeypatch):
    """BatchNorm.fuses_scale's contract: its training forward with ctx.scale writes x_hat and
    what the Scale's forward (then its ReLU) writes after it, bit for bit, split over the
    threads and a few values at a time; the statistics it keeps are the same."""
    monkeypatch.setattr(parallel, "CACHE_BYTES", 256)
    shape = (6, 5, 4, 3)
    bn, bn_params = build("BatchNorm", [shape], dtype=np.float32)
    scale, scale_params = build("Scale", [shape], dtype=np.float32, bias_term=bias)
    assert bn.fuses_scale(scale) and not build("BatchNorm", [shape], dtype=np.float32,
                                                use_global_stats=True)[0].fuses_scale(scale)
    rng = np.random.default_rng(5)
    x = _values(shape, rng)
    x[np.isnan(x)] = 1.0  # (a NaN would make every value of its channel NaN)
    for k in scale_params:
        scale_params[k][...] = rng.standard_normal(scale_params[k].shape)
    room = np.zeros(bn.algorithms("forward")[0].workspace, np.uint8)

    def run(fused):
        params = {k: v.copy() for k, v in bn_params.items()}
        y, z = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        after = ScaleAfter(scale, scale_params, z) if fused else None
        bn.forward(Context(workspace=room, scale=after, relu=relu), [x], [y], params)
        if not fused:
            scale.forward(Context(relu=relu), [y], [z], scale_params)
        return y, z, params
    (y1, z1, p1), (y2, z2, p2) = run(True), run(False)
    for a, b in [(y1, y2), (z1, z2), *((p1[k], p2[k]) for k in p1)]:
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    assert (z1 == 0).any() == relu and not np.array_equal(y1, z1)


def test_the_program_counts_a_fused_relu_at_its_flops_alone():
    """optimal's program prices recomputing a root that a Scale writes and an in-place ReLU
    then overwrites as the Scale's forward and the ReLU's flops: the cost of the fused step."""
    graph = _resnet()
    schedule = apply_policy(lower(graph), "liveness")
    model = CostModel("gpu")
    steps = [s for s in schedule.steps if s.kind not in ("alloc", "free")]
    fastest = [model.step_seconds(schedule, s) for s in steps]
    roots = Roots.of(schedule)
    stashes, _ = stashes_of(schedule, steps, roots, model, fastest, False)
    checked = 0
    for stash in stashes:
        writers = [n for n in graph.nodes if n.tops and roots(n.tops[0]) == stash.root and not n.layer.ALIAS_TOPS]
        types = [n.layer.type for n in writers]
        if types == ["Scale", "ReLU"] and stash.recompute_seconds is not None:
            scale, relu = writers
            expected = model.algo_seconds(scale.layer, "forward", scale.layer.algorithms("forward")[0])
            assert stash.recompute_seconds == pytest.approx(expected + model.fused_seconds(relu.layer))
            own = model.algo_seconds(relu.layer, "forward", relu.layer.algorithms("forward")[0])
            assert model.fused_seconds(relu.layer) < 0.1 * own
            # on the CPU the fused ReLU is counted at its own pass: no gain is measured there
            assert CostModel("cpu").fused_seconds(relu.layer) == CostModel("cpu").algo_seconds(
                relu.layer, "forward", relu.layer.algorithms("forward")[0])
            checked += 1
    assert checked



@pytest.mark.gpu
@pytest.mark.parametrize("type_name, shapes, cfg", CASES)
def test_a_fused_relu_on_gpu_gives_the_bits_of_the_relu_after_it(type_name, shapes, cfg):
    """The same contract for the CUDA kernels (``scale_relu``, ``scale_bias_relu``,
    ``add_relu``) against CuPy's own forward and ReLU kernels."""
    import cupy
    layer, params = build(type_name, shapes, dtype=np.float32, **cfg)
    rng = np.random.default_rng(3)
    bottoms = [cupy.asarray(_values(s, rng)) for s in shapes]
    params = {k: cupy.asarray(v) for k, v in params.items()}
    fused = _forward(layer, params, bottoms, cupy, True)
    assert cupy.array_equal(fused.view(cupy.uint32), _then_relu(layer, params, bottoms, cupy).view(cupy.uint32))


@pytest.mark.gpu
@pytest.mark.parametrize("bias, relu", [(True, True), (False, False)])
def test_a_batchnorm_writing_its_scale_on_gpu_gives_the_bits_of_the_scale_after_it(bias, relu):
    """BatchNorm.fuses_scale's contract for the CUDA kernels (``bn_normalize_scale[_bias]``)
    against BatchNorm's forward and then the Scale's, on CuPy."""
    import cupy
    shape = (16, 8, 5, 5)
    bn, bn_params = build("BatchNorm", [shape], dtype=np.float32)
    scale, scale_params = build("Scale", [shape], dtype=np.float32, bias_term=bias)
    rng = np.random.default_rng(7)
    x = cupy.asarray(rng.standard_normal(shape).astype(np.float32))
    scale_params = {k: cupy.asarray(rng.standard_normal(v.shape).astype(np.float32)) for k, v in scale_params.items()}
    room = cupy.zeros(bn.algorithms("forward")[0].workspace, cupy.uint8)

    def run(fused):
        y, z = cupy.zeros(shape, cupy.float32), cupy.zeros(shape, cupy.float32)
        ctx = Context(cupy, workspace=room, relu=relu, scale=ScaleAfter(scale, scale_params, z) if fused else None)
        bn.forward(ctx, [x], [y], {k: cupy.asarray(v) for k, v in bn_params.items()})
        if not fused:
            scale.forward(Context(cupy, relu=relu), [y], [z], scale_params)
        return y, z
    for a, b in zip(run(True), run(False), strict=True):
        assert cupy.array_equal(a.view(cupy.uint32), b.view(cupy.uint32))
