"""sn-plan: its figures, JSON, exit status, the overflow line, the timeline and the trace."""

import json

import pytest
from one_line import cli_error

from superneuron.cli.plan import main
from superneuron.graph import Graph
from superneuron.netfile.spec import load_spec
from superneuron.scheduler.lower import lower
from superneuron.scheduler.policy import apply_policy
from superneuron.scheduler.simulate import simulate

TINY = "tests/nets/tiny.yaml"


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_prints_the_plan_figures(capsys):
    status, out, _ = run(capsys, TINY, "--policy", "liveness")
    assert status == 0
    for field in ("peak", "resident", "lower bound", "peak / lower bound", "arena",
                  "dynamic", "planned", "budget", "steps"):
        assert field in out, field


def test_json_agrees_with_the_simulator(capsys):
    status, out, _ = run(capsys, TINY, "--policy", "liveness", "--batch", "2", "--json",
                         "--memory", "1GiB")
    info = json.loads(out)
    # sn-plan counts the optimiser's state, as sn-train allocates it (default: SGD with momentum)
    from superneuron.train.optim import make_optimizer
    from superneuron.train.solver_config import SolverConfig
    optimizer = make_optimizer(SolverConfig())
    plan = simulate(apply_policy(lower(Graph(load_spec(TINY, batch=2)), optimizer=optimizer), "liveness"))
    assert status == 0 and info["fits"] is True and info["overflow"] is None
    assert info["policy"] == "liveness" and info["batch"] == 2 and info["steps"] == plan.steps
    assert (info["peak_bytes"], info["resident_bytes"], info["lower_bound_bytes"], info["arena_bytes"]) \
        == (plan.peak_bytes, plan.resident_bytes, plan.lower_bound_bytes, plan.arena_bytes)
    assert info["arena_bytes_dynamic"] == plan.arena_bytes and info["arena_bytes_planned"] >= plan.peak_bytes
    assert info["lower_bound_bytes"] <= info["peak_bytes"] <= info["arena_bytes"]
    assert info["budget_bytes"] == 2**30


def test_liveness_needs_less_than_baseline(capsys):
    peaks = {}
    for policy in ("baseline", "liveness"):
        _, out, _ = run(capsys, TINY, "--policy", policy, "--json")
        peaks[policy] = json.loads(out)["peak_bytes"]
    assert peaks["liveness"] < peaks["baseline"]


@pytest.mark.parametrize("placement", ["dynamic", "planned"])
def test_over_budget_exits_3_and_names_the_step(capsys, placement):
    _, out, _ = run(capsys, TINY, "--json", "--placement", placement)
    peak = json.loads(out)["peak_bytes"]
    budget = peak // 2  # well under: smaller convolution workspaces alone cannot make it fit
    status, out, _ = run(capsys, TINY, "--memory", str(budget), "--placement", placement)
    assert status == 3
    line = next(x for x in out.splitlines() if x.startswith("needs "))
    # the step is where the live bytes first pass the budget: a compute step of the net
    assert " at Forward(" in line or " at Backward(" in line, line
    assert "; budget " in line and " over)" in line
    status, out, _ = run(capsys, TINY, "--memory", str(budget), "--json", "--placement", placement)
    info = json.loads(out)
    assert status == 3 and info["fits"] is False
    assert info["overflow"]["step"] in line and info["overflow"]["needs_bytes"] > budget


@pytest.mark.parametrize("argv, message", [
    (["nets/nope.yaml"], "cannot read"),
    ([TINY, "--policy", "lifeness"], "unknown policy 'lifeness'; known: baseline, liveness"),
    ([TINY, "--memory", "12 parsecs"], "bad size"),
    ([TINY, "--set", "width=0"], "layer 'conv1' (Convolution): num_output (0)"),
])
def test_bad_input_exits_2_with_one_clear_line(capsys, argv, message):
    err = cli_error(capsys, main, argv)
    assert message in err, err


def test_layers_and_steps_tables(capsys):
    status, out, _ = run(capsys, TINY, "--policy", "liveness", "--layers", "--steps")
    assert status == 0
    assert "fwd working set" in out and "bwd working set" in out
    lines = out.splitlines()
    assert any(x.startswith("conv1 ") and "Convolution" in x for x in lines)
    assert any("Backward(conv1)" in x for x in lines) and any("Alloc(data)" in x for x in lines)


def test_layers_table_says_where_a_gradient_takes_its_bottoms_memory(capsys, tmp_path):
    net = tmp_path / "lrn.yaml"
    net.write_text("""name: lrn
input: {data: [2, 3, 8, 8], label: [2]}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3, pad: 1}
  - {name: norm, type: LRN, bottom: conv1, top: norm, local_size: 3}
  - {name: conv2, type: Convolution, bottom: norm, top: conv2, num_output: 4, kernel_size: 3, pad: 1}
  - {name: fc, type: InnerProduct, bottom: conv2, top: fc, num_output: 5}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
""")
    rows = {}
    for policy in ("baseline", "liveness"):
        status, out, _ = run(capsys, str(net), "--policy", policy, "--layers")
        assert status == 0
        rows[policy] = [x for x in out.splitlines() if x.startswith(("conv1 ", "conv2 "))]
    assert [x.endswith("its bottom's gradient") for x in rows["liveness"]] == [False, True]
    assert not any(x.endswith("its bottom's gradient") for x in rows["baseline"])


