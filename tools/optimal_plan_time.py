"""How long the optimal policy takes to plan one net at one budget, and what it plans: the
estimated time against liveness's, the winner, the solves, the CPU and wall seconds, and a
digest of the steps (the same digest on every run: the plan repeats). H100 cost model
(estimates), batch 32, SGD with momentum, as tools/optimal_table.py plans.

    python tools/optimal_plan_time.py resnet152 1/3 [--solver-time S]

Run it in two trees side by side (PYTHONPATH=TREE) to compare them.
"""

import argparse
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from optimal_table import NETS, lowered_net  # noqa: E402

from superneuron.planning import plan  # noqa: E402
from superneuron.scheduler.cost import CostModel  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("net", choices=sorted(NETS))
    p.add_argument("fraction", help="of liveness's arena, e.g. 1/3")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--solver-time", type=float)
    p.add_argument("--phases", action="store_true", help="print each program's rounds, solves and times too")
    args = p.parse_args()
    num, _, den = args.fraction.partition("/")
    base, live, live_seconds, model = lowered_net(args.net, args.batch, CostModel("gpu"))
    budget = round(live.arena_bytes * float(num) / float(den or 1))
    memo, wall, cpu = {}, time.perf_counter(), time.process_time()
    options = {} if args.solver_time is None else {"solver_seconds": args.solver_time}
    schedule, planned = plan(base, "optimal", budget=budget, cost=model, memo=memo, **options)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    info = memo["optimal"]
    solver = info.get("solver") or {}
    print(json.dumps({"net": args.net, "fraction": args.fraction, "budget_bytes": budget,
                      "ratio": model.iteration_seconds(schedule) / live_seconds, "fits": planned.fits(budget),
                      "winner": info["winner"], "solves": solver.get("rounds"), "wall_seconds": round(wall, 2),
                      "cpu_seconds": round(cpu, 2),
                      "digest": hashlib.sha1(repr(list(schedule.steps)).encode()).hexdigest()[:12]}))
    if args.phases:
        for phase in solver.get("phases", ()):
            print(json.dumps(phase, default=str))


if __name__ == "__main__":
    main()
