"""The walker (scheduler/walk.py): the allocator calls each memory and copy kind makes in the
base walker, the copies it starts and waits for, and every kind of the vocabulary given a
meaning by every reading (Simulator, cost model's clock, Runtime)."""

import pytest
from test_encode import RELU_POOL
from test_net import feed_for

from superneuron import load_net
from superneuron.graph.tensors import TensorInfo
from superneuron.net import Net
from superneuron.netfile.spec import loads_spec
from superneuron.runtime.execution import Execution
from superneuron.scheduler.allocator import Allocator, aligned
from superneuron.scheduler.barrier import barrier_before_update
from superneuron.scheduler.cost import CostModel, Link
from superneuron.scheduler.encode import _Summary
from superneuron.scheduler.simulate import Replayer, simulate
from superneuron.scheduler.steps import (
    BARRIER,
    KINDS,
    UPDATE,
    Alloc,
    Barrier,
    Decode,
    Encode,
    Free,
    Offload,
    Prefetch,
    Step,
    Wait,
)
from superneuron.scheduler.timeline import Clock
from superneuron.scheduler.walk import KEEPING, OFFLOADING, PREFETCHING, Copies, Walker, live_after
from superneuron.scheduler.workspace import _LiveAtSteps
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig


class Recording(Allocator):
    """An Allocator that also records its calls."""

    def __init__(self):
        self.calls = []
        super().__init__(None)

    def alloc(self, name, nbytes):
        self.calls.append(("alloc", name, nbytes))
        return super().alloc(name, nbytes)

    def free(self, name):
        self.calls.append(("free", name))
        return super().free(name)


class Log(Copies):
    def __init__(self):
        self.log = []

    def start(self, name, nbytes, kind):
        self.log.append(("start", name, nbytes, kind))
        return len(self.log)

    def wait(self, name, handle, what, planned):
        self.log.append(("wait", name, handle, what, planned))


TENSORS = {n: TensorInfo(n, (s,), "uint8", "data") for n, s in (("a", 1000), ("b", 300), ("p", 64))}


def test_each_memory_and_copy_kind_makes_its_calls():
    device, host, copies = Recording(), Recording(), Log()
    host.place_resident("p", 64)  # a host-resident parameter: its Offload takes no host copy
    walker = Walker(TENSORS, device, host, copies)
    walker.walk([Alloc("a"), Offload("a"), Wait("a"), Free("a"),                  # a goes to the host
                 Alloc("a"), Prefetch("a", keep=True), Wait("a"),               # back, the copy kept
                 Alloc("b"), Prefetch("a"), Wait("a"), Free("b"),               # ... and given back
                 Alloc("p"), Offload("p"), Wait("p"), Free("p"), Free("a")])
    assert device.calls == [("alloc", "a", 1000), ("free", "a"), ("alloc", "a", 1000), ("alloc", "b", 300),
                            ("free", "b"), ("alloc", "p", 64), ("free", "p"), ("free", "a")]
    # the host: one copy of a, taken by its Offload, given back by the Wait of the Prefetch
    # that does not keep it; none for the host-resident p
    assert host.calls == [("alloc", "a", 1000), ("free", "a")]
    assert [(e[0], e[1], e[3]) for e in copies.log] == [
        ("start", "a", "offload"), ("wait", "a", OFFLOADING), ("start", "a", "prefetch"), ("wait", "a", KEEPING),
        ("start", "a", "prefetch"), ("wait", "a", PREFETCHING), ("start", "p", "offload"), ("wait", "p", OFFLOADING)]
    assert all(e[4] is True for e in copies.log if e[0] == "wait")  # Wait steps are planned waits


def test_a_stall_waits_once_and_the_later_wait_step_finds_nothing():
    device, host, copies = Recording(), Recording(), Log()
    memory = Walker(TENSORS, device, host, copies)
    memory.walk([Alloc("a"), Offload("a")])
    memory.wait_for("a", planned=False)  # the Runtime's stall: a step touched a while its copy ran
    memory.walk([Wait("a")])
    assert [e[0] for e in copies.log] == ["start", "wait"] and copies.log[1][4] is False
    assert not memory.pending


