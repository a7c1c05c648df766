"""``--cuda-graph`` (runtime/graphs.py) on the CPU: what stops a capture, said in one line, the
run then unchanged; and the capture and replay wiring driven through a stand-in for CUDA's
stream capture whose "graph" is the captured iteration's steps, replayed with every host value
they were captured with (the iteration number among them), as a CUDA graph replays its kernels'
arguments. So only what the graph reads from memory refreshed before each launch (the batch, the
learning rate) can differ between replays: the same losses and parameters as a run without it
show that it is refreshed, and that nothing else the iteration needs changed."""

import contextlib
import json
import os
import types

import numpy as np
import pytest
from test_memory_passes import CAFFE_CHAIN, graph_of
from test_net import feed_for, small_net

from superneuron.backend import Backend
from superneuron.runtime import graphs
from superneuron.scheduler.allocator import Allocator
from superneuron.scheduler.lower import lower
from superneuron.train import optim_kernels
from superneuron.train.optim import Optimizer, make_optimizer
from superneuron.train.solver_config import SolverConfig

FINITE = "the losses' finiteness, before the update"
TINY = os.path.join(os.path.dirname(__file__), "nets", "tiny.yaml")


class FakeGraphs:
    """Stream capture as CUDA does it, on NumPy: capturing records the steps without running
    them, a launch runs them again with the arguments they were captured with."""

    def __init__(self):
        self.captures = self.launches = 0

    @contextlib.contextmanager
    def running(self, pool=False):
        yield

    def capture(self, steps):
        self.captures += 1
        return steps

    def launch(self, graph):
        self.launches += 1
        return graph()


class GraphBackend(Backend):
    """The CPU backend with the stand-in capture."""

    def __init__(self):
        super().__init__()
        self.fake = FakeGraphs()

    def graph_api(self):
        return self.fake


class DeviceGuard(Optimizer):
    """SGD as the GPU's one-kernel update is: the losses' finiteness taken as a flag, no sync."""

    def guards_on_device(self, xp):
        return True


def _batches(net, n):
    return [feed_for(net, seed=k) for k in range(n)]


def _train(net, batches):
    return [net.train_step(feed, it) for it, feed in enumerate(batches)]


def _nets(path="nets/lenet.yaml", solver=None, policy="baseline", optimizer=DeviceGuard):
    solver = solver or SolverConfig(momentum=0.9, weight_decay=1e-3)
    plain = small_net(path, policy=policy, optimizer=optimizer(solver))
    graphed = small_net(path, policy=policy, optimizer=optimizer(solver), device=GraphBackend(),
                        cuda_graph=True)
    return plain, graphed


def _same_params(a, b):
    for name in a.param_names:
        np.testing.assert_array_equal(a.param(name), b.param(name), err_msg=name)


@pytest.mark.parametrize("policy", ["baseline", "superneurons"])
def test_replays_give_the_losses_and_parameters_of_a_run_without(policy):
    """Four iterations on four batches: one warm-up, one captured, two replayed; every loss and
    every parameter the same bits as without the graph (superneurons: its offloads and
    prefetches, on the copy threads, are in the captured steps)."""
    plain, graphed = _nets(policy=policy)
    assert (policy == "superneurons") == any(s.kind == "offload" for s in graphed.schedules["train"].steps)
    batches = _batches(plain, 4)
    losses = _train(plain, batches)
    assert len(set(losses)) == 4  # each batch its own loss: a replay on a stale batch would show
    assert _train(graphed, batches) == losses
    _same_params(plain, graphed)
    fake = graphed.backend.fake
    assert (fake.captures, fake.launches, graphed.graphs.replays) == (1, 3, 2)
    assert graphed.graph_line == "cuda graph: on: captured at iteration 1, replayed since"
    np.testing.assert_array_equal(graphed.blob("ip2"), plain.blob("ip2"))  # the last replay's top


