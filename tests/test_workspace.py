"""The workspace pass and the cost model: each step runs the fastest algorithm whose workspace
fits the memory its tensors leave under the budget, none over --workspace-limit; results stay
those of baseline (within float32 rounding: the algorithms sum in other orders) and the plan
stays the run; sn-plan prints an estimated time, measured with --profile and cached."""

import json
import textwrap

import numpy as np
import pytest
from one_line import cli_error, raises_one_line

from superneuron.cli.plan import main
from superneuron.errors import SNError
from superneuron.graph import Graph
from superneuron.layers.base import Algo
from superneuron.net import Net
from superneuron.netfile.spec import load_spec
from superneuron.runtime.profile import measure_costs
from superneuron.scheduler.allocator import aligned
from superneuron.scheduler.cost import CostModel, entry_key
from superneuron.scheduler.lower import lower
from superneuron.scheduler.policy import POLICIES, SOLVED, apply_policy
from superneuron.scheduler.simulate import simulate
from superneuron.scheduler.workspace import choose, choose_workspaces

# Three 3x3 convolutions: the second's im2col workspace (72 rows x 512 columns) is the
# iteration's largest buffer; the third, after pooling, works on a quarter of the pixels.
NET = """\
name: ws
input: {data: [2, 3, 16, 16], label: [2]}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 8, kernel_size: 3, pad: 1}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: conv2, type: Convolution, bottom: conv1, top: conv2, num_output: 8, kernel_size: 3, pad: 1}
  - {name: pool, type: Pooling, bottom: conv2, top: pool, pool: MAX, kernel_size: 2, stride: 2}
  - {name: conv3, type: Convolution, bottom: pool, top: conv3, num_output: 8, kernel_size: 3, pad: 1}
  - {name: fc, type: InnerProduct, bottom: conv3, top: fc, num_output: 5}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
"""


@pytest.fixture
def net_file(tmp_path):
    path = tmp_path / "ws.yaml"
    path.write_text(textwrap.dedent(NET))
    return str(path)


def choices(schedule):
    """``[(step index, step, its algorithms)]`` for the compute steps with a choice."""
    out = []
    for i, step in enumerate(schedule.steps):
        if step.kind in ("forward", "backward"):
            phase = step.kind
            algos = schedule.graph.nodes[step.node].layer.algorithms(phase)
            if len(algos) > 1:
                out.append((i, step, algos))
    return out


def ws_bytes(schedule, step):
    return schedule.tensors[step.workspace].nbytes if step.workspace else 0


def test_without_a_budget_every_step_gets_its_fastest_algorithm(net_file):
    s = apply_policy(lower(Graph(load_spec(net_file))), "liveness")
    steps = choices(s)
    assert len(steps) == 6  # three convolutions, forward and backward
    for _, step, algos in steps:
        fastest = max(algos, key=lambda a: a.speed)
        assert step.algorithm == fastest.name == "im2col" and ws_bytes(s, step) == fastest.workspace


def test_a_measured_table_overrides_the_speeds(net_file):
    g = Graph(load_spec(net_file))
    conv2 = g.nodes[[n.name for n in g.nodes].index("conv2")].layer
    table = {entry_key(conv2, "direct", "forward"): 1e-9}  # pretend direct is instant there
    s = apply_policy(lower(g), "liveness", costs=table)
    picked = {(s.graph.nodes[st.node].name, st.kind): st.algorithm for _, st, _ in choices(s)}
    assert picked.pop(("conv2", "forward")) == "direct"
    assert set(picked.values()) == {"im2col"}


