"""Optimiser-state offload (scheduler/state.py), which the optimal and auto policies' solver
plans have: the state (momentum, Adam's moments) lives on the host and comes to the device
around its parameter's update.

Checked: where the copies go and what moves (the training schedule and the test schedule that
shares its resident layout); the device's resident bytes fall by the state's and the peak with
them; training with it gives liveness's losses and parameters bit for bit with SGD and Adam,
the plan's peak and host bytes those of the run; small states stay resident."""

import numpy as np
import pytest
from test_memory_passes import CHAIN, graph_of
from test_update_in_backward import trained_as_liveness

import superneuron.scheduler.optimal as optimal_policy
from superneuron.errors import SNError
from superneuron.graph import Graph
from superneuron.net import Net
from superneuron.netfile.spec import load_spec
from superneuron.options import PlanOptions
from superneuron.planning import lowered, plan
from superneuron.report import host_resident_words, optimal_line
from superneuron.scheduler import optimal_rounds, state
from superneuron.scheduler.allocator import aligned
from superneuron.scheduler.context import Context as SchedulerContext
from superneuron.scheduler.cost import CostModel
from superneuron.scheduler.lower import lower
from superneuron.scheduler.optimal import PARAMS_NAME, STATE_NAME, lowest_budget, smallest_candidate_budget
from superneuron.scheduler.optimal_monotone import SMALLER
from superneuron.scheduler.params import offload_params
from superneuron.scheduler.policy import passes_of
from superneuron.scheduler.simulate import simulate
from superneuron.scheduler.timeline import STALL, Timeline
from superneuron.scheduler.update import update_in_backward
from superneuron.sizes import human_bytes
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig

CIFAR = "nets/resnet_cifar.yaml"
SGD = SolverConfig(type="SGD", momentum=0.9, weight_decay=0.01)


@pytest.fixture
def every_state(monkeypatch):
    """Every state moves, however small (the test nets' are a few KiB)."""
    monkeypatch.setattr(state, "SMALLEST", 0)


class Context:
    model = CostModel("gpu")


def test_each_update_has_its_state_copied_in_before_it_and_out_after_it(every_state):
    g = graph_of(CHAIN)
    opt = make_optimizer(SGD)
    plain = update_in_backward(lower(g, train=True, optimizer=opt))
    moved = state.offload_state(plain, Context())
    updates = [s for s in plain.steps if s.kind == "update"]
    every = {t for s in updates for t in state.state_of(plain, s.grads)}
    names = set(moved.host_resident)
    assert names and names < every and not names & set(moved.resident)
    steps = moved.steps
    for i, step in enumerate(steps):
        if step.kind != "update" or not names & set(state.state_of(moved, step.grads)):
            continue
        mine = set(state.state_of(moved, step.grads))
        fetched = [j for j, s in enumerate(steps[:i]) if s.kind == "prefetch" and s.tensor in mine]
        assert {steps[j].tensor for j in fetched} == mine and all(steps[j].keep for j in fetched)
        # each waited for before the update, copied out after it and waited for again
        assert {s.tensor for s in steps[max(fetched):i] if s.kind == "wait"} >= mine
        assert {s.tensor for s in steps[i:] if s.kind == "offload"} >= mine
        assert all(any(s.kind == "wait" and s.tensor == t for s in steps[i:]) for t in mine)
    # the device holds a layer's state for its update only: the peak falls by at least the
    # states of every layer but the largest
    before, after = simulate(plain), simulate(moved)
    nbytes = sum(plain.tensors[t].nbytes for t in names)
    assert after.resident_bytes <= before.resident_bytes - nbytes
    assert after.host_bytes >= nbytes and before.host_bytes == 0
    assert after.peak_bytes < before.peak_bytes
    test = update_in_backward(lower(g, train=False, optimizer=opt))
    assert state.like(test, moved).resident == moved.resident  # one Runtime serves both


