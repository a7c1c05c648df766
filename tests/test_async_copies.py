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


def test_the_link_is_measured_with_the_runtimes_own_copies_each_way_and_both_at_once():
    """measure_link (runtime/profile.py) times the copies the runtime makes: on a GPU, one
    memcpyAsync a direction on that direction's stream, the two of ``both`` both queued
    before the host waits for either, and the cost model's ``copy`` is the slower way."""
    from superneuron.backend import Backend
    from superneuron.runtime.profile import measure_copy_bandwidth, measure_link

    backend = FakeGPUBackend()
    cuda = backend.cuda

    class Waits(list):  # each host wait with the copies queued before it
        def append(self, what):
            super().append((what, len(cuda.copies)))
    cuda.host_waits = Waits()
    link = measure_link(backend, nbytes=4096, repeats=1)
    h2d, d2h = cuda.runtime.memcpyHostToDevice, cuda.runtime.memcpyDeviceToHost
    assert [kind for kind, _, _ in cuda.copies] == [h2d, d2h, h2d, d2h]
    assert all(n == 4096 for _, n, _ in cuda.copies)
    assert cuda.copies[2][2] != cuda.copies[3][2]  # each way on its own stream
    # each copy waited for by its event; the two of ``both`` after both were queued; then
    # close() drains the two streams
    assert cuda.host_waits == [("event", 1), ("event", 2), ("event", 4), ("event", 4), ("stream", 4), ("stream", 4)]
    assert set(link) == {"h2d", "d2h", "both"} and all(0 < v < float("inf") for v in link.values())
    cpu = Backend()
    assert 0 < measure_copy_bandwidth(cpu, nbytes=1 << 20, repeats=2) < float("inf")