@pytest.mark.parametrize("kind", sorted(set(KINDS) - {"alloc", "free", "offload", "prefetch", "wait", "apply"}))
def test_compute_kinds_touch_no_allocator_in_the_base_walker(kind):
    device, host = Recording(), Recording()
    Walker(TENSORS, device, host).walk([Step(kind, 0, "a")])
    assert device.calls == host.calls == []


# -- every kind against every reading --------------------------------------------------------

READINGS = [Walker, Replayer, Clock, Execution, _LiveAtSteps, _Summary]


@pytest.mark.parametrize("reading", READINGS, ids=lambda c: c.__name__)
def test_every_reading_has_a_method_for_every_kind(reading):
    for kind in KINDS:
        assert callable(getattr(reading, kind, None)), f"{reading.__name__} has no meaning for {kind}"


def test_the_runtime_gives_every_compute_kind_its_own_kernel_and_the_cost_model_its_time():
    # a compute kind that reached Walker.compute in the Runtime would be a step that runs nothing
    assert not [k for k in KINDS if getattr(Execution, k) is Walker.compute]
    assert set(CostModel("cpu")._seconds) == set(KINDS)


def test_a_walker_holds_no_reference_to_itself():
    # planning turns the garbage collector off during its searches: a walker in a cycle would
    # stay, with its arena, until it is back on
    import gc
    import weakref

    class Bare:
        tensors, steps = TENSORS, [Alloc("a"), Offload("a"), Wait("a")]

    makers = (lambda: Walker(TENSORS, Recording(), Recording()), lambda: Clock(CostModel("cpu"), Bare).run(Bare),
              lambda: Replayer(_net("tests/nets/tiny.yaml", "superneurons", 1, None).schedules["train"]))
    gc.disable()
    try:
        for make in makers:
            gone = weakref.ref(make())
            assert gone() is None
    finally:
        gc.enable()


def test_a_kind_without_a_method_fails_when_the_walker_is_made(monkeypatch):
    monkeypatch.setitem(KINDS, "teleport", KINDS["alloc"])
    with pytest.raises(TypeError, match="teleport"):
        Walker(TENSORS)


class TwinRanks:
    """Two ranks that hold the same batch: the sum of a bucket over them is twice it (so their
    average is what one rank has, exactly: doubling and halving are exact)."""

    size, rank = 2, 0

    def start(self, bucket):
        return bucket

    def wait(self, bucket, what):
        bucket *= 2

    def progress(self):
        pass

    def settle(self, what):
        pass


def _net(case, policy, iter_size, group):
    optimizer = make_optimizer(SolverConfig(base_lr=0.1, momentum=0.9, iter_size=iter_size))
    if case in CASE_TEXTS:
        return Net(loads_spec(CASE_TEXTS[case]), policy=policy, optimizer=optimizer, group=group)
    return load_net(case, batch=1, policy=policy, optimizer=optimizer, group=group)


CASE_TEXTS = {"leaky_relu_pool": RELU_POOL.replace("type: ReLU,", "type: ReLU, negative_slope: 0.1,")}
# between them, every kind: Encode and Decode (gist), Apply (parameter offload's host diet),
# Offload, Prefetch, Wait, Recompute (superneurons), Accumulate (iter_size), AllReduce and
# WaitReduce (two ranks)
EVERY_KIND = [("leaky_relu_pool", "gist+params", 1, False), ("tests/nets/tiny.yaml", "superneurons", 2, True)]


