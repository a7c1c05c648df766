"""Measured on the CPU, not estimated: CIFAR ResNet-N trained under ``optimal`` at a fraction of
liveness's peak against ``liveness`` without a budget, taking turns in blocks of iterations so
that machine noise hits both alike; medians reported: each net's median iteration, and the
median over blocks of optimal's median iteration in a block over liveness's in the same block
(*paired*: a slow minute of the machine weighs on both sides of a block's ratio).

    python tools/bench_optimal.py [--depth 56] [--batch 32] [--fraction 0.3333] [--blocks 4] [--per-block 2]
                                  [--profile]
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from superneuron import load_net  # noqa: E402
from superneuron.report import human_bytes  # noqa: E402
from superneuron.train.optim import make_optimizer  # noqa: E402
from superneuron.train.solver_config import SolverConfig  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depth", type=int, default=56)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--fraction", type=float, default=1 / 3, help="of liveness's arena (default 1/3)")
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--per-block", type=int, default=2, help="iterations per block")
    p.add_argument("--solver-time", type=float, default=20.0)
    p.add_argument("--profile", action="store_true",
                   help="plan with kernels timed on this CPU (cached), as sn-train --profile")
    args = p.parse_args()

    def net(policy, memory=None):
        return load_net("nets/resnet_cifar.yaml", overrides={"depth": args.depth}, batch=args.batch, policy=policy,
                        memory=memory, optimizer=make_optimizer(SolverConfig(base_lr=0.01, momentum=0.9)),
                        solver_seconds=args.solver_time, costs="measure" if args.profile else None)

    live = net("liveness")
    budget = round(live.arena_bytes * args.fraction)
    start = time.perf_counter()
    best = net("optimal", budget)
    planned = time.perf_counter() - start
    nets = {"liveness": live, "optimal": best}
    rng = np.random.default_rng(0)
    feed = {"data": rng.standard_normal(live.input_shape("data")).astype(np.float32),
            "label": rng.integers(0, 10, live.input_shape("label")).astype(np.float32)}
    times = {k: [] for k in nets}
    losses = {k: [] for k in nets}
    for n in nets.values():  # a warm-up iteration each
        n.train_step(feed, 0)
    for block in range(args.blocks):
        for name, n in (nets.items() if block % 2 == 0 else reversed(nets.items())):
            for it in range(args.per_block):
                t = time.perf_counter()
                losses[name].append(n.train_step(feed, 1 + block * args.per_block + it))
                times[name].append(time.perf_counter() - t)
    base = statistics.median(times["liveness"])
    k = args.per_block
    paired = statistics.median(statistics.median(times["optimal"][b * k:(b + 1) * k])
                               / statistics.median(times["liveness"][b * k:(b + 1) * k]) for b in range(args.blocks))
    print(f"CIFAR ResNet-{args.depth}, batch {args.batch}, budget {human_bytes(budget)} "
          f"({args.fraction:.3f} of liveness's {human_bytes(live.arena_bytes)}); optimal planned in {planned:.1f} s; "
          f"{args.blocks} blocks of {args.per_block} iterations, alternating")
    for name, n in nets.items():
        t = statistics.median(times[name])
        kinds = [s.kind for s in n.schedules["train"].steps]
        print(f"{name:10s} median {t:.3f} s/iter  x{t / base:.3f} of liveness  arena {human_bytes(n.arena_bytes)}  "
              f"host {human_bytes(n.host_bytes)}  recomputes {kinds.count('recompute')}  "
              f"offloads {kinds.count('offload')}")
    print(f"paired     median over the {args.blocks} blocks of optimal's block median / liveness's: x{paired:.3f}")
    # bit for bit where optimal runs liveness's algorithms; where a workspace that fits the budget
    # takes another (im2col_chunked's per-sample sums), to float32 rounding
    def algorithms(n):
        return {(n.graph.nodes[s.node].name, s.kind): s.algorithm for s in n.schedules["train"].steps
                if s.kind in ("forward", "backward")}
    theirs, ours = algorithms(live), algorithms(best)
    other = sorted(f"{k[1]}({k[0]}) {ours[k]}" for k in theirs if ours.get(k) != theirs[k])
    gap = max(abs(a - b) / abs(a) for a, b in zip(losses["liveness"], losses["optimal"]))
    print("losses equal:", losses["liveness"] == losses["optimal"],
          f"(largest relative difference {gap:.1e}; steps on other algorithms than liveness's: "
          f"{', '.join(other) or 'none'})")


if __name__ == "__main__":
    main()
