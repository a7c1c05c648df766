"""How long sn-depth takes: the whole scan of every policy, and one plan of ResNet-2498 each.

    python tools/bench_depth.py [--memory 12GiB] [--batch 16] [--host-memory 128GiB]
                                [--depth 2498] [--json benchmarks/depth_cpu.json]

First runs ``sn-depth --memory 12GiB --batch 16 --policies baseline,...,superneurons+params
--host-memory 128GiB --json`` as a user would (a fresh process, timed from start to exit) and
records its answers; then, in this process, builds ResNet-``--depth`` once and plans it under
each policy at the same budget, as the search does (the cyclic garbage collector off, the
each plan's memos going with its schedules), timing the build and each plan.
"""

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from superneuron.explore.depth import Planner, blocks_of  # noqa: E402
from superneuron.report import human_bytes, parse_size  # noqa: E402

POLICIES = ("baseline", "liveness", "recompute", "offload", "superneurons", "superneurons+params")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def scan(args):
    """The whole sn-depth scan in a fresh process: ``(wall seconds, its JSON)``."""
    command = [sys.executable, "-m", "superneuron.cli.depth", "--memory", args.memory, "--batch", str(args.batch),
               "--policies", ",".join(POLICIES), "--host-memory", args.host_memory, "--json"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"sn-depth failed ({done.returncode}):\n{done.stderr}")
    shown = ["sn-depth" if c == "superneuron.cli.depth" else c for c in command[2:] if c != "-m"]
    return seconds, json.loads(done.stdout), " ".join(shown)


def plans(args):
    """Build ResNet-``args.depth`` and plan it under each policy: ``(build seconds, rows)``."""
    planner = Planner(os.path.join(ROOT, "nets", "resnet.yaml"), parse_size(args.memory), batch=args.batch,
                      host_memory=parse_size(args.host_memory))
    n = blocks_of(args.depth)
    gc.disable()  # as the search holds it off (depth._planning)
    try:
        start = time.perf_counter()
        planner.lowered(n)
        build = time.perf_counter() - start
        rows = []
        for policy in POLICIES:
            probe = planner.probe(policy, n)
            rows.append({"policy": policy, "seconds": probe.seconds, "steps": probe.steps, "fits": probe.fits,
                         "peak_bytes": probe.peak_bytes, "arena_bytes": probe.arena_bytes,
                         "host_bytes": probe.host_bytes})
    finally:
        gc.enable()
    return build, rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--memory", default="12GiB")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--host-memory", default="128GiB")
    p.add_argument("--depth", type=int, default=2498, help="the depth of the single plans")
    p.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = p.parse_args()

    seconds, info, command = scan(args)
    print(f"{command}\n  {seconds:.1f} s from start to exit ({info['probes']} plans of {info['builds']} depths, "
          f"{info['floors']} floors)")
    for r in info["results"]:
        depth = f"≥ {r['depth']} (cap)" if r["at_cap"] else str(r["depth"])
        print(f"  {r['policy']:<20} depth {depth:>12}  peak {human_bytes(r['peak_bytes'] or 0):>10}  "
              f"{r['probes']} plans")
    build, rows = plans(args)
    print(f"ResNet-{args.depth}, batch {args.batch}, budget {args.memory}: built (spec, graph, lower) in {build:.2f} s")
    for r in rows:
        print(f"  {r['policy']:<20} {r['seconds']:6.2f} s  {r['steps']:>7} steps  peak {human_bytes(r['peak_bytes'])}"
              f"{'' if r['fits'] else ' (does not fit)'}")
    if args.json:
        out = {"date": time.strftime("%Y-%m-%d"), "machine": platform.platform(), "cores": os.cpu_count(),
               "python": platform.python_version(),
               "scan": {"command": command, "seconds": seconds, "results": info["results"],
                        "probes": info["probes"], "builds": info["builds"], "floors": info["floors"],
                        "search_seconds": info["seconds"], "build_seconds": info["build_seconds"],
                        "plan_seconds": info["plan_seconds"], "floor_seconds": info["floor_seconds"]},
               "plans": {"depth": args.depth, "batch": args.batch, "budget": args.memory,
                         "host_memory": args.host_memory, "build_seconds": build, "results": rows}}
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
