"""NCCL's path on one card: a schedule planned for two ranks (its AllReduce and WaitReduce
steps, synchronised BatchNorm's sums) run with a communicator of one rank (SoloNccl) computes
what the one-rank schedule computes, bit for bit, with no host wait inside the iteration (the
compute stream waits for NCCL's events; the deadline is polled once, at the end). On the CPU
through a fake CUDA and a fake NCCL (tests/fake_cuda.py); on a GPU for real (marked gpu)."""

import collections
import types

import numpy as np
import pytest
from fake_cuda import FakeGPUBackend, FakeNccl
from test_memory_passes import CHAIN, feed_of, graph_of, params_of

from superneuron.backend import Backend
from superneuron.errors import SNError
from superneuron.runtime.executor import Runtime
from superneuron.runtime.mpi_group import NoAnswer
from superneuron.runtime.nccl import SoloNccl, nccl_module
from superneuron.scheduler.lower import lower
from superneuron.scheduler.policy import apply_policy
from superneuron.scheduler.simulate import simulate
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig


def _run(backend, ranks, group=None, sync_bn=False):
    graph, optimizer = graph_of(CHAIN), make_optimizer(SolverConfig(momentum=0.9))
    schedule = apply_policy(lower(graph, optimizer=optimizer), "liveness", ranks=ranks, bucket_bytes=512)
    runtime = Runtime([schedule], backend, capacity=simulate(schedule).arena_bytes, group=group, sync_bn=sync_bn)
    for name, value in params_of(graph).items():
        runtime.resident[name][...] = backend.xp.asarray(value)
    outputs = runtime.run(schedule, feed_of(graph), iteration=0, optimizer=optimizer)
    return schedule, runtime, outputs, {name: runtime.to_host(name) for name in runtime.resident}


def _fake_cupy(backend):
    nccl = FakeNccl()
    backend.cuda.nccl = nccl
    return types.SimpleNamespace(cuda=backend.cuda), nccl


@pytest.mark.parametrize("sync_bn", [False, True], ids=["plain", "sync_bn"])
def test_one_rank_through_nccl_changes_no_bit_and_never_waits_on_the_host(sync_bn):
    _, _, ref_out, ref = _run(Backend(), 1)
    backend = FakeGPUBackend()
    backend.cuda.idle = True  # the device keeps up: NCCL's sums have ended when the end asks
    cupy, nccl = _fake_cupy(backend)
    schedule, runtime, outputs, state = _run(backend, 2, SoloNccl(cupy, timeout=5), sync_bn)
    buckets = sum(s.kind == "allreduce" for s in schedule.steps)
    assert buckets > 1
    batchnorms = sum(n.layer.type == "BatchNorm" for n in schedule.graph.nodes)
    # one sum per bucket, and with sync_bn one per BatchNorm's forward and backward statistics
    assert len(nccl.sums) >= buckets + (2 * batchnorms if sync_bn else 0)
    assert backend.cuda.host_waits == [] and runtime.group.unsettled == []
    if not sync_bn:
        assert outputs == ref_out
        for name, value in ref.items():
            np.testing.assert_array_equal(state[name], value, err_msg=name)
        return
    # synchronised BatchNorm sums its statistics before dividing: the same within float32 rounding
    assert outputs["loss"] == pytest.approx(ref_out["loss"], rel=1e-6)
    for name, value in ref.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_an_nccl_sum_that_never_ends_is_no_answer_at_the_end_of_the_iteration():
    backend = FakeGPUBackend()  # never idle: NCCL's events never complete
    cupy, nccl = _fake_cupy(backend)
    with pytest.raises(NoAnswer, match="all-reduces of iteration 0"):
        _run(backend, 2, SoloNccl(cupy, timeout=0.2))
    assert nccl.aborted


def test_missing_nccl_is_one_line_naming_the_extras():
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(nccl=types.SimpleNamespace(available=False)))
    with pytest.raises(SNError, match=r"NCCL cannot be used .*nvidia-nccl-cu12"):
        nccl_module(cupy)


@pytest.mark.gpu
def test_one_rank_through_nccl_on_the_gpu_changes_no_bit():
    import cupy

    from superneuron.backend import get_backend
    _, _, ref_out, ref = _run(get_backend("gpu"), 1)
    _, runtime, outputs, state = _run(get_backend("gpu"), 2, SoloNccl(cupy, timeout=60))
    assert outputs == ref_out and runtime.syncs_inside == collections.Counter()  # the one-kernel SGD's flag
    for name, value in ref.items():
        np.testing.assert_array_equal(state[name], value, err_msg=name)
