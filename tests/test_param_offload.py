"""Parameter offload (scheduler/params.py): learnable parameters, their gradients and the
optimiser's state live on the host; the device holds a parameter only around the steps that
read it, gradients go back as soon as their backward is done, and the update runs on the host.

Checked: where the pass puts its copies, that the device's resident region keeps only what is
not learnable, that training with it gives baseline's losses and parameters bit for bit over
several iterations (SGD and Adam, weight decay and clipping), plan equals run for device and
host bytes, the host updates overlapped with the backward, and the policy names and flag."""

import numpy as np
import pytest
from one_line import raises_one_line
from test_memory_passes import CHAIN, check_copies, feed_of, graph_of

from superneuron.errors import SNError
from superneuron.graph import Graph
from superneuron.net import Net
from superneuron.netfile.spec import load_spec
from superneuron.options import PlanOptions
from superneuron.scheduler.liveness import liveness
from superneuron.scheduler.lower import lower
from superneuron.scheduler.params import APPLY_LAG, offload_params
from superneuron.scheduler.policy import apply_policy, passes_of
from superneuron.scheduler.simulate import simulate
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig

TINY = "tests/nets/tiny.yaml"


@pytest.mark.parametrize("clip", [0, 1.0], ids=["per-parameter", "clipped"])
def test_parameters_gradients_and_optimizer_state_move_to_the_host(clip):
    g = graph_of(CHAIN)
    opt = make_optimizer(SolverConfig(type="Adam", clip_gradients=clip))
    s = offload_params(liveness(lower(g, optimizer=opt)))
    learnable = {n.params[k] for n in g.nodes for k in n.param_grads}
    grads = {n.param_grads[k] for n in g.nodes for k in n.param_grads}
    assert learnable and learnable <= set(s.host_resident)
    applied = {st.tensor for st in s.steps if st.kind == "apply"}
    if clip:  # the update needs every gradient at once: each keeps its host place
        assert grads <= set(s.host_resident) and not applied
    else:  # the diet: no host place, each host copy consumed by its update (an Apply)
        assert not grads & set(s.host_resident) and applied == grads
    # only BatchNorm's running statistics stay on the device
    assert s.resident and all(g.tensors[t].kind == "state" for t in s.resident if t in g.tensors)
    assert not any(t in learnable or t in grads for t in s.resident)
    # Adam's two moments per parameter live on the host too
    assert len([t for t in s.host_resident if t not in g.tensors]) >= 2 * len(learnable)
    check_copies(s)


def test_each_parameter_is_prefetched_before_the_step_that_reads_it_and_gradients_go_back():
    g = graph_of(CHAIN)
    s = offload_params(liveness(lower(g, optimizer=make_optimizer(SolverConfig()))))
    steps = s.steps
    labels = [st.describe(g) for st in steps]
    update = next(i for i, st in enumerate(steps) if st.kind == "update")
    for i, st in enumerate(steps):
        if st.kind not in ("forward", "backward", "recompute"):
            continue
        for t in g.nodes[st.node].params.values():
            if g.tensors[t].kind != "param":
                continue
            # waited for before this step, after a prefetch that comes before the wait
            waits = [j for j in range(i) if steps[j].kind == "wait" and steps[j].tensor == t]
            fetches = [j for j in range(i) if steps[j].kind == "prefetch" and steps[j].tensor == t]
            assert waits and fetches and fetches[-1] < waits[-1] < i, (labels[i], t)
            assert steps[fetches[-1]].keep, labels[fetches[-1]]  # the host master stays
        if st.kind == "backward":
            for gname in g.nodes[st.node].param_grads.values():
                off = [j for j in range(i, len(steps)) if steps[j].kind == "offload"
                       and steps[j].tensor == gname]
                wait = [j for j in range(i, len(steps)) if steps[j].kind == "wait"
                        and steps[j].tensor == gname]
                # copied back as soon as its backward is done: no compute step in between
                assert off and all(steps[k].kind in ("free", "offload", "wait", "prefetch", "apply")
                                   for k in range(i + 1, off[0])), (labels[i], gname)
                assert wait and wait[0] < update, (labels[i], gname)
                # the diet: its host copy goes once its update is done, after the copy landed and
                # at most APPLY_LAG compute steps later, before the Update
                (apply,) = [j for j in range(len(steps)) if steps[j].kind == "apply" and steps[j].tensor == gname]
                between = [k for k in range(wait[0], apply) if steps[k].kind in ("forward", "backward", "recompute")]
                assert wait[0] < apply < update and len(between) <= APPLY_LAG, (labels[i], gname)


def _train(spec, policy, solver, iters=3):
    net = Net(spec, policy=policy, optimizer=make_optimizer(solver))
    feed = feed_of(net.graph)
    losses = [net.train_step(feed, it) for it in range(iters)]
    return net, losses


