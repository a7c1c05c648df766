"""The memory tables of benchmarks/README.md, each figure as `sn-plan` prints it: for classic ImageNet
networks at batch 32 and 224x224, one training iteration with the optimiser state sn-plan
plans by default (SGD with momentum), under every policy, on the H100 cost model
(`--device gpu`, which sets only the estimated times). Each cell comes from one command,

    sn-plan NET.yaml [--set depth=D] --batch 32 --policy P --device gpu --json

run in this process (`superneuron.cli.plan.main`); the tables print the command of each row.
Then how long sn-plan takes on a ResNet of about a thousand layers, and on long in-place
chains (tests/nets/relu_chain.yaml: n ReLUs on one blob, n aliases deep), whose time per
layer must stay flat as n grows (``--chain``; ``--chain-only`` times those alone). ``--json
FILE`` also writes every figure there.

    python tools/plan_table.py [--batch 32] [--depth 1001] [--json benchmarks/plan_table.json]
    python tools/plan_table.py --chain-only --chain 2000,20000 [--json benchmarks/plan_chain.json]
"""

import argparse
import contextlib
import io
import json
import os
import platform
import subprocess
import sys
import time

from superneuron.cli.plan import main as sn_plan_main
from superneuron.graph import Graph
from superneuron.netfile.spec import load_spec
from superneuron.report import human_bytes
from superneuron.scheduler.cost import CostModel
from superneuron.scheduler.lower import lower
from superneuron.scheduler.placement import arena_bytes
from superneuron.scheduler.policy import apply_policy
from superneuron.scheduler.simulate import simulate

NETS = [("AlexNet", "nets/alexnet.yaml", {}), ("VGG-16", "nets/vgg16.yaml", {}),
        ("GoogLeNet", "nets/googlenet.yaml", {}),
        ("ResNet-50", "nets/resnet.yaml", {"depth": 50}),
        ("ResNet-101", "nets/resnet.yaml", {"depth": 101}),
        ("ResNet-152", "nets/resnet.yaml", {"depth": 152})]

POLICY_COLUMNS = ("baseline", "liveness", "recompute", "offload", "superneurons")
PARAMS_POLICY = "superneurons+params"
POLICIES = (*POLICY_COLUMNS, PARAMS_POLICY)


def command(path, overrides, batch, policy="P"):
    """The sn-plan command line of one cell (``policy`` 'P' for a row's)."""
    sets = [f"--set {k}={v}" for k, v in overrides.items()]
    return " ".join(["sn-plan", path, *sets, "--batch", str(batch), "--policy", policy, "--device", "gpu"])


