"""Where the optimal policy's time over liveness goes, and what bounds it (H100 cost model,
estimates: no GPU runs), for issue 34's "why x1.38 at a quarter".

    python tools/optimal_gap.py resnet50 1/4 [--copy-rates 20e9,200e9] [--json OUT.json]
    python tools/optimal_gap.py resnet50 near      # 1.1 times liveness's lower bound, as --tradeoff

Each net is planned as ``sn-plan NET.yaml [--set depth=D] --batch 32 --device gpu --policy
optimal --memory B`` plans it, B the fraction of liveness's arena (``near``: 1.1 times the lower
bound sn-plan prints for liveness). It prints the estimate against liveness's and the solver's
proven bound (of its own program), then the time over liveness split into recomputation (by
layer type), stalls on copies (by tensor), slower algorithms (by algorithm) and the rest;
the copy streams' busy time beside the compute of the forward and of the backward; and,
with ``--copy-rates``, the optimum and bound of the program with joins (no encodings) at
the same budget for host links of each rate (bytes per second each way): what the link
costs, apart from what the option space or the solver do.
"""

import argparse
import dataclasses
import json
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from optimal_table import NETS, lowered_net  # noqa: E402

from superneuron.options import PlanOptions  # noqa: E402
from superneuron.planning import plan  # noqa: E402
from superneuron.report import human_bytes  # noqa: E402
from superneuron.scheduler.context import Context  # noqa: E402
from superneuron.scheduler.cost import CostModel, phase_of  # noqa: E402
from superneuron.scheduler.optimal_model import build, solve  # noqa: E402
from superneuron.scheduler.steps import BACKWARD, FORWARD, LAYER_STEPS, RECOMPUTE, first_backward  # noqa: E402
from superneuron.scheduler.timeline import COMPUTE_STREAM, D2H, H2D, STALL  # noqa: E402
from superneuron.scheduler.update import update_in_backward  # noqa: E402

NEAR_BOUND = 1.10  # sn-plan --tradeoff's "1.1x the lower bound"


def breakdown(schedule, model):
    """``{name: seconds}`` of what ``schedule`` (placed) spends besides its layers' forward and
    backward on their fastest algorithms: ``recompute <type>``, ``stall <tensor>``,
    ``algorithm <name>`` (a step's time over its layer's fastest algorithm), and the copy
    streams' and the compute's busy seconds before and after the turn (``busy ...``)."""
    graph, steps = schedule.graph, schedule.steps
    timeline = model.timeline(schedule)
    out = defaultdict(float)
    for step in steps:
        if step.kind == RECOMPUTE:
            out["recompute " + graph.nodes[step.node].layer.type] += model.step_seconds(schedule, step)
        elif step.kind in (FORWARD, BACKWARD) and step.kind in LAYER_STEPS:
            layer = graph.nodes[step.node].layer
            algos = model.algorithms(layer, phase_of(step))
            chosen = next((a for a in algos if a.name == step.algorithm), algos[0])
            fastest = min(model.algo_seconds(layer, phase_of(step), a) for a in algos)
            lost = model.algo_seconds(layer, phase_of(step), chosen) - fastest
            if lost > 0:
                out["algorithm " + chosen.name] += lost
    turn = first_backward(steps)
    for i, stream, start, end in timeline.spans:
        if stream == STALL:
            out["stall " + steps[i].tensor] += end - start
        if stream in (D2H, H2D, COMPUTE_STREAM):
            out[f"busy {stream} {'forward' if turn is None or i < turn else 'backward'}"] += end - start
    return dict(out), timeline


def richest_bound(phases):
    """The proven bound (seconds) of the richest program the solver ran (joins, swaps and,
    where the net has any, encodings; not one with recomputations fixed): no plan of any
    option the program offers is faster. None where none ended with one."""
    runs = [p for p in phases if p["joins"] and p["swaps"] and not p.get("fixed") and p.get("dual_bound")]
    runs.sort(key=lambda p: not p.get("encodings"))
    return runs[0]["dual_bound"] if runs else None