@pytest.mark.parametrize("solver", [
    SolverConfig(type="SGD", momentum=0.9, weight_decay=0.01),
    SolverConfig(type="Adam", base_lr=0.01, weight_decay=0.001, clip_gradients=0.5),
], ids=["sgd", "adam-clipped"])
@pytest.mark.parametrize("policy", ["liveness+params", "superneurons+params"])
def test_training_with_parameters_on_the_host_matches_baseline_bit_for_bit(policy, solver):
    from superneuron.netfile.spec import loads_spec
    spec = loads_spec(CHAIN)
    base, base_losses = _train(spec, "baseline", solver)
    net, losses = _train(spec, policy, solver)
    assert losses == base_losses
    assert len(set(losses)) == len(losses)  # the parameters did move between iterations
    assert net.plans["train"].host_bytes > 0
    # each parameter's host update started as its gradient landed, during the backward;
    # clipping by the global norm has to wait for every gradient
    early = net.runtime.updater.early
    assert early == (0 if solver.clip_gradients > 0 else len(net.learnable_names))
    for name in base.param_names:
        np.testing.assert_array_equal(net.param(name), base.param(name), err_msg=name)


def test_parameter_offload_shrinks_the_resident_region_and_plan_equals_run():
    spec = load_spec(TINY)
    opt = SolverConfig(type="Adam")
    on_device = Net(spec, policy="superneurons", optimizer=make_optimizer(opt))
    on_host = Net(spec, policy="superneurons+params", optimizer=make_optimizer(opt))
    assert on_host.plans["train"].resident_bytes < on_device.plans["train"].resident_bytes / 4
    feed = feed_of(on_host.graph)
    on_host.train_step(feed, 0)
    plan, rt = on_host.plans["train"], on_host.runtime
    assert rt.peak_bytes == max(p.peak_bytes for p in on_host.plans.values())
    assert rt.host_peak == max(p.host_bytes for p in on_host.plans.values())
    assert rt.stalls == 0
    assert plan.host_bytes >= sum(t.nbytes for name, t in on_host.graph.tensors.items()
                                  if t.kind == "param" and name in on_host.learnable_names)


def test_policy_names_with_params():
    options = PlanOptions.of("superneurons+params")  # the suffix is read once, into the options
    assert (options.policy, options.offload_params, options.name) == ("superneurons", True, "superneurons+params")
    assert len(passes_of("superneurons", True)) == len(passes_of("superneurons")) + 1
    with raises_one_line(SNError, match="baseline"):
        PlanOptions.of("baseline+params")
    with raises_one_line(SNError, match="unknown policy"):
        PlanOptions.of("lifeness+params")
    g = Graph(load_spec(TINY))
    s = apply_policy(lower(g, optimizer=make_optimizer(SolverConfig())), "offload+params")
    assert simulate(s).host_bytes > 0 and s.host_resident


def _host_walk(schedule):
    """``(host-resident bytes, most gradient bytes in flight)`` of ``schedule``, walked here:
    a gradient's Offload takes its host copy, its Apply gives it back (256-byte aligned)."""
    size = {t: -(-schedule.tensors[t].nbytes // 256) * 256 for t in schedule.tensors}
    flight = most = 0
    for step in schedule.steps:
        if step.kind == "offload" and schedule.tensors[step.tensor].kind == "param_grad" \
                and step.tensor not in schedule.host_resident:
            flight += size[step.tensor]
        elif step.kind == "apply":
            flight -= size[step.tensor]
        most = max(most, flight)
    return sum(size[t] for t in schedule.host_resident), most


@pytest.mark.parametrize("policy", ["liveness+params", "superneurons+params"])
def test_the_host_diet_keeps_only_the_gradients_in_flight(policy):
    """The host bytes of the plan with the diet are those without it (every gradient with a
    host place, as when clipping needs them all) less every gradient plus the most in flight."""
    spec = load_spec(TINY)
    plans = {}
    for clip in (0, 1.0):  # momentum in both: the same optimiser state
        net = Net(spec, policy=policy, optimizer=make_optimizer(SolverConfig(momentum=0.9, clip_gradients=clip)))
        plans[clip] = (net.schedules["train"], net.plans["train"], net)
    (diet, after, net), (whole, before, _) = plans[0], plans[1]
    grads = [g for n in net.graph.nodes for g in n.param_grads.values()]
    grad_bytes = sum(-(-net.graph.tensors[g].nbytes // 256) * 256 for g in grads)
    resident_before, in_flight_before = _host_walk(whole)
    resident_after, in_flight = _host_walk(diet)
    assert in_flight_before == 0 and resident_after == resident_before - grad_bytes
    assert 0 < in_flight < grad_bytes
    if policy == "liveness+params":  # nothing else on the host
        assert before.host_bytes == resident_before
        assert after.host_bytes == before.host_bytes - grad_bytes + in_flight
    else:  # offloaded activations too, most of them at the turn, before any gradient
        assert before.host_bytes - grad_bytes <= after.host_bytes <= before.host_bytes - grad_bytes + in_flight
    # the run: its host peak is the plan's, and its results are the same policy's on the device
    feed = feed_of(net.graph)
    twin = Net(spec, policy=policy.replace("+params", ""), optimizer=make_optimizer(SolverConfig(momentum=0.9)))
    for it in range(3):
        assert net.train_step(feed, it) == twin.train_step(feed, it)
    for name in net.param_names:
        np.testing.assert_array_equal(net.param(name), twin.param(name), err_msg=name)
    assert net.runtime.host_peak == after.host_bytes and net.runtime.stalls == 0
    assert net.runtime.updater.early == len(net.learnable_names)
    with raises_one_line(SNError, match="consumes each gradient as it lands"):
        net.grad(net.learnable_names[0])