@pytest.mark.parametrize("cut", [1, 0.5])
def test_a_tight_budget_shrinks_workspaces_exactly_where_the_fastest_does_not_fit(net_file, cut):
    g = Graph(load_spec(net_file))
    free = simulate(apply_policy(lower(g), "liveness"))
    floor = simulate(apply_policy(lower(g), "liveness",
                                  costs={entry_key(n.layer, "direct", p): 0.0 for n in g.nodes
                                         for p in ("forward", "backward")}))
    # cut 1: one byte under the fastest plan's peak; 0.5: halfway down to the smallest plan's
    budget = free.peak_bytes - 1 if cut == 1 else (free.peak_bytes + floor.peak_bytes) // 2
    s = apply_policy(lower(g), "liveness", budget=budget)
    plan = simulate(s)
    assert plan.peak_bytes <= budget and plan.arena_bytes <= budget
    slower = 0
    for i, step, algos in choices(s):
        # the room the step's tensors leave: the Simulator's bytes live there less its workspace
        room = budget - plan.resident_bytes - (plan.live[i] - aligned(ws_bytes(s, step)))
        fitting = [a for a in algos if aligned(a.workspace) <= room]
        assert step.algorithm == max(fitting, key=lambda a: a.speed).name, step.describe(g)
        assert ws_bytes(s, step) == [a for a in algos if a.name == step.algorithm][0].workspace
        slower += step.algorithm != "im2col"
    assert 0 < slower < 6  # some steps had to give up im2col, not all


def test_workspace_limit_caps_every_choice_and_an_impossible_one_is_an_error(net_file):
    g = Graph(load_spec(net_file))
    conv2 = [n for n in g.nodes if n.name == "conv2"][0].layer
    limit = conv2.algorithms("forward")[0].workspace - 1  # conv2's im2col is out, conv1's not
    for policy in POLICIES:
        s = apply_policy(lower(g), policy, workspace_limit=limit)
        steps = choices(s)
        assert all(ws_bytes(s, st) <= limit for _, st, _ in steps)
        assert {st.algorithm for _, st, _ in steps} == {"im2col", "im2col_chunked"}
    with raises_one_line(SNError, match=r"Forward\(conv1\): no algorithm fits the workspace limit"):
        apply_policy(lower(g), "liveness", workspace_limit=0)


def test_choose_ranks_by_time_and_falls_back_to_the_smallest():
    algos = [Algo("big", 4096, 1.0), Algo("mid", 1024, 0.8), Algo("none", 0, 0.2)]
    seconds = {"big": 1.0, "mid": 1.25, "none": 5.0}.get
    assert choose(algos, lambda a: seconds(a.name)).name == "big"
    assert choose(algos, lambda a: seconds(a.name), room=2048).name == "mid"
    assert choose(algos, lambda a: seconds(a.name), room=100).name == "none"
    assert choose(algos, lambda a: seconds(a.name), limit=1024).name == "mid"
    assert choose(algos[:2], lambda a: seconds(a.name), room=0).name == "mid"  # nothing fits
    assert choose(algos[:2], lambda a: seconds(a.name), limit=10) is None


def test_the_pass_leaves_a_schedule_alone_when_nothing_changes(net_file):
    s = apply_policy(lower(Graph(load_spec(net_file))), "baseline", placement="dynamic")
    assert choose_workspaces(s) is s


def _train(net_file, **kw):
    net = Net(load_spec(net_file), **kw)
    rng = np.random.default_rng(3)
    feed = {"data": rng.standard_normal((2, 3, 16, 16)).astype(np.float32),
            "label": rng.integers(0, 5, 2).astype(np.float32)}
    loss = net.forward_backward(feed)
    return net, loss, {p: net.grad(p) for p in net.learnable_names}


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("placement", ["dynamic", "planned"])
def test_same_results_as_baseline_and_plan_equals_run_under_a_budget(net_file, policy, placement):
    _, base_loss, base_grads = _train(net_file)
    g = Graph(load_spec(net_file))
    free = simulate(apply_policy(lower(g), policy, placement=placement))
    budget = free.arena_bytes - 1
    net, loss, grads = _train(net_file, memory=budget, policy=policy, placement=placement)
    if policy not in SOLVED:  # optimal and auto may recompute instead, if that is faster
        assert {st.algorithm for _, st, _ in choices(net.schedules["train"])} > {"im2col"}
    assert net.runtime.peak_bytes == net.plans["train"].peak_bytes <= budget
    assert net.runtime.arena_bytes == net.plans["train"].arena_bytes <= budget
    np.testing.assert_allclose(loss, base_loss, rtol=1e-5)
    for name, g in base_grads.items():
        np.testing.assert_allclose(grads[name], g, rtol=1e-5, atol=1e-6, err_msg=name)