def test_with_the_parameters_each_comes_in_before_its_forward_and_goes_out_after_its_update(every_state):
    g = graph_of(CHAIN)
    opt = make_optimizer(SGD)
    plain = update_in_backward(lower(g, train=True, optimizer=opt))
    alone, moved = state.offload_state(plain, Context()), state.offload_state(plain, Context(), params=True)
    params = {t for t in moved.host_resident if moved.tensors[t].kind == "param"}
    assert params and not params & set(moved.resident)
    assert set(moved.host_resident) - params == set(alone.host_resident)  # the states as without them
    steps = moved.steps
    for p in params:
        uses = [i for i, s in enumerate(steps)
                if s.kind in ("forward", "backward") and p in g.nodes[s.node].params.values()]
        update = next(i for i, s in enumerate(steps) if s.kind == "update" and p + ".grad" in s.grads)
        first = uses[0]
        mine = [(i, s.kind) for i, s in enumerate(steps) if s.tensor == p and s.kind in ("prefetch", "wait", "offload")]
        # one copy in, before its forward (waited for there), one copy out after its update
        assert [k for _, k in mine] == ["prefetch", "wait", "offload", "wait"]
        assert mine[1][0] < first and max(uses) < update < mine[2][0]
        assert steps[mine[0][0]].keep and steps[first].kind == "forward"
    before, after = simulate(alone), simulate(moved)
    assert after.resident_bytes == before.resident_bytes - sum(aligned(plain.tensors[p].nbytes) for p in params)
    assert after.host_bytes == before.host_bytes + sum(aligned(plain.tensors[p].nbytes) for p in params)
    # the test forward shares the resident layout and copies each parameter in before its step
    test = state.like(update_in_backward(lower(g, train=False, optimizer=opt)), moved)
    assert test.resident == moved.resident and set(test.host_resident) >= params
    for i, step in enumerate(test.steps):
        if step.kind == "forward":
            for p in set(g.nodes[step.node].params.values()) & params:
                assert any(s.kind == "wait" and s.tensor == p for s in test.steps[:i])
    assert simulate(test).fits(None)


def test_sn_train_says_what_the_plan_keeps_on_the_host(every_state):
    plain = update_in_backward(lower(graph_of(CHAIN), train=True, optimizer=make_optimizer(SGD)))
    alone, both = state.offload_state(plain, Context()), state.offload_state(plain, Context(), params=True)
    kinds = lambda s, k: sum(s.tensors[t].kind == k for t in s.host_resident)  # noqa: E731
    assert host_resident_words(plain) == ""
    held = "on the host, copied in for their steps"
    assert host_resident_words(alone) == f"{kinds(alone, 'state')} optimiser states {held}"
    n, m = kinds(both, "state"), kinds(both, "param")
    assert host_resident_words(both) == f"{n} optimiser states and {m} parameters {held}"
    assert host_resident_words(offload_params(plain)).endswith("on the host, updated there")


def test_small_states_stay_resident():
    g = graph_of(CHAIN)
    plain = update_in_backward(lower(g, train=True, optimizer=make_optimizer(SGD)))
    assert state.offload_state(plain, Context()) is plain  # every state here is under 1 MiB


class SlowLink:
    """The GPU's estimates with a host link a million times slower."""

    model = CostModel("gpu")

    def __init__(self):
        fast = self.model.copy_seconds
        self.model = type("Slow", (), {"step_seconds": self.model.step_seconds,
                                       "copy_seconds": lambda _, n: 1e6 * fast(n)})()


def test_states_whose_copies_cannot_hide_stay_resident(every_state):
    # a copy longer than the backward before its update and the forward's tail (VGG-16's fc6
    # at 20 GB/s) would hold its bytes across the turn and crowd the activations' copies
    g = graph_of(CHAIN)
    plain = update_in_backward(lower(g, train=True, optimizer=make_optimizer(SGD)))
    assert state.offload_state(plain, Context()) is not plain
    assert state.offload_state(plain, SlowLink()) is plain


@pytest.mark.parametrize("params", [False, True], ids=["state", "state+params"])
@pytest.mark.parametrize("solver", [SGD, SolverConfig(type="Adam", base_lr=0.01, weight_decay=0.001)],
                         ids=["sgd", "adam"])
