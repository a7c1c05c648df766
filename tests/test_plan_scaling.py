"""Planning stays near-linear on a long in-place chain (n ReLUs on one blob, n aliases deep):
four times the layers must take well under sixteen times the time. Before, the storage roots
were walked whole from every name of the chain (n**2) and the planned placement tried ten
layouts where the first one reached the live peak, which none can beat."""

import os
import time

from superneuron.graph import Graph
from superneuron.netfile.spec import load_spec
from superneuron.planning import lowered, plan
from superneuron.scheduler.liveness import Roots
from superneuron.scheduler.placement import arena_bytes, lifetimes, live_peak, plan_offsets

CHAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nets", "relu_chain.yaml")


def plan_seconds(n, policy):
    """Seconds of what sn-plan does for the chain of ``n``: build, lower, plan, both arenas (the
    least of two runs: the machine is shared)."""
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        schedule, _ = plan(lowered(Graph(load_spec(CHAIN, overrides={"n": n}))), policy)
        arena_bytes(schedule, "dynamic")
        arena_bytes(schedule, "planned")
        best = min(best, time.perf_counter() - start)
    return best


def test_four_times_the_chain_takes_less_than_eight_times_the_time():
    small, large = plan_seconds(400, "liveness"), plan_seconds(1600, "liveness")
    assert large / small < 8, f"{small:.2f} s for 400 ReLUs, {large:.2f} s for 1600"


class CountingDict(dict):
    def __init__(self, *args):
        super().__init__(*args)
        self.gets = 0

    def get(self, *args):
        self.gets += 1
        return super().get(*args)


def test_the_storage_roots_of_a_chain_take_linear_work():
    """Every name of a chain 2 000 aliases deep asked, the deepest first (the worst order for a
    walk that memoises only its answer): at most a few lookups a name, not a thousand."""
    schedule, _ = plan(lowered(Graph(load_spec(CHAIN, overrides={"n": 2000}))), "liveness")
    roots = Roots(schedule)
    roots.tensors = CountingDict(schedule.tensors)
    depth = {}

    def deep(name):
        d, info = 0, schedule.tensors.get(name)
        while info is not None and info.alias is not None:
            d, info = d + 1, schedule.tensors.get(info.alias)
        return d

    names = sorted(schedule.tensors, key=lambda n: -depth.setdefault(n, deep(n)))
    assert max(depth.values()) >= 2000
    answers = {name: roots(name) for name in names}
    assert roots.tensors.gets <= 3 * len(names), roots.tensors.gets
    assert answers == {name: deep_root(schedule.tensors, name) for name in names}


def deep_root(tensors, name):
    info = tensors.get(name)
    while info is not None and info.alias is not None:
        name = info.alias
        info = tensors.get(name)
    return name


def test_the_live_peak_bounds_every_layout_and_the_chain_reaches_it():
    schedule, _ = plan(lowered(Graph(load_spec(CHAIN, overrides={"n": 50}))), "liveness")
    spans = lifetimes(schedule)
    offsets, region = plan_offsets(schedule)
    peak = live_peak(spans)
    assert region == peak
    # the layout is a real one: no two spans that meet at a step overlap in the arena
    placed, seen = [], {}
    for start, end, name, size in spans:
        k = seen.get(name, 0)
        seen[name] = k + 1
        placed.append((start, end, offsets[name][k], size))
    for i, (s1, e1, o1, z1) in enumerate(placed):
        for s2, e2, o2, z2 in placed[:i]:
            if s1 <= e2 and s2 <= e1:
                assert o1 + z1 <= o2 or o2 + z2 <= o1
    # and the bound is tight where it is computed: three spans, two meeting
    assert live_peak([(0, 2, "a", 64), (2, 4, "b", 128), (3, 5, "c", 32), (5, 6, "d", 256)]) == 288