def program_bounds(base, model, budget, rates):
    """``{rate: (optimum, bound)}`` (seconds) of the program with joins, without encodings, at
    ``budget``, with the host link at each of ``rates`` (bytes per second)."""
    schedule = update_in_backward(base, Context(PlanOptions(budget=budget), model))
    out = {}
    for rate in rates:
        linked = CostModel(dataclasses.replace(model.device, copy=rate), model.table, model.link)
        m = dataclasses.replace(build(schedule, linked, joins=True), units=[])
        solution = solve(m, budget - m.resident)
        out[rate] = (solution.objective, solution.dual_bound)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("net", choices=sorted(NETS))
    p.add_argument("fraction", help="of liveness's arena, e.g. 1/4; or 'near': 1.1 times the lower bound")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--copy-rates", default="", help="host link rates to solve the program at, e.g. 20e9,200e9")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    base, live, live_seconds, model = lowered_net(args.net, args.batch, CostModel("gpu"))
    if args.fraction == "near":
        budget = round(live.lower_bound_bytes * NEAR_BOUND)
    else:
        num, _, den = args.fraction.partition("/")
        budget = round(live.arena_bytes * float(num) / float(den or 1))
    memo, start = {}, time.process_time()
    schedule, planned = plan(base, "optimal", budget=budget, cost=model, memo=memo)
    cpu = time.process_time() - start
    parts, timeline = breakdown(schedule, model)
    solver = memo["optimal"].get("solver") or {}
    bound = richest_bound(solver.get("phases", ()))
    over = timeline.seconds - live_seconds
    print(f"{args.net}, batch {args.batch}, budget {human_bytes(budget)} ({args.fraction}; liveness "
          f"{human_bytes(live.arena_bytes)}, lower bound {human_bytes(live.lower_bound_bytes)}): "
          f"{timeline.seconds * 1e3:.2f} ms, x{timeline.seconds / live_seconds:.4f} liveness's "
          f"{live_seconds * 1e3:.2f} ms; winner {memo['optimal']['winner']}, fits {planned.fits(budget)}, "
          f"planned in {cpu:.1f} s of CPU"
          + (f"; the richest program's proven bound {bound * 1e3:.2f} ms (x{bound / live_seconds:.4f})"
             if bound else ""))
    print(f"  over liveness {over * 1e3:.2f} ms; copied {human_bytes(timeline.copied)}")
    shown = 0.0
    for kind in ("recompute", "stall", "algorithm"):
        items = sorted(((k, v) for k, v in parts.items() if k.startswith(kind + " ")), key=lambda kv: -kv[1])
        total = sum(v for _, v in items)
        shown += total
        print(f"  {kind:10s} {total * 1e3:7.3f} ms: "
              + ", ".join(f"{k.split(' ', 1)[1]} {v * 1e3:.3f}" for k, v in items[:8] if v > 1e-6))
    print(f"  the rest   {(over - shown) * 1e3:7.3f} ms (updates in the backward, encodings, ...)")
    for phase in ("forward", "backward"):
        print(f"  {phase:8s}: compute {parts.get(f'busy {COMPUTE_STREAM} {phase}', 0) * 1e3:.2f} ms, "
              f"device→host {parts.get(f'busy {D2H} {phase}', 0) * 1e3:.2f} ms, "
              f"host→device {parts.get(f'busy {H2D} {phase}', 0) * 1e3:.2f} ms busy")
    for phase in solver.get("phases", ()):  # each program the solver tried, as it ended
        print("  program " + ", ".join(f"{k} {v:.5g}" if isinstance(v, float) else f"{k} {v}"
                                       for k, v in phase.items() if k not in ("status", "solves")))
    rates = [float(r) for r in args.copy_rates.split(",") if r]
    bounds = program_bounds(base, model, budget, rates) if rates else {}
    for rate, (optimum, low) in bounds.items():
        print(f"  host link {rate / 1e9:g} GB/s: the program (joins, no encodings) x{optimum / live_seconds:.4f}, "
              f"bound x{low / live_seconds:.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"net": args.net, "fraction": args.fraction, "budget_bytes": budget,
                       "liveness_ms": live_seconds * 1e3, "ms": timeline.seconds * 1e3,
                       "ratio": timeline.seconds / live_seconds, "winner": memo["optimal"]["winner"],
                       "bound_ratio": bound / live_seconds if bound else None, "cpu_seconds": cpu,
                       "parts_ms": {k: v * 1e3 for k, v in sorted(parts.items())},
                       "program_at_link": {f"{r:g}": [o / live_seconds, b / live_seconds]
                                           for r, (o, b) in bounds.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