def test_training_with_the_state_on_the_host_matches_liveness_bit_for_bit(every_state, monkeypatch, solver, params):
    # auto without a budget plans liveness with the update in the backward; here with the state
    # (and the parameters) offloaded too, as the solver's plans have it
    monkeypatch.setattr(optimal_policy, "update_in_backward",
                        lambda s, c=None: state.offload_state(update_in_backward(s, c), c, params=params))
    live, auto, feed = trained_as_liveness(solver)
    moved = auto.schedules["train"]
    kinds = {moved.tensors[s.tensor].kind for s in moved.steps if s.kind == "prefetch"}
    assert kinds == ({"state", "param"} if params else {"state"})
    assert not auto.runtime.host_update  # the update runs on the device, on the copies
    if params:  # the test forward copies the parameters in too
        test = auto.schedules["test"]
        assert {test.tensors[s.tensor].kind for s in test.steps if s.kind == "prefetch"} == {"param"}
    plan = auto.plans["train"]
    assert (auto.runtime.peak_bytes, auto.runtime.host_peak) == (plan.peak_bytes, plan.host_bytes)  # plan = run
    assert plan.host_bytes > 0 and plan.peak_bytes < live.plans["train"].peak_bytes
    # the test forward runs in the same arena, beside the state on the host, and so does the
    # training forward alone (its copies out with no update before them)
    assert auto.forward(feed, train=False) == live.forward(feed, train=False)
    assert auto.forward(feed, train=True) == live.forward(feed, train=True)


@pytest.mark.gpu
def test_training_on_the_gpu_with_the_state_and_parameters_on_the_host_matches_liveness(every_state, monkeypatch):
    """The same on CuPy, where the copies run on their own streams beside the compute: a
    parameter's device copy is read by its forward and backward and written by the update
    before its copy out, which the Waits order."""
    monkeypatch.setattr(optimal_policy, "update_in_backward",
                        lambda s, c=None: state.offload_state(update_in_backward(s, c), c, params=True))
    live, auto, feed = trained_as_liveness(SGD, device="gpu")
    moved = auto.schedules["train"]
    assert {moved.tensors[t].kind for t in moved.host_resident} == {"state", "param"}
    plan = auto.plans["train"]
    assert (auto.runtime.peak_bytes, auto.runtime.host_peak) == (plan.peak_bytes, plan.host_bytes)
    assert not auto.runtime.host_update and plan.host_bytes > 0
    assert auto.forward(feed, train=False) == live.forward(feed, train=False)


class WaitedModel:
    """A cost model whose first timeline has the compute stream wait at the Waits named
    (``waits``: step index → seconds; a compute step a second), and later ones none: what
    retime reads."""

    def __init__(self, waits):
        self.waits, self.calls = waits, 0

    def timeline(self, schedule):
        starts, now = [], 0.0
        for step in schedule.steps:  # a second a compute step
            starts.append(now)
            now += step.kind not in ("alloc", "free", "prefetch", "wait", "offload")
        spans = [(i, STALL, starts[i], starts[i] + t) for i, t in self.waits.items()] if not self.calls else []
        self.calls += 1
        return Timeline(0.0, 0.0, 0.0, 0.0, starts, spans)


