"""The walker (scheduler/walk.py): the allocator calls each memory and copy kind makes in the
base walker, the copies it starts and waits for, and every kind of the vocabulary given a
meaning by every reading (Simulator, cost model's clock, Runtime)."""

import pytest

from superneuron.allocator import Allocator
from superneuron.graph import TensorInfo
from superneuron.scheduler.walk import KEEPING, OFFLOADING, PREFETCHING, Copies, Walker
from superneuron.scheduler.steps import KINDS, Alloc, Free, Offload, Prefetch, Step, Wait


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
