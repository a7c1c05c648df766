"""What stops the optimal policy at a budget: for each net, the step where its plan's bytes
peak and what is live there, by kind and largest first, with the resident bytes, beside the
program's estimate and the realised one (H100 cost model, estimates: no GPU runs).

    python tools/optimal_peak.py [--nets resnet50,vgg16,googlenet] [--fraction 0.3333] [--solver-time 20]

Each net is planned as ``sn-plan NET.yaml [--set depth=D] --batch 32 --device gpu --policy
optimal --memory B`` plans it, B the fraction of liveness's arena (or, where no plan fits
that, the smallest budget under which one does).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from optimal_table import NETS, lowered_net  # noqa: E402

from superneuron.errors import SNError  # noqa: E402
from superneuron.planning import plan  # noqa: E402
from superneuron.report import human_bytes  # noqa: E402
from superneuron.scheduler.context import Context  # noqa: E402
from superneuron.scheduler.cost import CostModel  # noqa: E402
from superneuron.scheduler.optimal import smallest_budget  # noqa: E402
from superneuron.scheduler.policy import passes_of  # noqa: E402
from superneuron.scheduler.steps import LAYER_STEPS  # noqa: E402
from superneuron.scheduler.walk import live_after  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nets", default=",".join(NETS))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--fraction", type=float, default=1 / 3)
    p.add_argument("--solver-time", type=float, default=20.0)
    p.add_argument("--top", type=int, default=8, help="tensors listed per net")
    args = p.parse_args()
    model = CostModel("gpu")
    for name in args.nets.split(","):
        base, live, live_seconds, model = lowered_net(name, args.batch, model)
        budget, label = round(live.arena_bytes * args.fraction), f"{args.fraction:.3f} of liveness"
        memo = {}
        try:
            schedule, found = plan(base, "optimal", budget=budget, cost=model, solver_seconds=args.solver_time,
                                   memo=memo)
        except SNError:
            budget, label = smallest_budget(base, Context(model=model), passes_of), "the smallest a heuristic fits"
            schedule, found = plan(base, "optimal", budget=budget, cost=model, solver_seconds=args.solver_time,
                                   memo=memo)
        info, solver = memo["optimal"], memo["optimal"].get("solver") or {}
        index = found.peak_step
        step = schedule.steps[index]
        while step.kind not in LAYER_STEPS and index + 1 < len(schedule.steps):  # the step the peak serves
            index += 1
            step = schedule.steps[index]
        tensors = live_after(schedule, found.peak_step)
        kinds = {}
        for t, nbytes in tensors.items():
            kind = schedule.tensors[t].kind
            kinds[kind] = kinds.get(kind, 0) + nbytes
        objective = solver.get("objective")
        print(f"\n{name}, batch {args.batch}: budget {human_bytes(budget)} ({label}); winner {info['winner']}, "
              f"x{model.iteration_seconds(schedule) / live_seconds:.3f} liveness's time"
              + (f" (the program's estimate x{objective / live_seconds:.3f})" if objective else ""))
        print(f"  peak {human_bytes(found.peak_bytes)}, arena {human_bytes(found.arena_bytes)}, at "
              f"{step.describe(schedule.graph)}: resident {human_bytes(found.resident_bytes)}, "
              + ", ".join(f"{k} {human_bytes(v)}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])))
        for t, nbytes in sorted(tensors.items(), key=lambda kv: -kv[1])[:args.top]:
            print(f"    {human_bytes(nbytes):>10}  {schedule.tensors[t].kind:9s} {t}")


if __name__ == "__main__":
    main()