def test_retime_moves_a_waited_copy_in_earlier_and_a_waited_copy_out_later(every_state):
    g = graph_of(CHAIN)
    moved = state.offload_state(update_in_backward(lower(g, train=True, optimizer=make_optimizer(SGD))), Context())
    steps = moved.steps
    name = next(s.tensor for s in steps if s.kind == "prefetch")
    where = {k: [i for i, s in enumerate(steps) if s.tensor == name and s.kind == k]
             for k in ("alloc", "prefetch", "wait", "offload", "free")}
    last_wait = where["wait"][-1]
    computes_before = lambda ss, i: sum(s.kind not in ("alloc", "free", "prefetch", "wait", "offload") for s in ss[:i])  # noqa: E731
    # waits that send the copies next to steps with workspaces, whose Allocs and Frees must stay
    # right around them
    worked = [i for i, s in enumerate(steps) if s.workspace and s.kind in ("forward", "backward")]
    early = max(i for i in worked if i < where["prefetch"][0])
    ahead = computes_before(steps, where["prefetch"][0]) - computes_before(steps, early)
    later = [computes_before(steps, i) - computes_before(steps, last_wait) for i in worked if i > last_wait]
    behind = min([d for d in later if d > 0], default=1)
    model = WaitedModel({where["wait"][0]: ahead, last_wait: behind})
    retimed = state.retime(moved, type("Ctx", (), {"model": model})())
    assert model.calls == 2 and ahead > 0 and behind > 0  # one round moved them, the next saw no wait
    new = retimed.steps
    assert sorted(map(id, new)) == sorted(map(id, steps))  # the same steps, reordered
    at = {k: [i for i, s in enumerate(new) if s.tensor == name and s.kind == k] for k in where}
    # the copy in starts that many compute steps earlier, its Alloc right before it
    assert computes_before(new, at["prefetch"][0]) <= computes_before(steps, where["prefetch"][0]) - ahead
    assert at["alloc"][0] == at["prefetch"][0] - 1
    # the copy out is waited for that many steps later, its Free after that Wait
    assert computes_before(new, at["wait"][-1]) >= computes_before(steps, last_wait) + behind
    assert at["free"][-1] > at["wait"][-1]
    assert simulate(retimed).peak_bytes >= simulate(moved).peak_bytes  # held longer, never less


class QueuedModel:
    """A timeline whose waits show one at a time: timeline k waits a second at the last Wait of
    ``names[k]`` (a queue of copies out, each waited for once the one before it no longer is),
    and once they are all through, at none."""

    def __init__(self, names):
        self.names, self.calls = names, 0

    def timeline(self, schedule):
        waits = {}
        if self.calls < len(self.names):
            name = self.names[self.calls]
            waits = {max(i for i, s in enumerate(schedule.steps) if s.kind == "wait" and s.tensor == name): 1.0}
        self.calls += 1
        return WaitedModel(waits).timeline(schedule)


def test_retime_goes_on_while_a_queue_of_copies_is_waited_for(every_state):
    """A wait removed brings the steps after it earlier, where the copy queued behind it may be
    waited for in turn (VGG-16 at 1/4 behind fc6's 392 MiB weight): retime goes on, round after
    round, until nothing is waited for."""
    moved = state.offload_state(update_in_backward(lower(graph_of(CHAIN), train=True,
                                                         optimizer=make_optimizer(SGD))), Context(), params=True)
    names = list(dict.fromkeys(s.tensor for s in moved.steps if s.kind == "offload"))
    assert len(names) > 4  # more than the four rounds retime once had
    model = QueuedModel(names)
    state.retime(moved, type("Ctx", (), {"model": model})())
    assert model.calls == len(names) + 1  # a round for each, and one that saw no wait


def test_retime_never_parts_a_step_from_its_workspace(every_state):
    """Wherever the copies go, a step's workspace stays among the memory steps right around
    it, with no copy step between (workspace.py rewrites them so)."""
    g = graph_of(CHAIN)
    moved = state.offload_state(update_in_backward(lower(g, train=True, optimizer=make_optimizer(SGD))), Context())
    steps = moved.steps
    compute = sum(s.kind not in ("alloc", "free", "prefetch", "wait", "offload") for s in steps)
    for name in {s.tensor for s in steps if s.kind == "prefetch"}:
        waits = [i for i, s in enumerate(steps) if s.kind == "wait" and s.tensor == name]
        for seconds in range(1, compute):
            new = state.retime(moved, type("Ctx", (), {"model": WaitedModel({w: seconds for w in waits})})()).steps
            for i, step in enumerate(new):
                if not step.workspace or step.kind not in ("forward", "backward", "recompute", "update"):
                    continue
                for way, kind in ((-1, "alloc"), (1, "free")):
                    j = i + way
                    while new[j].kind in ("alloc", "free") and new[j].tensor != step.workspace:
                        j += way
                    assert (new[j].kind, new[j].tensor) == (kind, step.workspace), (name, seconds, i, step)