def test_a_learning_rate_the_update_takes_from_the_host_stops_the_capture_after_the_warm_up():
    """The rate of lr_policy step changes, and the NumPy update takes it as a host number, which
    a replay would repeat: no capture, and the run is the run without the flag."""
    solver = SolverConfig(momentum=0.9, lr_policy="step", stepsize=1, gamma=0.5)
    plain, graphed = _nets(solver=solver)
    batches = _batches(plain, 3)
    assert _train(graphed, batches) == _train(plain, batches)
    _same_params(plain, graphed)
    assert graphed.backend.fake.captures == 0
    assert graphed.graph_line == ("cuda graph: off (the learning rate changes (lr_policy step) and this "
                                  "update takes it from the host)")


def test_a_host_sync_in_the_warm_up_stops_the_capture():
    plain, graphed = _nets(optimizer=Optimizer)  # its finiteness guard reads the losses back
    batches = _batches(plain, 3)
    assert _train(graphed, batches) == _train(plain, batches)
    assert graphed.graph_line == f"cuda graph: off (a host sync inside the iteration: {FINITE})"


def test_on_the_cpu_the_flag_says_why_not_and_changes_nothing():
    solver = SolverConfig(momentum=0.9)
    plain = small_net("nets/lenet.yaml", optimizer=make_optimizer(solver))
    flagged = small_net("nets/lenet.yaml", optimizer=make_optimizer(solver), cuda_graph=True)
    assert flagged.graph_line == "cuda graph: off (CPU backend)" and plain.graph_line is None
    batches = _batches(plain, 2)
    assert _train(flagged, batches) == _train(plain, batches)
    _same_params(plain, flagged)


def test_a_failed_capture_runs_the_iteration_as_usual_and_says_why():
    plain, graphed = _nets()

    def broken(steps):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")
    graphed.backend.fake.capture = broken
    batches = _batches(plain, 3)
    assert _train(graphed, batches) == _train(plain, batches)
    _same_params(plain, graphed)
    assert graphed.graph_line == ("cuda graph: off (capture failed: RuntimeError: operation not permitted "
                                  "when stream is capturing)")


def _runtime(**kw):
    fields = dict(backend=Backend(), group=None, host_update=False, graph=None)
    fields.update(kw)
    return types.SimpleNamespace(**fields)


def test_what_stops_a_capture_before_the_first_iteration():
    schedule = types.SimpleNamespace(rounds=1, steps=[], train=True)
    api = FakeGraphs()
    assert graphs.blocker(_runtime(backend=Backend()), schedule, None) == "CPU backend"
    assert graphs.blocker(_runtime(group=types.SimpleNamespace(size=4)), schedule, api).startswith(
        "data-parallel over 4 ranks")
    assert graphs.blocker(_runtime(host_update=True), schedule, api) == "parameter offload: the update runs on the host"
    assert graphs.blocker(_runtime(), types.SimpleNamespace(rounds=2, steps=[], train=True), api).startswith(
        "iter_size 2:")
    assert graphs.blocker(_runtime(), schedule, api) is None


def test_a_layer_that_draws_or_runs_host_code_stops_a_capture():
    graph = graph_of(CAFFE_CHAIN)  # a Dropout after the last ReLU
    runtime = _runtime(graph=graph)
    train, test = (lower(graph, train=t) for t in (True, False))
    assert graphs.blocker(runtime, train, FakeGraphs()) == (
        "random numbers drawn each iteration from a host seed: Dropout layer 'drop'")
    assert graphs.blocker(runtime, test, FakeGraphs()) is None  # Dropout passes everything in TEST
    graph.nodes[1].layer.HOST_CODE = True  # as a Python layer's
    assert graphs.blocker(runtime, train, FakeGraphs()) == (
        f"a layer with host-side work: Convolution layer '{graph.nodes[1].name}'")


def test_what_the_optimiser_lets_a_replay_repeat():
    assert Optimizer(SolverConfig(type="Adam")).replay_blocker(np).startswith("solver Adam:")
    assert DeviceGuard(SolverConfig(momentum=0.9)).replay_blocker(np) is None
    assert DeviceGuard(SolverConfig(lr_policy="step", stepsize=1)).replay_blocker(np).startswith(
        "the learning rate changes (lr_policy step)")
    assert DeviceGuard(SolverConfig(warmup_iter=5)).replay_blocker(np).startswith("the learning rate changes")
    fused = DeviceGuard(SolverConfig(lr_policy="step", stepsize=1))
    fused._fused = object()  # the one-kernel SGD ran: its rates are device tables
    assert fused.replay_blocker(np) is None
    assert fused.replay_blocker(types) is None  # (any module but NumPy: a device's)
    fused._fused, fused.fused_missing = False, "CompileException: nvrtc"
    assert fused.replay_blocker(types) == ("the update took SGD's per-parameter path, which reads host values "
                                           "(CompileException: nvrtc)")


