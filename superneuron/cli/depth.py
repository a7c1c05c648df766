"""sn-depth: the deepest ResNet whose training iteration fits a device memory budget, under
each memory policy, found by planning alone (superneuron/depth.py says how).

    sn-depth --memory 12GiB --batch 16                  # nets/resnet.yaml, every policy
    sn-depth --memory 40GiB --batch 16 --policies baseline,liveness --json
    sn-depth --memory 64MiB --batch 2 --size 32 --set classes=10 --verify

Depth D = 3n + 2 means n bottleneck blocks in stages [3, 8, n - 14, 3]. Each plan is drawn on
stderr as it is made. ``--verify`` then trains two iterations of each depth found on random
data and checks that the run's peak is the plan's, to the byte.

Exit status: 0 when some policy fits depth 50, 3 when none does, 1 when --verify finds a run
whose peak differs from its plan, 2 for a bad network file or option.
"""

import argparse
import json
import sys
import time

from ..errors import SNError
from .common import run_cli


def build_parser():
    from ..depth import MAX_DEPTH
    from ..scheduler.policy import POLICIES
    p = argparse.ArgumentParser(
        prog="sn-depth", description="Find the deepest ResNet that trains in a memory budget, per policy.",
        epilog="Exit status: 0 found, 3 not even depth 50 fits, 1 --verify mismatch, 2 bad input.")
    p.add_argument("net", metavar="NET.yaml", nargs="?", default="nets/resnet.yaml",
                   help="network with a 'depth' parameter (default nets/resnet.yaml)")
    p.add_argument("--memory", metavar="SIZE", required=True, help="device memory budget, e.g. 12GiB")
    p.add_argument("--batch", type=int, metavar="N", required=True, help="batch size")
    p.add_argument("--policies", metavar="A,B,...",
                   help=f"memory policies to search (default all: {', '.join(POLICIES)})")
    p.add_argument("--size", type=int, metavar="H", help="input height and width (the net's 'size')")
    p.add_argument("--set", action="append", default=[], metavar="K=V",
                   help="override a network parameter, e.g. --set classes=10 (repeatable)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="the cost model's device, and where --verify runs (default cpu)")
    p.add_argument("--max-depth", type=int, default=MAX_DEPTH, metavar="D",
                   help=f"stop growing at this depth (default {MAX_DEPTH})")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--verify", action="store_true",
                   help="train two iterations of each depth found and compare the real peak with the plan's")
    return p


def main(argv=None):
    return run_cli(build_parser(), run, argv)


def policies_from(text):
    """``'baseline,liveness'`` → the list (None: every policy); SNError for an unknown one."""
    from ..scheduler.policy import POLICIES
    if text is None:
        return list(POLICIES)
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown or not names:
        raise SNError(f"unknown policy '{unknown[0] if unknown else text}'; known: {', '.join(POLICIES)}")
    return list(dict.fromkeys(names))


def planner_from_args(args):
    """The depth.Planner for the net, budget, batch, size, overrides and device of ``args``."""
    from ..depth import Planner
    from ..report import parse_size
    from ..spec import parse_overrides
    budget = parse_size(args.memory)
    if budget <= 0:
        raise SNError(f"--memory must be positive, got '{args.memory}'")
    if args.batch < 1:
        raise SNError(f"--batch must be at least 1, got {args.batch}")
    overrides = parse_overrides(args.set)
    if args.size is not None:
        if args.size < 1:
            raise SNError(f"--size must be at least 1, got {args.size}")
        overrides["size"] = args.size
    return Planner(args.net, budget, overrides=overrides, batch=args.batch, device=args.device)


def run(args):
    from ..depth import deepest, verify
    policies = policies_from(args.policies)
    planner = planner_from_args(args)
    start = time.perf_counter()
    results = deepest(planner, policies, max_depth=args.max_depth, progress=_progress)
    seconds = time.perf_counter() - start
    stats = planner.stats
    print(f"{stats['probes']} plans of {stats['builds']} depths in {seconds:.1f} s "
          f"(building {stats['build_seconds']:.1f} s, policies and simulation "
          f"{stats['plan_seconds']:.1f} s)", file=sys.stderr)
    checks = {}
    if args.verify:
        for r in results:
            if r.best is not None:
                print(f"verifying {r.policy} at depth {r.depth} ...", file=sys.stderr)
                checks[r.policy] = verify(planner, r, device=args.device)
    if args.json:
        print(json.dumps({
            "net": args.net, "batch": args.batch, "size": args.size, "budget_bytes": planner.budget,
            "device": args.device, "cost_model": f"estimate ({planner.costs.device.name})",
            "max_depth": args.max_depth, "seconds": round(seconds, 3), **stats,
            "results": [{**r.as_dict(), **({"verify": checks[r.policy]} if r.policy in checks else {})}
                        for r in results],
        }, indent=1))
    else:
        print(_report(args, planner, results, checks))
    if any(not c["equal"] for c in checks.values()):
        return 1
    return 0 if any(r.best is not None for r in results) else 3


def _progress(probe):
    from ..report import human_bytes
    verdict = "fits" if probe.fits else "over"
    print(f"  {probe.policy:<20} depth {probe.depth:>6}  arena {human_bytes(probe.arena_bytes):>10}  "
          f"{verdict}  ({probe.seconds:.2f} s)", file=sys.stderr)


def _seconds(t):
    return f"{t:.1f} s" if t >= 1 else f"{t * 1e3:.1f} ms"


def _report(args, planner, results, checks):
    """The table (and the notes under it) that sn-depth prints."""
    from ..report import human_bytes, table
    rows = []
    for r in results:
        b = r.best
        depth = "none" if b is None else f"{'≥' if r.at_cap else ''}{r.depth}"
        cells = [r.policy, depth]
        if b is None:
            cells += ["-"] * 6
        else:
            cells += [human_bytes(b.peak_bytes), human_bytes(b.arena_bytes), human_bytes(b.resident_bytes),
                      human_bytes(b.host_bytes), _seconds(b.est_seconds),
                      f"{r.over.depth} (+{human_bytes(r.over.arena_bytes - planner.budget)})" if r.over else "-"]
        if checks:
            c = checks.get(r.policy)
            cells += ["-" if c is None else human_bytes(c["real_peak_bytes"]),
                      "-" if c is None else ("yes" if c["equal"] else "NO")]
        rows.append(cells)
    headers = ["policy", "depth", "peak", "arena", "resident", "host", "est. iter", "next over by"]
    if checks:
        headers += ["run peak", "plan = run"]
    size = f", size {args.size}" if args.size else ""
    lines = [f"{args.net}, batch {args.batch}{size}, budget {human_bytes(planner.budget)}, "
             f"times estimated for {planner.costs.device.name}", "", table(rows, headers)]
    for r in results:
        if r.best is None:
            lines.append(f"{r.policy}: not even depth {r.over.depth} fits; it needs "
                         f"{human_bytes(r.over.arena_bytes)} ({r.over.arena_bytes} bytes)")
        elif r.at_cap:
            lines.append(f"{r.policy}: depth {r.depth} (the --max-depth cap) fits; deeper may too")
    for policy, c in checks.items():
        if not c["equal"]:
            lines.append(f"{policy}: the run's peak {c['real_peak_bytes']} bytes differs from the "
                         f"plan's {next(r.best.peak_bytes for r in results if r.policy == policy)}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