def test_sn_plan_says_how_much_state_the_solvers_plan_keeps_on_the_host():
    info = {"winner": STATE_NAME, "seconds": 0.066, "update_in_backward": True, "state_offloaded": 96 << 20,
            "candidates": {"liveness": None, "solver": 0.079, STATE_NAME: 0.066}, "solver": None}
    line = optimal_line(info)
    assert line.startswith(f"optimal       {STATE_NAME}'s plan won (66.00 ms)")
    assert ", 96.0 MiB of optimiser state on the host;" in line and f"{STATE_NAME} 66.00 ms" in line
    assert "optimiser state on" not in optimal_line(dict(info, winner="solver"))
    line = optimal_line(dict(info, winner=PARAMS_NAME, candidates={PARAMS_NAME: 0.066}))
    assert ", 96.0 MiB of optimiser state and parameters on the host;" in line


@pytest.mark.parametrize("mib, host, tests", [(8, {"ip1/weight.momentum"}, 1000),
                                              (9, {"ip1/weight.momentum", "ip1/weight"}, 3)],
                         ids=["state", "state+params"])
def test_a_run_resumed_from_a_snapshot_with_the_state_on_the_host_ends_as_the_run_never_stopped(tmp_path, mib, host,
                                                                                                tests):
    """LeNet under optimal at 8 MiB keeps ip1's momentum (1.5 MiB) on the host, at 9 MiB its
    weight too: the snapshot reads them there, and a resume puts them back, so the parameters
    and momentum after 6 iterations are those of a run never stopped, bit for bit (with the
    weight on the host, a test between the iterations copies it in and leaves it as it was)."""
    from superneuron.cli.train import main
    common = ["nets/lenet.yaml", "--policy", "optimal", "--memory", f"{mib}MiB", "--snapshot-interval", "3",
              "--test-interval", str(tests)]
    assert main(common + ["--iters", "6", "--snapshot", str(tmp_path / "whole")]) == 0
    assert main(common + ["--iters", "3", "--snapshot", str(tmp_path / "part")]) == 0
    part = str(tmp_path / "part")
    assert main(common + ["--iters", "6", "--snapshot", part, "--resume", part]) == 0
    whole, part = (np.load(tmp_path / d / "lenet_iter_6.npz") for d in ("whole", "part"))
    assert sorted(whole.files) == sorted(part.files) and "opt:ip1/weight.momentum" in whole.files
    assert np.any(whole["opt:ip1/weight.momentum"])
    for key in whole.files:
        assert whole[key].tobytes() == part[key].tobytes(), key
    net = Net(load_spec("nets/lenet.yaml"), policy="optimal", memory=mib << 20, optimizer=make_optimizer(SGD))
    assert set(net.schedules["train"].host_resident) == host  # the case under test
    assert not host & set(net.schedules["test"].resident)  # the layout they share


def test_optimal_solves_with_the_state_on_the_host_only_where_its_plan_is_slow_and_keeps_the_faster():
    spec, opt = load_spec("nets/lenet.yaml"), make_optimizer(SGD)
    found = {}
    for mib in (8, 9, 16):
        memo = {}
        schedule, _ = plan(Graph(spec), "optimal", budget=mib << 20, optimizer=opt, memo=memo)
        found[mib] = memo["optimal"], schedule
    # 8 MiB: nothing with the state resident fits; with it on the host, the solver's plan does
    info, schedule = found[8]
    assert info["winner"] == STATE_NAME and info["candidates"].get("solver") is None
    assert "ip1/weight.momentum" in schedule.host_resident and info["state_offloaded"] > 0
    # 9 MiB: the parameters moved beside the state give the fastest plan; the two programs
    # before it, whose relaxations were over STATE_OVER, are solved after it with its time as
    # their cutoff, and end with none faster
    info, schedule = found[9]
    assert info["winner"] == PARAMS_NAME and set(info["bounded"]) == {"solver", STATE_NAME}
    assert "solver with the state on the host none faster" in optimal_line(info)
    assert {"ip1/weight", "ip1/weight.momentum"} <= set(schedule.host_resident)
    # 16 MiB: the plan with the state resident is within STATE_OVER of liveness: no second program
    info, schedule = found[16]
    assert {STATE_NAME, PARAMS_NAME}.isdisjoint(info["candidates"]) and not schedule.host_resident