def _conv(shape, k=8):
    text = textwrap.dedent(f"""\
        name: c
        input: {{data: {list(shape)}}}
        layers:
          - {{name: conv, type: Convolution, bottom: data, top: conv, num_output: {k}, kernel_size: 3, pad: 1}}
        """)
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    return Graph(load_spec(f.name)).nodes[-1].layer


def test_cost_model_orders_algorithms_by_speed_and_grows_with_the_layer():
    small, large = _conv((2, 3, 16, 16)), _conv((8, 16, 32, 32), k=32)
    for device in ("cpu", "gpu"):
        model = CostModel(device)
        for phase in ("forward", "backward"):
            algos = small.algorithms(phase)
            times = [model.algo_seconds(small, phase, a) for a in algos]
            assert times == sorted(times) and times[0] < times[-1]
            for a, t in zip(algos, times):  # time = base estimate / speed
                assert t * a.speed == pytest.approx(times[0] * algos[0].speed)
            assert model.algo_seconds(large, phase, algos[0]) > 10 * times[0]
    assert CostModel("cpu").algo_seconds(small, "forward", small.algorithms("forward")[0]) \
        > CostModel("gpu").algo_seconds(small, "forward", small.algorithms("forward")[0])


def test_measure_costs_times_every_algorithm_of_every_phase(net_file):
    from superneuron.backend import Backend
    g = Graph(load_spec(net_file))
    table = measure_costs(g, Backend(), repeats=1)
    conv3 = [n for n in g.nodes if n.name == "conv3"][0].layer
    for phase in ("forward", "backward"):
        for a in conv3.algorithms(phase):
            assert table[entry_key(conv3, a.name, phase)] > 0
    assert not any(k.startswith(("Input|", "Split|")) for k in table)