def test_the_placement_kept_for_replays_is_all_that_reset_starts_anew():
    fresh = Allocator()
    fresh.resident.clear()
    assert set(vars(fresh)) - {"capacity", "resident", "resident_end"} == set(graphs.PLACEMENT)


class _DeviceArray(np.ndarray):
    def set(self, host):  # cupy.ndarray.set: a copy from the host
        self[...] = host


class _FakeCupy:
    """The few names of CuPy the one-kernel SGD uses, on NumPy: a launch records the rates it
    is given (its device table)."""

    def __init__(self):
        self.rates = []

    def RawKernel(self, code, name, options=()):  # noqa: N802 - CuPy's name
        return lambda grid, block, args: self.rates.append(np.array(args[6]))

    def ElementwiseKernel(self, in_params, out_params, body, name):  # noqa: N802 - CuPy's name
        assert body == "y = (float)(m * lr);"  # the rates: float64 products, rounded to float32
        return lambda m, lr, y: y.__setitem__(Ellipsis, (m * lr).astype(np.float32))

    def asarray(self, a):
        return np.array(a).view(_DeviceArray)

    def ones(self, shape, dtype):
        return np.ones(shape, dtype)


def test_the_one_kernel_sgd_rewrites_its_rates_in_its_table_for_a_replay():
    """A captured update launches the kernel on the tables it was captured with: refresh(lr)
    writes the new rates into them, which the kernel then reads (no new table), rounded as
    a new table's would be."""
    cp = _FakeCupy()
    fused = optim_kernels.FusedSGD(cp)
    arrays = [np.zeros(4, np.float32) for _ in range(6)]
    entries = [(arrays[0], arrays[1], [arrays[2]], 1.0, 1.0), (arrays[3], arrays[4], [arrays[5]], 0.3, 0.0)]
    fused.update(entries, 0.1, 1e-4, 0.9, 1)
    tables = [t[0][5] for t in fused.tables.values()]
    fused.refresh(0.07)
    cp_tables = [t[0][5] for t in fused.tables.values()]
    assert len(cp_tables) == 1 and cp_tables[0] is tables[0]
    fused.update(entries, 0.07, 1e-4, 0.9, 1)
    assert len(fused.tables) == 1
    np.testing.assert_array_equal(cp.rates[0], optim_kernels.rates([1.0, 0.3], 0.1))
    np.testing.assert_array_equal(cp.rates[1], optim_kernels.rates([1.0, 0.3], 0.07))
    assert cp.rates[1].dtype == np.float32 and cp.rates[0][1] != cp.rates[1][1]
    optimizer = Optimizer(SolverConfig(base_lr=0.5, lr_policy="step", stepsize=2, gamma=0.1))
    optimizer._fused = fused
    optimizer.refresh(3)  # iteration 3: 0.05
    np.testing.assert_array_equal(cp_tables[0], optim_kernels.rates([1.0, 0.3], 0.05))


def _cli_losses(tmp_path, capsys, name, *flags, net=TINY):
    from superneuron.cli.train import main
    log = tmp_path / f"{name}.jsonl"
    assert main([str(net), "--iters", "4", "--display", "1", "--test-interval", "2", "--log", str(log), *flags]) == 0
    return [json.loads(line)["loss"] for line in open(log) if '"loss"' in line], capsys.readouterr().out


def test_sn_train_on_the_cpu_says_off_once_and_trains_the_same(tmp_path, capsys):
    plain, _ = _cli_losses(tmp_path, capsys, "plain")
    flagged, out = _cli_losses(tmp_path, capsys, "flagged", "--cuda-graph")
    assert flagged == plain and len(plain) == 4
    assert out.count("cuda graph") == 1 and "cuda graph: off (CPU backend)\n" in out