@pytest.mark.parametrize("mib", [8, 9, 16])
def test_the_ladder_solving_the_programs_over_its_limit_last_gives_the_plan_of_solving_them_in_order(monkeypatch, mib):
    """Solving a program whose relaxation is over STATE_OVER after the programs that move more
    (with their best as its cutoff) saves its solving, never changes the plan: the same
    winner and steps as each solved in the ladder's order (LeNet at 8 MiB: the state's and
    the parameters' plans tie, and the one that moves less wins either way), with fewer plans
    realised at 9 MiB, where the programs before the parameters' are cut off."""
    spec, opt = load_spec("nets/lenet.yaml"), make_optimizer(SGD)
    realised = []
    realise = optimal_rounds.realise
    monkeypatch.setattr(optimal_rounds, "realise", lambda *args: realised.append(1) or realise(*args))

    def planned():
        SMALLER.nets.clear()  # each plans afresh: no plan of the other is a candidate
        realised.clear()
        memo = {}
        schedule, _ = plan(Graph(spec), "optimal", budget=mib << 20, optimizer=opt, memo=memo)
        return memo["optimal"]["winner"], memo["optimal"]["seconds"], [str(s) for s in schedule.steps]

    reordered, work = planned(), len(realised)
    monkeypatch.setattr(optimal_policy, "relaxation_bound", lambda models, context: 0.0)  # nothing over: in order
    assert planned() == reordered
    assert work < len(realised) if mib == 9 else work <= len(realised)


def test_optimal_names_a_floor_under_which_none_of_its_plans_fits_and_fits_between_it_and_the_heuristics(capsys):
    """LeNet (SGD with momentum): a heuristic's plan fits from 11.6 MiB; the solver's, with the
    state and the parameters on the host, fit down to 7 MiB; its program's relaxation has no
    answer under its floor, so there nothing fits and the error says both budgets, and sn-plan
    --min-memory prints both."""
    from superneuron.cli.plan import main
    spec, opt = load_spec("nets/lenet.yaml"), make_optimizer(SGD)
    context = SchedulerContext(PlanOptions("optimal"), CostModel("cpu"))
    base = lowered(spec, True, opt)
    floor, heuristic = lowest_budget(base, context), smallest_candidate_budget(base, context, passes_of)
    assert floor < 7 << 20 < heuristic
    # with 1 MiB of host memory the parameters cannot move (3 MiB with their state): a higher floor
    limited = SchedulerContext(PlanOptions("optimal", host_memory=1 << 20), CostModel("cpu"))
    assert lowest_budget(base, limited) > 7 << 20
    with pytest.raises(SNError):
        plan(Graph(spec), "optimal", budget=7 << 20, optimizer=opt, host_memory=1 << 20)
    _, fitted = plan(Graph(spec), "optimal", budget=7 << 20, optimizer=opt)
    assert fitted.fits(7 << 20)  # under every heuristic's smallest: the solver's plan
    with pytest.raises(SNError) as err:
        plan(Graph(spec), "optimal", budget=floor - (64 << 10), optimizer=opt)
    assert f"no plan of the solver's can fit under {human_bytes(floor)}" in str(err.value)
    assert f"a heuristic's plan fits from {human_bytes(heuristic)}" in str(err.value)
    assert main(["nets/lenet.yaml", "--policy", "optimal", "--min-memory"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("min memory"))
    assert line.startswith(f"min memory    {human_bytes(heuristic)} ({heuristic} bytes): the smallest --memory under "
                           "which a heuristic's plan fits") and f"none under {human_bytes(floor)}" in line
