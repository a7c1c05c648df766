"""The memory tables of the README: for classic ImageNet networks at batch 32 and 224x224,
the peak of one training iteration under the baseline and liveness policies, liveness's peak
over the lower bound, and the arena each allocator needs; then every policy's peak over the
lower bound, with the host memory and estimated time (H100 cost model) of the ones that copy;
then how long sn-plan takes on a ResNet of about a thousand layers.

    python tools/plan_table.py [--batch 32] [--depth 1001]
"""

import argparse
import json
import subprocess
import sys
import time

from superneuron.graph import Graph
from superneuron.report import human_bytes
from superneuron.scheduler.cost import CostModel
from superneuron.scheduler.lower import lower
from superneuron.scheduler.placement import arena_bytes
from superneuron.scheduler.policy import apply_policy
from superneuron.scheduler.simulate import simulate
from superneuron.spec import load_spec

NETS = [("AlexNet", "nets/alexnet.yaml", {}), ("VGG-16", "nets/vgg16.yaml", {}),
        ("GoogLeNet", "nets/googlenet.yaml", {}),
        ("ResNet-50", "nets/resnet.yaml", {"depth": 50}),
        ("ResNet-101", "nets/resnet.yaml", {"depth": 101}),
        ("ResNet-152", "nets/resnet.yaml", {"depth": 152})]


def row(name, path, overrides, batch):
    graph = Graph(load_spec(path, overrides=dict(overrides, size=224), batch=batch))
    base = simulate(apply_policy(lower(graph), "baseline"))
    schedule = apply_policy(lower(graph), "liveness")
    live = simulate(schedule)
    dynamic, planned = arena_bytes(schedule, "dynamic"), arena_bytes(schedule, "planned")
    return [name, human_bytes(base.peak_bytes), human_bytes(live.peak_bytes),
            f"{base.peak_bytes / live.peak_bytes:.2f}x",
            f"{live.peak_bytes / live.lower_bound_bytes:.2f}",
            f"{human_bytes(dynamic)} ({dynamic / live.peak_bytes:.3f})",
            f"{human_bytes(planned)} ({planned / live.peak_bytes:.3f})"]


POLICY_COLUMNS = ("baseline", "liveness", "recompute", "offload", "superneurons")


def policy_row(name, path, overrides, batch, model):
    """Peak (and peak / lower bound) under each policy; superneurons' host memory, estimated
    time against liveness, and how far under baseline it is."""
    graph = Graph(load_spec(path, overrides=dict(overrides, size=224), batch=batch))
    base = lower(graph)
    plans, times = {}, {}
    for policy in POLICY_COLUMNS:
        schedule = apply_policy(base, policy, costs=model)
        plans[policy], times[policy] = simulate(schedule), model.timeline(schedule)
    sn = plans["superneurons"]
    cells = [f"{human_bytes(p.peak_bytes)} ({p.peak_bytes / p.lower_bound_bytes:.2f})" for p in plans.values()]
    return [name, *cells, human_bytes(sn.lower_bound_bytes), human_bytes(sn.host_bytes),
            f"{plans['baseline'].peak_bytes / sn.peak_bytes:.1f}x",
            f"{times['superneurons'].seconds / times['liveness'].seconds:.2f}"]


def markdown(rows, headers):
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--depth", type=int, default=1001, help="ResNet depth for the timing")
    args = p.parse_args()
    rows = [row(name, path, overrides, args.batch) for name, path, overrides in NETS]
    print(f"One training iteration at batch {args.batch}, 224x224, float32 (no optimiser state).\n")
    print(markdown(rows, ["net", "baseline peak", "liveness peak", "baseline / liveness",
                          "liveness peak / lower bound", "arena, dynamic (/ peak)",
                          "arena, planned (/ peak)"]))
    model = CostModel("gpu")
    rows = [policy_row(name, path, overrides, args.batch, model) for name, path, overrides in NETS]
    print("\nEvery policy: peak (peak / lower bound); for superneurons the lower bound, the host "
          "memory it offloads to, how far under baseline it is, and its estimated time over "
          f"liveness's on the {model.device.name} cost model.\n")
    print(markdown(rows, ["net", *POLICY_COLUMNS, "lower bound", "superneurons host",
                          "baseline / superneurons", "time / liveness (est.)"]))
    for policy in ("baseline", "liveness", "superneurons"):
        cmd = ["sn-plan", "nets/resnet.yaml", "--set", f"depth={args.depth}", "--batch",
               str(args.batch), "--policy", policy, "--placement", "planned", "--json"]
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        took = time.perf_counter() - start
        if done.returncode not in (0, 3):
            sys.exit(done.stderr)
        info = json.loads(done.stdout)
        print(f"\n`{' '.join(cmd[:-1])}`: {info['steps']} steps, peak "
              f"{human_bytes(info['peak_bytes'])}, arena {human_bytes(info['arena_bytes'])}: "
              f"{took:.1f} s")
    print(f"\nWhere the time goes (ResNet-{args.depth}, liveness, in one process): "
          + ", ".join(f"{k} {v:.2f} s" for k, v in phases(args).items()))


def phases(args):
    """Seconds spent in each phase of sn-plan's work."""
    out, start = {}, time.perf_counter()

    def lap(name):
        nonlocal start
        now = time.perf_counter()
        out[name] = now - start
        start = now

    spec = load_spec("nets/resnet.yaml", overrides={"depth": args.depth}, batch=args.batch)
    lap("spec")
    graph = Graph(spec)
    lap("graph")
    schedule = lower(graph)
    lap("lower")
    schedule = apply_policy(schedule, "liveness")
    lap("inplace + liveness")
    simulate(schedule)
    lap("simulate")
    arena_bytes(schedule, "dynamic")
    lap("dynamic arena")
    arena_bytes(schedule, "planned")
    lap("planned placement")
    return out

if __name__ == "__main__":
    main()