def test_sn_train_says_when_it_captured_and_how_many_it_replayed(tmp_path, capsys, monkeypatch):
    """Through the stand-in capture (and SGD as the GPU's one kernel takes it), with a test
    pass between replays: the losses of the run without the flag; a line when the graph is
    captured, and the count of replays at the end."""
    net = tmp_path / "tiny_no_dropout.yaml"  # the tiny net's Dropout would stop the capture
    text = open(TINY).read()
    net.write_text("\n".join(line for line in text.splitlines() if "type: Dropout" not in line)
                   .replace("bottom: drop,", "bottom: pool,"))
    plain, _ = _cli_losses(tmp_path, capsys, "plain", net=net)
    monkeypatch.setattr("superneuron.net.get_backend", lambda device: GraphBackend())
    monkeypatch.setattr(Optimizer, "guards_on_device", lambda self, xp: True)
    graphed, out = _cli_losses(tmp_path, capsys, "graphed", "--cuda-graph", net=net)
    assert graphed == plain
    lines = [line for line in out.splitlines() if "cuda graph" in line.lower()]
    assert lines[:2] == ["cuda graph: on: 1 warm-up iteration, then one captured and replayed",
                         "cuda graph: on: captured at iteration 1, replayed since"], lines
    assert "2 iterations replayed from the CUDA graph" in out


def test_sn_train_names_the_layer_that_stops_the_capture(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("superneuron.net.get_backend", lambda device: GraphBackend())
    _, out = _cli_losses(tmp_path, capsys, "graphed", "--cuda-graph")
    lines = [line for line in out.splitlines() if "cuda graph" in line.lower()]
    assert lines == ["cuda graph: off (random numbers drawn each iteration from a host seed: Dropout layer "
                     "'drop')"], lines


class _FakeCudaModule:
    """The few names of ``cupy.cuda`` CudaGraphs uses, logging each call in ``log``."""

    def __init__(self):
        log = self.log = []
        self.allocator = "default"

        class Stream:
            def __init__(self):
                self.ptr = 77

            def __enter__(self):
                log.append("stream on")

            def __exit__(self, *exc):
                log.append("stream off")

            def begin_capture(self):
                log.append("begin")

            def end_capture(self):
                log.append("end")
                return types.SimpleNamespace(launch=lambda stream: log.append(("launch", stream.ptr)))

        self.Stream = Stream
        self.MemoryPool = lambda: types.SimpleNamespace(malloc="pool")

    def get_allocator(self):
        return self.allocator

    def set_allocator(self, allocator):
        self.log.append(("allocator", allocator))
        self.allocator = allocator


def test_cuda_graphs_capture_on_their_stream_with_their_pool_and_cudnn_follows():
    """CudaGraphs over a stand-in for cupy.cuda: work goes on its stream, cuDNN's handle moves
    there and back, the private pool serves only while asked, a capture that raises is ended
    (its error the one raised), a launch goes on the stream and returns what the capture did."""
    cuda = _FakeCudaModule()
    kernels = types.SimpleNamespace(cudnn=types.SimpleNamespace(set_stream=None),
                                    use_stream=lambda ptr: cuda.log.append(("cudnn", ptr)))
    api = graphs.CudaGraphs(types.SimpleNamespace(cuda=cuda), kernels)
    assert api.unable is None
    with api.running(pool=True):
        graph = api.capture(lambda: "execution")
    assert cuda.log == [("allocator", "pool"), ("cudnn", 77), "stream on", "begin", "end", "stream off",
                        ("cudnn", 0), ("allocator", "default")]
    del cuda.log[:]
    with api.running():
        assert api.launch(graph) == "execution"
    assert cuda.log == [("cudnn", 77), "stream on", ("launch", 77), "stream off", ("cudnn", 0)]
    del cuda.log[:]

    def broken():
        raise RuntimeError("not permitted")
    with pytest.raises(RuntimeError, match="not permitted"):
        api.capture(broken)
    assert cuda.log == ["begin", "end"]
    old = graphs.CudaGraphs(types.SimpleNamespace(cuda=cuda), types.SimpleNamespace(cudnn=object()))
    assert "no set_stream" in old.unable
    assert graphs.blocker(_runtime(), types.SimpleNamespace(rounds=1, steps=[], train=True), old) == old.unable
