"""What the memory policies cost in time on the CPU, measured side by side in one run.

    python tools/bench_policies.py [--depth 56] [--batch 64] [--iters 6] [--json benchmarks/policies_cpu.json]

Trains CIFAR ResNet-56 (32x32, synthetic CIFAR-shaped data, SGD + momentum) under each policy
and prints seconds per iteration, the peak device (arena) bytes, the host bytes and how long
each policy takes against ``liveness``. The policies take turns iteration by iteration, after
a warm-up iteration each, so machine noise hits them alike; the median is reported, and
the fastest iteration with its ratio to liveness's fastest (steadier when other jobs share the
machine, since they only ever add time); every iteration's time goes into the JSON. The
offload copies run on the runtime's copy threads, overlapping the layers as on a GPU.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from superneuron import load_net  # noqa: E402
from superneuron.report import human_bytes  # noqa: E402
from superneuron.train.optim import make_optimizer  # noqa: E402
from superneuron.train.solver_config import SolverConfig  # noqa: E402

POLICIES = ("liveness", "recompute", "offload", "superneurons")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depth", type=int, default=56)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--iters", type=int, default=6, help="timed iterations per policy")
    p.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = p.parse_args()

    nets = {pol: load_net("nets/resnet_cifar.yaml", overrides={"depth": args.depth}, batch=args.batch,
                          policy=pol, optimizer=make_optimizer(SolverConfig(base_lr=0.01)))
            for pol in POLICIES}
    rng = np.random.default_rng(0)
    any_net = nets["liveness"]
    feed = {"data": rng.standard_normal(any_net.input_shape("data")).astype(np.float32),
            "label": rng.integers(0, 10, any_net.input_shape("label")).astype(np.float32)}
    times = {pol: [] for pol in POLICIES}
    blocked = {}  # Waits that really waited, counted from the end of the warm-up iteration
    load_before = os.getloadavg()
    for it in range(args.iters + 1):
        for pol, net in nets.items():
            start = time.perf_counter()
            net.train_step(feed, it)
            if it:  # the first iteration warms caches
                times[pol].append(time.perf_counter() - start)
            else:
                blocked[pol] = net.runtime.blocked
    load_after = os.getloadavg()
    base = statistics.median(times["liveness"])
    fastest = min(times["liveness"])  # a second ratio, of the fastest iterations: noise on a
    # shared machine only ever adds time, so it is the steadier one when other jobs run
    rows = {}
    print(f"CIFAR ResNet-{args.depth}, batch {args.batch}, {args.iters} iterations each, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after\n")
    print(f"{'policy':14s} {'s/iter':>8s} {'min':>8s} {'x liveness':>10s} {'(min)':>6s} {'peak':>10s} {'host':>10s} "
          f"{'waited/iter':>15s} {'stalls':>6s}")
    for pol, net in nets.items():
        t = statistics.median(times[pol])
        waited = (net.runtime.blocked - blocked[pol]) / args.iters
        waits = sum(step.kind == "wait" for step in net.schedules["train"].steps)
        rows[pol] = {"seconds_per_iter": t, "over_liveness": t / base, "min_seconds": min(times[pol]),
                     "min_over_liveness_min": min(times[pol]) / fastest,
                     "samples": times[pol], "peak_bytes": net.peak_bytes,
                     "host_bytes": net.host_bytes, "stalls": net.runtime.stalls,
                     "waits_blocked": net.runtime.blocked, "waits_blocked_per_iter": waited,
                     "waits_per_iter": waits}
        print(f"{pol:14s} {t:8.3f} {min(times[pol]):8.3f} {t / base:10.2f} {min(times[pol]) / fastest:6.2f} "
              f"{human_bytes(net.peak_bytes):>10s} {human_bytes(net.host_bytes):>10s} "
              f"{f'{waited:.1f} of {waits}':>15s} {net.runtime.stalls:6d}")
    if args.json:
        out = {"date": time.strftime("%Y-%m-%d"), "machine": platform.machine(), "cores": os.cpu_count(),
               "net": f"resnet{args.depth}_cifar", "batch": args.batch, "iters": args.iters,
               "command": " ".join(["python", *sys.argv]), "loadavg_before": load_before,
               "loadavg_after": load_after, "policies": rows}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
