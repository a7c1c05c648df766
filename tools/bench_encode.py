"""What Gist's encodings cost in time on the CPU: liveness, gist and gist --lossy fp16 side by side.

    python tools/bench_encode.py [--net tests/nets/digits_bn.yaml] [--batch 32] [--rounds 30] [--json FILE]

One training iteration of each in turn, ``--rounds`` times after a warm-up iteration each, on
one batch of random data (so machine noise hits them alike); prints the median and the fastest
seconds per iteration, their ratios to liveness's, and the peak device bytes; every
iteration's time goes into the JSON.
"""

import argparse
import json
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

RUNS = {"liveness": ("liveness", ()), "gist": ("gist", ()), "gist --lossy fp16": ("gist", ("fp16",))}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--net", default="tests/nets/digits_bn.yaml")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=30, help="timed iterations of each")
    p.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = p.parse_args()
    nets = {name: load_net(args.net, batch=args.batch, policy=policy, lossy=lossy,
                           optimizer=make_optimizer(SolverConfig(base_lr=0.01, momentum=0.9)))
            for name, (policy, lossy) in RUNS.items()}
    rng = np.random.default_rng(0)
    graph = nets["liveness"].graph
    feed = {}
    for node in graph.inputs:
        data, label = node.tops[:2]
        feed[data] = rng.standard_normal(graph.tensors[data].shape).astype(np.float32)
        feed[label] = rng.integers(0, 10, graph.tensors[label].shape).astype(np.float32)
    times = {name: [] for name in nets}
    load_before = os.getloadavg()
    for it in range(args.rounds + 1):
        for name, net in nets.items():
            start = time.perf_counter()
            net.train_step(feed, it)
            if it:  # the first iteration warms caches
                times[name].append(time.perf_counter() - start)
    load_after = os.getloadavg()
    base, fastest = statistics.median(times["liveness"]), min(times["liveness"])
    print(f"{args.net}, batch {args.batch}, {args.rounds} rounds, load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after")
    rows = {}
    for name, net in nets.items():
        t, m = statistics.median(times[name]), min(times[name])
        rows[name] = {"seconds_per_iter": t, "over_liveness": t / base, "min_seconds": m,
                      "min_over_liveness_min": m / fastest, "peak_bytes": net.peak_bytes, "samples": times[name]}
        print(f"{name:18s} median {t:.3f} s ({t / base:.2f}x)  fastest {m:.3f} s ({m / fastest:.2f}x)  "
              f"peak {human_bytes(net.peak_bytes)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"net": args.net, "batch": args.batch, "load_before": load_before,
                       "load_after": load_after, "runs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