def sn_plan(path, overrides, batch, policy):
    """sn-plan's figures (its ``--json``) for :func:`command`, from the repository root."""
    argv = command(path, overrides, batch, policy).split()[1:] + ["--json"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = sn_plan_main(argv)
    if status not in (0, 3):
        sys.exit(f"{' '.join(argv)}: exit status {status}")
    return json.loads(out.getvalue())


def net_figures(path, overrides, batch):
    """sn-plan's figures for every policy of one net."""
    return {policy: sn_plan(path, overrides, batch, policy) for policy in POLICIES}


def placement_row(name, p):
    """Baseline and liveness peaks, liveness's peak / lower bound and both allocators' arenas."""
    base, live = p["baseline"], p["liveness"]
    peak = live["peak_bytes"]
    return [name, human_bytes(base["peak_bytes"]), human_bytes(peak),
            f"{base['peak_bytes'] / peak:.2f}x", f"{live['peak_over_lower_bound']:.2f}",
            f"{human_bytes(live['arena_bytes_dynamic'])} ({live['arena_bytes_dynamic'] / peak:.3f})",
            f"{human_bytes(live['arena_bytes_planned'])} ({live['arena_bytes_planned'] / peak:.3f})"]


def policy_row(name, p):
    """Peak (and peak / lower bound) under each policy; superneurons' lower bound (each step on
    its smallest-workspace algorithm) and the bound counted with the algorithms it chose (with
    its peak over that), the arena sn-train allocates for it (dynamic placement, over the
    peak), its host memory, how far under baseline it is, and its estimated time against
    liveness."""
    sn = p["superneurons"]
    cells = [f"{human_bytes(p[k]['peak_bytes'])} ({p[k]['peak_over_lower_bound']:.2f})"
             for k in POLICY_COLUMNS]
    return [name, *cells, human_bytes(sn["lower_bound_bytes"]),
            f"{human_bytes(sn['chosen_bound_bytes'])} ({sn['peak_over_chosen_bound']:.2f})",
            f"{human_bytes(sn['arena_bytes_dynamic'])} ({sn['arena_bytes_dynamic'] / sn['peak_bytes']:.3f})",
            human_bytes(sn["host_bytes"]),
            f"{p['baseline']['peak_bytes'] / sn['peak_bytes']:.1f}x",
            f"{sn['est_seconds'] / p['liveness']['est_seconds']:.2f}"]


def ms(seconds):
    return f"{seconds * 1e3:.0f}"


def time_row(name, p):
    """Estimated iteration time of liveness, superneurons (with its stalls, recomputation and
    bytes copied) and superneurons+params, with +params' peak and host memory."""
    live, sn, sp = p["liveness"], p["superneurons"], p[PARAMS_POLICY]
    return [name, ms(live["est_seconds"]),
            f"{ms(sn['est_seconds'])} ({sn['est_seconds'] / live['est_seconds']:.2f})",
            ms(sn["est_stall_seconds"]), ms(sn["est_recompute_seconds"]),
            human_bytes(sn["copied_bytes"]),
            f"{human_bytes(sp['peak_bytes'])} ({sp['peak_over_lower_bound']:.2f})",
            f"{human_bytes(sp['arena_bytes_dynamic'])} ({sp['arena_bytes_dynamic'] / sp['peak_bytes']:.3f})",
            human_bytes(sp["host_bytes"]),
            f"{ms(sp['est_seconds'])} ({sp['est_seconds'] / live['est_seconds']:.2f})"]


def markdown(rows, headers):
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--depth", type=int, default=1001, help="ResNet depth for the timing")
    p.add_argument("--json", metavar="FILE", help="also write every figure here")
    p.add_argument("--chain", default="2000,20000", help="lengths of the in-place chains timed")
    p.add_argument("--chain-only", action="store_true", help="time the chains alone")
    args = p.parse_args()
    chains = chain_timing([int(n) for n in args.chain.split(",") if n])
    if args.chain_only:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"date": time.strftime("%Y-%m-%d"), "command": " ".join(["python", *sys.argv]),
                           "machine": platform.machine(), "cores": os.cpu_count(), "chains": chains}, f, indent=1)
        return
    model = CostModel("gpu")
    nets = []
    for name, path, overrides in NETS:
        nets.append({"net": name, "file": path, "overrides": overrides,
                     "command": command(path, overrides, args.batch),
                     "policies": net_figures(path, overrides, args.batch)})

    print(f"One training iteration at batch {args.batch}, 224x224, float32, with SGD's momentum "
          "(sn-plan's default solver). Rows:\n")
    for n in nets:
        print(f"- {n['net']}: `{n['command']}`")
    print()
    print(markdown([placement_row(n["net"], n["policies"]) for n in nets],
                   ["net", "baseline peak", "liveness peak", "baseline / liveness",
                    "liveness peak / lower bound", "liveness arena, dynamic (/ peak)",
                    "liveness arena, planned (/ peak)"]))
    print("\nEvery policy: peak (peak / lower bound); for superneurons the lower bound (each step on its "
          "smallest-workspace algorithm), the bound counted with the algorithms it chose (the lower bound "
          "printed before; superneurons' peak over it), the arena "
          "sn-train allocates (dynamic placement; over the peak), the host memory it offloads to, "
          "how far under baseline it is, and its estimated time over liveness's on the "
          f"{model.device.name} cost model.\n")
    print(markdown([policy_row(n["net"], n["policies"]) for n in nets],
                   ["net", *POLICY_COLUMNS, "lower bound", "bound with the chosen algorithms (peak / it)",
                    "superneurons arena (/ peak)",
                    "superneurons host", "baseline / superneurons", "time / liveness (est.)"]))
    print(f"\nEstimated iteration time on the {model.device.name} cost model, in ms (ratio to "
          "liveness): superneurons with the part spent stalled on copies and recomputing and the "
          f"bytes it copies; {PARAMS_POLICY}: peak (peak / its lower bound), arena (/ peak), host "
          "memory, time.\n")
    print(markdown([time_row(n["net"], n["policies"]) for n in nets],
                   ["net", "liveness ms", "superneurons ms", "of which stalls", "of which recompute",
                    "copied", f"{PARAMS_POLICY} peak", f"{PARAMS_POLICY} arena (/ peak)",
                    f"{PARAMS_POLICY} host", f"{PARAMS_POLICY} ms"]))

    big = []
    for policy in ("baseline", "liveness", "superneurons"):
        cmd = ["sn-plan", "nets/resnet.yaml", "--set", f"depth={args.depth}", "--batch",
               str(args.batch), "--policy", policy, "--placement", "planned", "--json"]
        start = time.perf_counter()
        # this checkout's sn-plan, in a process of its own (its time includes the start-up)
        done = subprocess.run([sys.executable, "-m", "superneuron.cli.plan", *cmd[1:]],
                              capture_output=True, text=True)
        took = time.perf_counter() - start
        if done.returncode not in (0, 3):
            sys.exit(done.stderr)
        info = json.loads(done.stdout)
        big.append({"command": " ".join(cmd[:-1]), "policy": policy, "steps": info["steps"],
                    "peak_bytes": info["peak_bytes"], "arena_bytes": info["arena_bytes"],
                    "seconds": took})
        print(f"\n`{' '.join(cmd[:-1])}`: {info['steps']} steps, peak "
              f"{human_bytes(info['peak_bytes'])}, arena {human_bytes(info['arena_bytes'])}: "
              f"{took:.1f} s")
    spent = phases(args)
    print(f"\nWhere the time goes (ResNet-{args.depth}, liveness, in one process): "
          + ", ".join(f"{k} {v:.2f} s" for k, v in spent.items()))
    if args.json:
        out = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(["python", *sys.argv]),
               "machine": platform.machine(), "cores": os.cpu_count(), "batch": args.batch,
               "size": 224, "dtype": "float32", "optimizer_state": "SGD momentum (sn-plan's default solver)",
               "cost_model": {"device": model.device.name, "flops": model.device.flops,
                              "bandwidth": model.device.bandwidth, "copy": model.device.copy},
               "nets": nets, "sn_plan_timing": big, "chains": chains,
               "phases_seconds": {"depth": args.depth, **spent}}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


def chain_timing(lengths):
    """sn-plan's seconds (a process of its own, start-up included) on chains of ``lengths``
    in-place ReLUs, and per layer: flat per layer is near-linear planning."""
    out = []
    for n in lengths:
        cmd = ["sn-plan", "tests/nets/relu_chain.yaml", "--set", f"n={n}"]
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "superneuron.cli.plan", *cmd[1:]], capture_output=True,
                              text=True)
        took = time.perf_counter() - start
        if done.returncode != 0:
            sys.exit(done.stderr)
        out.append({"command": " ".join(cmd), "layers": n + 3, "seconds": round(took, 2),
                    "ms_per_layer": round(1000 * took / (n + 3), 3)})
        print(f"`{' '.join(cmd)}`: {took:.1f} s, {1000 * took / (n + 3):.2f} ms a layer")
    return out


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