def test_every_kind_walks_in_the_simulator_the_clock_and_the_runtime():
    seen = set()
    for case, policy, k, twins in EVERY_KIND:
        net = _net(case, policy, k, TwinRanks() if twins else None)
        schedule = net.schedules["train"] = barrier_before_update(net.schedules["train"])
        seen |= {s.kind for s in schedule.steps}
        plan = simulate(schedule)                           # the Simulator
        timeline = CostModel("cpu", link=Link(ranks=2)).timeline(schedule)  # the cost model's clock
        assert len(timeline.starts) == len(schedule.steps) and timeline.seconds > timeline.stall >= 0
        assert (timeline.communication > 0) == twins and (timeline.copied > 0)
        feeds = [feed_for(net, seed=r) for r in range(k)]
        losses = [net.train_step(feeds if k > 1 else feeds[0], i) for i in range(2)]  # the Runtime
        assert net.peak_bytes == plan.peak_bytes and net.runtime.stalls == 0  # plan equals run
        if twins:  # two ranks of the same batch train as one rank
            alone = _net(case, policy, k, None)
            alone.schedules["train"] = barrier_before_update(alone.schedules["train"])
            assert [alone.train_step(feeds, i) for i in range(2)] == losses
    assert seen == set(KINDS)


def test_live_after_is_what_the_simulator_counts():
    net = _net("tests/nets/tiny.yaml", "superneurons", 1, None)
    schedule, plan = net.schedules["train"], net.plans["train"]
    for index in range(0, len(schedule.steps), 7):
        live = live_after(schedule, index)
        assert sum(aligned(b) for b in live.values()) == plan.live[index]


# -- Barrier: a kind added with its vocabulary entry, the base walker's method and its pass ----

def test_a_barrier_waits_for_every_copy_under_way_as_its_waits_would():
    device, host, copies = Recording(), Recording(), Log()
    walker = Walker(TENSORS, device, host, copies)
    walker.walk([Alloc("a"), Offload("a"), Wait("a"), Free("a"),
                 Alloc("a"), Prefetch("a"), Alloc("b"), Offload("b"), Barrier()])
    assert [(e[0], e[1], e[3], e[4]) for e in copies.log[4:]] == [("wait", "a", PREFETCHING, True),
                                                                ("wait", "b", OFFLOADING, True)]
    # a's host copy goes, as after its own Wait; b's stays, as an Offload's does
    assert not walker.pending and host.calls == [("alloc", "a", 1000), ("alloc", "b", 300), ("free", "a")]


def test_a_barrier_holds_the_clock_until_the_last_copy_lands():
    class Bare:  # what the clock reads of a schedule for memory and copy steps
        tensors, steps = TENSORS, [Alloc("a"), Alloc("b"), Offload("a"), Offload("b"), Barrier()]

    model = CostModel("cpu")
    clock = Clock(model, Bare).run(Bare)
    # the two copies queue on the one device→host stream: the barrier waits for both
    assert clock.now == clock.stall == model.copy_seconds(1000) + model.copy_seconds(300) > 0


def test_the_barrier_pass_puts_one_before_the_last_update_and_changes_no_result():
    plain, fenced = (_net("tests/nets/tiny.yaml", "superneurons", 1, None) for _ in range(2))
    schedule = fenced.schedules["train"] = barrier_before_update(fenced.schedules["train"])
    kinds = [s.kind for s in schedule.steps]
    assert kinds.count(BARRIER) == 1 and kinds[kinds.index(BARRIER) + 1] == UPDATE
    assert simulate(schedule).peak_bytes == plain.plans["train"].peak_bytes
    feed = feed_for(plain)
    assert [fenced.train_step(feed, i) for i in range(2)] == [plain.train_step(feed, i) for i in range(2)]
    assert fenced.runtime.stalls == 0
    no_copies = _net("tests/nets/tiny.yaml", "liveness", 1, None).schedules["train"]
    assert barrier_before_update(no_copies) is no_copies


def test_an_encoded_form_names_its_codec_in_its_own_field():
    encode, decode = Encode("x#sign", "sign", source="x"), Decode("x#sign", "sign", "x")
    assert encode.codec == decode.codec == "sign" and encode.algorithm is decode.algorithm is None
    assert (encode.describe(None), decode.describe(None)) == ("Encode(x#sign) [sign]", "Decode(x#sign) [sign]")