def test_sn_plan_prints_an_estimated_time_and_profile_writes_then_reads_the_cache(
        net_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SN_CACHE_DIR", str(tmp_path / "cache"))
    assert main([net_file]) == 0
    assert "est. time" in capsys.readouterr().out
    assert main([net_file, "--json"]) == 0
    estimate = json.loads(capsys.readouterr().out)
    assert estimate["est_seconds"] > 0 and estimate["cost_model"] == "estimate (cpu)"

    assert main([net_file, "--json", "--profile"]) == 0
    first = json.loads(capsys.readouterr().out)
    path = first["profile"]["cache"]
    assert first["profile"]["measured"] and path.startswith(str(tmp_path / "cache"))
    with open(path) as f:
        cached = json.load(f)
    assert len(cached["costs"]) == first["profile"]["entries"] > 0
    # a second run reads the file instead of measuring: scaled times show in its estimate
    cached["costs"] = {k: v * 1000 for k, v in cached["costs"].items()}
    with open(path, "w") as f:
        json.dump(cached, f)
    assert main([net_file, "--json", "--profile"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert not second["profile"]["measured"] and second["est_seconds"] > 100 * first["est_seconds"]


def test_sn_plan_workspace_limit_and_budget_choose_smaller_workspaces(net_file, capsys):
    assert main([net_file, "--json", "--policy", "liveness"]) == 0
    free = json.loads(capsys.readouterr().out)
    assert main([net_file, "--json", "--policy", "liveness", "--workspace-limit", "20KiB"]) == 0
    capped = json.loads(capsys.readouterr().out)
    assert capped["peak_bytes"] < free["peak_bytes"] and capped["est_seconds"] > free["est_seconds"]
    budget = str(free["arena_bytes"] - 1)
    assert main([net_file, "--json", "--policy", "liveness", "--memory", budget]) == 0
    assert json.loads(capsys.readouterr().out)["fits"]
    assert "no algorithm fits the workspace limit" in cli_error(
        capsys, main, [net_file, "--policy", "liveness", "--workspace-limit", "0"])


def test_a_workspace_no_layout_leaves_room_for_is_pinned_under_the_limit_first():
    """Where every order's layout of the tensors leaves some step's workspace short (or goes
    over the limit), tensors_first pins those workspaces right under the limit and packs the
    tensors around them: here every workspace gets its bytes and the tensors stay under the
    limit, as no plain layout does. Lifetimes in compute steps, sizes in arena units; each
    workspace takes all the limit leaves at its step."""
    import types

    from superneuron.graph.tensors import TensorInfo
    from superneuron.scheduler import placement
    from superneuron.scheduler.allocator import ALIGN
    from superneuron.scheduler.steps import Alloc, Forward, Free
    tensors_ = [(0, 5, 4), (5, 7, 5), (0, 4, 3), (3, 4, 2), (2, 4, 4)]  # (first step, last step, units)
    workspaces = {4: 2, 6: 10, 7: 10}  # step: units
    limit = 15 * ALIGN
    steps, infos = [], {}
    for t in range(8):
        for i, (first, _, units) in enumerate(tensors_):
            if first == t:
                infos[f"t{i}"] = TensorInfo(f"t{i}", (units * ALIGN // 4,), np.float32, "activation")
                steps.append(Alloc(f"t{i}"))
        if t in workspaces:
            infos[f"w{t}"] = TensorInfo(f"w{t}", (workspaces[t] * ALIGN // 4,), np.float32, "workspace")
            steps += [Alloc(f"w{t}"), Forward(t), Free(f"w{t}")]
        else:
            steps.append(Forward(t))
        steps += [Free(f"t{i}") for i, (_, last, _) in enumerate(tensors_) if last == t]
    schedule = types.SimpleNamespace(steps=steps, tensors=infos)
    spans = placement.lifetimes(schedule)
    late = placement._workspaces(schedule, spans)
    for key in placement.ORDERS.values():  # no plain layout fits them all
        _, region, (tree, times) = placement._place(spans, key, late, tensors_only=True)
        assert region > limit or any(placement._room(tree, times, spans[k], limit)[1] < spans[k][3] for k in late)
    offsets, rooms = placement.tensors_first(schedule, limit)
    assert {k: room for k, (_, room) in rooms.items()} == {t: workspaces[t] * ALIGN for t in workspaces}
    assert max(off + infos[name].nbytes for name, offs in offsets.items() for off in offs) <= limit
    for t, (at, room) in rooms.items():  # each room is free of the tensors live at its step
        live = [(off, off + infos[f"t{i}"].nbytes) for i, (first, last, _) in enumerate(tensors_)
                if first <= t <= last for off in offsets[f"t{i}"]]
        assert all(hi <= at or lo >= at + room for lo, hi in live)


def test_the_tensors_layout_kept_is_the_one_whose_rooms_lose_the_least_time():
    """Of the placement orders' layouts of the tensors, tensors_first keeps the one whose rooms
    for the workspaces cost the least time (``lost``), among those that leave no step short;
    fit's chooser counts that time from each step's algorithms: nothing where a room holds the
    algorithm chosen under the budget, the slower one's extra where it does not."""
    from superneuron.scheduler.placement import tensors_first
    from superneuron.scheduler.workspace import _Chooser
    graph = Graph(load_spec("nets/resnet.yaml", overrides={"depth": 18, "size": 64, "classes": 10}, batch=4))
    schedule = apply_policy(lower(graph), "liveness")
    limit = 2 * simulate(schedule).peak_bytes  # every layout within it: the rooms' time decides
    seen = []

    def score(rooms):  # any score: here the layout whose rooms sum the most wins
        return -sum(room for _, room in rooms.values())

    def lost(rooms):
        seen.append(rooms)
        return score(rooms)
    rooms = tensors_first(schedule, limit, None, lost)[1]
    assert len({score(r) for r in seen}) > 1 and rooms == min(seen, key=score)
    chooser = _Chooser(schedule, limit + schedule.resident_bytes, None, CostModel("gpu"))
    everything = {k: (0, 1 << 40) for _, k, *_ in chooser.choices}
    nothing = {k: (0, 0) for _, k, *_ in chooser.choices}
    assert chooser.lost(everything) == 0 < chooser.lost(nothing)
