"""What a BatchNorm and its Scale recomputed in one pass would save (a what-if; not built).

    python tools/bn_scale_whatif.py [--nets resnet152,resnet101,resnet50] [--fraction 0.25]

Plans each net with ``optimal`` at ``--fraction`` of liveness's arena (H100 estimates, batch
32, as tools/optimal_table.py), then counts each Recompute of a Scale that follows the
Recompute of the BatchNorm on its bottom (memory steps between) at half its time: one kernel
writing both x_hat and the Scale's output reads the map once where the two steps read it
twice (benchmarks/README.md, "Issue 34 at a quarter"). The plan itself is left as it is.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from optimal_table import lowered_net  # noqa: E402

from superneuron.planning import plan  # noqa: E402
from superneuron.scheduler.cost import CostModel  # noqa: E402
from superneuron.scheduler.steps import MEMORY, RECOMPUTE  # noqa: E402


def fusable_savings(schedule, model):
    """``(pairs, seconds)``: the BatchNorm-then-Scale recompute pairs of ``schedule`` and half
    the Scales' time (its write stays, its read of x_hat goes)."""
    nodes, steps = schedule.graph.nodes, schedule.steps
    pairs, saved = 0, 0.0
    for i, step in enumerate(steps):
        if step.kind != RECOMPUTE or nodes[step.node].layer.type != "Scale":
            continue
        j = i - 1
        while j >= 0 and steps[j].kind in MEMORY:
            j -= 1
        before = steps[j]
        if (before.kind == RECOMPUTE and nodes[before.node].layer.type == "BatchNorm"
                and list(nodes[step.node].bottoms) == list(nodes[before.node].tops)):
            layer = nodes[step.node].layer
            pairs += 1
            saved += model.algo_seconds(layer, "forward", model.algorithms(layer, "forward")[0]) / 2
    return pairs, saved


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nets", default="resnet152,resnet101,resnet50")
    p.add_argument("--fraction", type=float, default=0.25)
    args = p.parse_args()
    for name in args.nets.split(","):
        base, live, live_seconds, model = lowered_net(name, 32, CostModel("gpu"))
        schedule, _ = plan(base, "optimal", cost=model, memory=round(live.arena_bytes * args.fraction))
        seconds = model.iteration_seconds(schedule)
        pairs, saved = fusable_savings(schedule, model)
        print(f"{name}: x{seconds / live_seconds:.4f}; {pairs} BatchNorm-Scale recompute pairs, "
              f"{saved * 1e3:.2f} ms saved fused: x{(seconds - saved) / live_seconds:.4f} "
              f"(liveness {live_seconds * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
