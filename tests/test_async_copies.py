"""The GPU's copies (runtime/copies.py StreamCopies) on a fake CUDA (tests/fake_cuda.py): an
Offload or a Prefetch returns without the host waiting for anything, only the device is
ordered at a Wait, the count of Waits that had to wait (``Runtime.blocked``) comes from the
copies' events, so it fails when a copy is not overlapped, and the results are the thread
copies' bit for bit."""

import numpy as np
from fake_cuda import FakeGPUBackend
from test_memory_passes import CHAIN, baseline, feed_of, graph_of, params_of

from superneuron.runtime.copies import StreamCopies
from superneuron.runtime.executor import Runtime
from superneuron.scheduler.lower import lower
from superneuron.scheduler.policy import apply_policy
from superneuron.scheduler.simulate import simulate


def _run(schedule, lag=None):
    graph = schedule.graph
    backend = FakeGPUBackend(lag)
    runtime = Runtime([schedule], backend, capacity=simulate(schedule).arena_bytes)
    for name, value in params_of(graph).items():
        runtime.resident[name][...] = value
    outputs = runtime.run(schedule, feed_of(graph))
    grads = {g: runtime.to_host(g) for n in graph.nodes for g in n.param_grads.values()}
    return runtime, backend.cuda, outputs, grads


def _offloaded():
    graph = graph_of(CHAIN)
    schedule = apply_policy(lower(graph), "offload")
    assert any(s.kind == "offload" for s in schedule.steps)
    return graph, schedule


def test_offload_and_prefetch_never_wait_on_the_host_and_compute_the_same_bits():
    graph, schedule = _offloaded()
    runtime, cuda, outputs, grads = _run(schedule)
    assert isinstance(runtime.copies, StreamCopies)
    starts = sum(s.kind in ("offload", "prefetch") for s in schedule.steps)
    assert len(cuda.copies) == starts and cuda.host_waits == []
    waits = sum(s.kind == "wait" for s in schedule.steps)
    # the fake device never caught up: every Wait found its copy running, and ordered the
    # compute stream after it instead of blocking the host
    assert runtime.blocked == waits and cuda.compute.device_waits == waits
    assert runtime.stalls == 0
    loss, ref, _ = baseline(graph)
    assert sum(n.loss_weight * outputs[n.name] for n in graph.losses) == loss
    for name, g in ref.items():
        np.testing.assert_array_equal(grads[name], g, err_msg=name)


def test_blocked_counts_only_the_waits_whose_copy_had_not_finished():
    """A copy lands once the next one has started (the fake device one copy behind): a Wait
    after another copy's start finds its copy done, one with none since is counted."""
    _, schedule = _offloaded()
    runtime, cuda, _, _ = _run(schedule, lag=1)
    expected, started = 0, {}
    for i, s in enumerate(schedule.steps):
        if s.kind in ("offload", "prefetch"):
            started[s.tensor] = i
        elif s.kind == "wait":
            between = schedule.steps[started.pop(s.tensor) + 1:i]
            expected += not any(x.kind in ("offload", "prefetch") for x in between)
    waits = sum(s.kind == "wait" for s in schedule.steps)
    assert 0 < runtime.blocked == expected < waits and cuda.host_waits == []


def test_close_waits_for_the_copies_and_drops_their_buffers():
    _, schedule = _offloaded()
    runtime, cuda, _, _ = _run(schedule)
    assert runtime.copies.in_flight  # the fake device never finished them: still referenced
    runtime.copies.close()
    assert runtime.copies.in_flight == [] and cuda.host_waits and cuda.open == []
