"""tools/optimal_gap.py's breakdown is the timeline's: on a CIFAR ResNet-8 under a budget that
makes superneurons recompute and offload (H100 estimates), its recomputation by layer type adds
up to the timeline's recomputation, its stalls by tensor to the timeline's stall, and the
compute stream's busy time before and after the turn to the iteration less the stalls; and
the richest program's bound is taken from the richest program the solver ran, never from
one with its recomputations fixed."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))

import optimal_gap  # noqa: E402

from superneuron.graph import Graph  # noqa: E402
from superneuron.netfile.spec import load_spec  # noqa: E402
from superneuron.scheduler.cost import CostModel  # noqa: E402
from superneuron.scheduler.lower import lower  # noqa: E402
from superneuron.scheduler.policy import apply_policy  # noqa: E402
from superneuron.scheduler.simulate import simulate  # noqa: E402
from superneuron.scheduler.timeline import COMPUTE_STREAM, D2H, H2D  # noqa: E402


def test_the_breakdown_adds_up_to_the_timeline():
    model = CostModel("gpu")
    graph = Graph(load_spec("nets/resnet_cifar.yaml", overrides={"depth": 8}, batch=8))
    live = simulate(apply_policy(lower(graph), "liveness", costs=model)).arena_bytes
    schedule = apply_policy(lower(graph), "superneurons", budget=live * 35 // 100, costs=model)
    parts, timeline = optimal_gap.breakdown(schedule, model)

    def total(prefix):
        return sum(v for k, v in parts.items() if k.startswith(prefix))

    assert timeline.recompute > 0 and timeline.copied > 0  # the premise: both are in the plan
    assert total("recompute ") == pytest.approx(timeline.recompute)
    assert total("stall ") == pytest.approx(timeline.stall)
    assert total(f"busy {COMPUTE_STREAM} ") == pytest.approx(timeline.seconds - timeline.stall)
    assert total(f"busy {D2H} ") == pytest.approx(total(f"busy {H2D} "))  # each copy out comes back
    assert all(v > 0 for k, v in parts.items() if k.startswith("algorithm "))


def test_the_richest_programs_bound():
    phases = [{"joins": True, "swaps": True, "encodings": False, "fixed": False, "dual_bound": 0.5},
              {"joins": True, "swaps": True, "encodings": True, "fixed": False, "dual_bound": 0.4},
              {"joins": False, "swaps": True, "encodings": True, "fixed": False, "dual_bound": 0.3},
              {"joins": True, "swaps": True, "encodings": False, "fixed": True, "dual_bound": 0.2}]
    assert optimal_gap.richest_bound(phases) == 0.4
    assert optimal_gap.richest_bound(phases[:1] + phases[2:]) == 0.5  # a net without encodings
    assert optimal_gap.richest_bound(phases[2:]) is None