def test_timeline_writes_a_png(capsys, tmp_path):
    path = tmp_path / "memory.png"
    status, _, err = run(capsys, TINY, "--memory", "1MiB", "--timeline", str(path))
    assert status == 0 and "wrote" in err
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trace_is_json_with_spans_and_counters(capsys, tmp_path):
    path = tmp_path / "trace.json"
    status, _, _ = run(capsys, TINY, "--policy", "liveness", "--trace", str(path))
    assert status == 0
    events = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    counters = [e for e in events if e["ph"] == "C"]
    assert spans and counters
    assert any(e["name"].startswith("Backward(conv1)") for e in spans)
    assert all(e["dur"] > 0 and e["ts"] >= 0 for e in spans)
    # the compute track: each span starts where the one before ends (times rounded to ns)
    assert all(abs(a["ts"] + a["dur"] - b["ts"]) < 0.002 for a, b in zip(spans, spans[1:]))
    assert all(c["args"]["live"] > 0 for c in counters)


def test_trace_has_a_track_per_stream_timed_by_the_device_and_marks_stalls(capsys, tmp_path):
    from superneuron.graph import Graph
    from superneuron.netfile.spec import load_spec
    from superneuron.scheduler.cost import CostModel
    graph_bytes = {t.name: t.nbytes for t in Graph(load_spec(TINY)).tensors.values()}
    names = {}
    for device in ("cpu", "gpu"):
        path = tmp_path / f"{device}.json"
        assert run(capsys, TINY, "--policy", "superneurons", "--device", device, "--trace", str(path))[0] == 0
        events = json.loads(path.read_text())["traceEvents"]
        names[device] = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
        spans = [e for e in events if e["ph"] == "X"]
        by_track = {tid: [e for e in spans if e["tid"] == tid] for tid in names[device]}
        assert [e["cat"] for e in by_track[1]] and {e["cat"] for e in by_track[1]} == {"offload"}
        assert [e["cat"] for e in by_track[2]] and {e["cat"] for e in by_track[2]} <= {"prefetch"}
        compute = by_track[0]
        assert not {e["cat"] for e in compute} & {"offload", "prefetch", "wait", "alloc", "free"}
        # compute and stall spans tile the compute track
        assert all(abs(a["ts"] + a["dur"] - b["ts"]) < 0.002 for a, b in zip(compute, compute[1:]))
        # the track ends at the estimated iteration time of --device's cost model, stalls and all
        _, out, _ = run(capsys, TINY, "--policy", "superneurons", "--device", device, "--json")
        info = json.loads(out)
        end = compute[-1]["ts"] + compute[-1]["dur"]
        assert abs(end - info["est_seconds"] * 1e6) < 0.01 + 1e-6 * end
        stalls = [e for e in compute if e["cat"] == "stall"]
        assert (len(stalls) > 0) == (info["est_stall_seconds"] > 0)
        assert stalls or device == "cpu"  # on the H100 model the copies do not hide: stalls
        assert abs(sum(e["dur"] for e in stalls) - info["est_stall_seconds"] * 1e6) < 0.002 * (1 + len(stalls))
        # a copy span lasts what the device's copy bandwidth says of its bytes
        model = CostModel(device)
        for e in by_track[1]:
            tensor = e["name"][len("Offload("):-1]
            if tensor in graph_bytes:
                assert abs(e["dur"] - model.copy_seconds(graph_bytes[tensor]) * 1e6) < 0.002
    assert names["cpu"] == names["gpu"] == {0: "compute", 1: "device→host", 2: "host→device"}


def test_unwritable_output_is_a_clean_error(capsys, tmp_path):
    err = cli_error(capsys, main, [TINY, "--trace", tmp_path / "no" / "dir" / "t.json"])
    assert "cannot write" in err


def test_superneurons_reports_host_memory_recompute_and_stalls(capsys):
    status, out, _ = run(capsys, "nets/resnet_cifar.yaml", "--batch", "4", "--policy", "superneurons", "--json")
    info = json.loads(out)
    _, live_out, _ = run(capsys, "nets/resnet_cifar.yaml", "--batch", "4", "--policy", "liveness", "--json")
    live = json.loads(live_out)
    assert status == 0 and info["host_bytes"] > 0 and info["copied_bytes"] >= info["host_bytes"]
    assert info["est_recompute_seconds"] > 0 and info["est_stall_seconds"] >= 0
    assert info["est_liveness_seconds"] == pytest.approx(live["est_seconds"])
    assert info["est_seconds"] >= live["est_seconds"]
    assert info["peak_bytes"] < live["peak_bytes"]
    status, out, _ = run(capsys, "nets/resnet_cifar.yaml", "--batch", "4", "--policy", "superneurons")
    assert "host" in out and "recompute" in out and "of liveness" in out


def test_host_memory_bounds_the_offload_and_says_when_it_cannot(capsys):
    args = ("nets/resnet_cifar.yaml", "--batch", "4", "--policy", "offload", "--json")
    free = json.loads(run(capsys, *args)[1])
    half = free["host_bytes"] // 2
    status, out, _ = run(capsys, *args, "--host-memory", str(half))
    bounded = json.loads(out)
    assert status == 0 and 0 < bounded["host_bytes"] <= half and bounded["host_fits"]
    assert bounded["peak_bytes"] > free["peak_bytes"]  # less offloaded: more on the device
    assert "lots" in cli_error(capsys, main, [*args[:-1], "--host-memory", "lots"])
