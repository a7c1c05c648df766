"""The optimal policy against liveness and superneurons on the H100 cost model (estimates):
classic ImageNet nets at batch 32, 224x224, at budgets of 2/3, 1/2, 1/3 and 1/4 of
liveness's peak and the smallest that fits, each figure as

    sn-plan NET.yaml [--set depth=D] --batch 32 --device gpu --policy P --memory B

prints (planned in this process through planning.plan), with how long optimal took.

    python tools/optimal_table.py [--nets resnet50,resnet101,resnet152,vgg16,googlenet] [--solver-time 20]
    python tools/optimal_table.py --nets vgg16 --policies superneurons+params,optimal+params
    python tools/optimal_table.py --nets resnet50,googlenet --measured --json OUT.json   # on a GPU

(``--policies``: the heuristic to compare and the solved policy, in that order. ``--measured``,
on a machine with a GPU: each net's kernels timed there first, cuDNN's engines among them
where NVIDIA's cuDNN Frontend is installed (runtime/profile.py, as ``sn-plan --profile``;
cached), and every figure planned with that table instead of the H100 estimates.)
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from superneuron.backend import planning_kernels  # noqa: E402
from superneuron.errors import SNError  # noqa: E402
from superneuron.graph import Graph  # noqa: E402
from superneuron.netfile.spec import load_spec  # noqa: E402
from superneuron.planning import lowered, plan  # noqa: E402
from superneuron.report import human_bytes, table  # noqa: E402
from superneuron.scheduler.context import Context  # noqa: E402
from superneuron.scheduler.cost import CostModel  # noqa: E402
from superneuron.scheduler.optimal import smallest_budget  # noqa: E402
from superneuron.scheduler.policy import passes_of  # noqa: E402
from superneuron.train.optim import make_optimizer  # noqa: E402
from superneuron.train.solver_config import SolverConfig  # noqa: E402

NETS = {"resnet50": ("nets/resnet.yaml", {"depth": 50}), "resnet101": ("nets/resnet.yaml", {"depth": 101}),
        "resnet152": ("nets/resnet.yaml", {"depth": 152}),
        "resnet1001": ("nets/resnet.yaml", {"depth": 1001}), "vgg16": ("nets/vgg16.yaml", {}),
        "googlenet": ("nets/googlenet.yaml", {})}
FRACTIONS = (("2/3", 2 / 3), ("1/2", 1 / 2), ("1/3", 1 / 3), ("1/4", 1 / 4))


def lowered_net(name, batch, model, measured=False):
    """``(lowered schedule, liveness's Plan, liveness's seconds, cost model)`` of net ``name``
    (of NETS) at ``batch``, SGD with momentum, planned for the GPU under cost ``model``, or
    under a table of its kernels timed on this machine's GPU where ``measured``."""
    path, overrides = NETS[name]
    spec = load_spec(path, overrides=overrides, batch=batch)
    graph = Graph(spec, kernels=planning_kernels("gpu"))
    if measured:
        from superneuron.backend import get_backend
        from superneuron.runtime.profile import load_or_measure
        try:
            backend = get_backend("gpu")
        except SNError as e:
            sys.exit(f"optimal_table.py --measured: {e}")
        model = CostModel("gpu", load_or_measure(graph, backend)[0])
    base = lowered(graph, optimizer=make_optimizer(SolverConfig(momentum=0.9)), device="gpu")
    live_schedule, live = plan(base, "liveness", cost=model)
    return base, live, model.iteration_seconds(live_schedule), model


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nets", default=",".join(NETS))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--solver-time", type=float, default=20.0)
    p.add_argument("--policies", default="superneurons,optimal",
                   help="the heuristic and the solved policy compared (e.g. superneurons+params,optimal+params)")
    p.add_argument("--measured", action="store_true", help="plan with the kernels timed on this machine's GPU")
    p.add_argument("--json", help="also write every cell to this file")
    p.add_argument("--chunked-speed", type=float,
                   help="a what-if: im2col_chunked (and direct at 2/3 of it) at this fraction of im2col's speed, "
                        "as cuDNN's implicit-GEMM engines run without columns (default: as measured on the CPU)")
    args = p.parse_args()
    if args.chunked_speed is not None:
        from superneuron.layers.conv import Convolution
        Convolution._chunked_speed = lambda layer: args.chunked_speed
    heuristic, solved = args.policies.split(",")
    results = []
    for name in args.nets.split(","):
        base, live, live_seconds, model = lowered_net(name, args.batch, CostModel("gpu"), args.measured)
        budgets = [(f, round(live.arena_bytes * x)) for f, x in FRACTIONS]
        budgets.append(("smallest", smallest_budget(base, Context(model=model), passes_of)))
        rows = []
        for label, budget in budgets:
            cells, record = [label, human_bytes(budget)], {"net": name, "budget": label, "bytes": budget,
                                                           "copy_bytes_per_second": 1 / model.copy_seconds(1)}
            for policy in (heuristic, solved):
                memo, start = {}, time.perf_counter()
                try:
                    schedule, p_ = plan(base, policy, budget=budget, cost=model, solver_seconds=args.solver_time,
                                        memo=memo)
                except SNError:
                    cells += ["-", ""] if policy == solved else ["-"]
                    continue
                took = time.perf_counter() - start
                seconds = model.iteration_seconds(schedule)
                cells.append(f"x{seconds / live_seconds:.3f}" if p_.fits(budget) else "-")
                record[policy] = seconds / live_seconds if p_.fits(budget) else None
                if policy == solved:
                    info = memo["optimal"]
                    solver = info.get("solver") or {}
                    gap = solver.get("gap")
                    cells.append(f"{info['winner']}, gap {'-' if gap is None else f'{gap * 100:.2f} %'}, "
                                 f"{took:.1f} s")
                    record.update(winner=info["winner"], gap=gap, plan_seconds=took)
            rows.append(cells)
            results.append(record)
        source = "measured on this GPU" if args.measured else "H100 estimates"
        print(f"\n{name}, batch {args.batch}: liveness {human_bytes(live.arena_bytes)}, "
              f"{live_seconds * 1e3:.2f} ms ({source})")
        print(table(rows, ["budget", "bytes", heuristic, solved, f"{solved}: winner, solver gap, plan time"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "measured": args.measured, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
