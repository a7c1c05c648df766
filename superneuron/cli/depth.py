"""sn-depth: the deepest ResNet whose training iteration fits a device memory budget, under
each memory policy, found by planning alone (superneuron/explore/depth.py says how).

    sn-depth --memory 12GiB --batch 16 --host-memory 128GiB   # nets/resnet.yaml, every policy
    sn-depth --memory 40GiB --batch 16 --policies baseline,liveness --json
    sn-depth --memory 300MiB --batch 2 --size 64 --policies liveness,superneurons --verify

Depth D = 3n + 2 means n bottleneck blocks in stages [3, 8, n - 14, 3]. Without NET.yaml it is
the repository's nets/resnet.yaml, from any working directory. Each plan is drawn on stderr
as it is made. The search stops at --max-depth (default 5000): a policy whose plan still fits
there is reported as "≥ 5000 (cap)" (with parameter offload and no --host-memory, memory
never stops it). ``--verify`` then trains two iterations of each depth found on random data
(on --device) and prints the run's peak beside the plan's; they must be equal to the byte.

Exit status: 0 when some policy fits depth 50, 3 when none does, 1 when --verify finds a run
whose peak differs from its plan, 2 for a bad network file or option.
"""

import argparse
import json
import os
import sys
import time

from ..errors import SNError
from ..explore.depth import MAX_DEPTH, Planner, deepest, verify
from ..limits import MAX_DATA_SIDE, MAX_SEARCH_DEPTH, over
from ..netfile.spec import parse_overrides
from ..options import PlanOptions
from ..report import table
from ..scheduler.policy import POLICIES, SOLVED
from ..sizes import human_bytes, parse_size
from .common import check_batch, run_cli
from .progress import Working


def build_parser():
    p = argparse.ArgumentParser(
        prog="sn-depth", description="Find the deepest ResNet that trains in a memory budget, per policy.",
        epilog="Exit status: 0 found, 3 not even depth 50 fits, 1 --verify mismatch, 2 bad input.")
    p.add_argument("net", metavar="NET.yaml", nargs="?",
                   help="network with a 'depth' parameter (default: the repository's nets/resnet.yaml)")
    p.add_argument("--memory", metavar="SIZE", required=True, help="device memory budget, e.g. 12GiB")
    p.add_argument("--host-memory", metavar="SIZE",
                   help="most host memory offloaded tensors (and, with +params, parameters, gradients "
                        "and optimiser state) may take, e.g. 128GiB; a plan over it does not fit "
                        "(default: unbounded)")
    p.add_argument("--batch", type=int, metavar="N", required=True, help="batch size")
    p.add_argument("--policies", metavar="A,B,...",
                   help=f"memory policies to search, any of {', '.join(POLICIES)}, or one of them + "
                        f"'+params' (default: those but {', '.join(SOLVED)})")
    p.add_argument("--size", type=int, metavar="H", help="input height and width (the net's 'size')")
    p.add_argument("--set", action="append", default=[], metavar="K=V",
                   help="override a network parameter, e.g. --set classes=10 (repeatable)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="the cost model's device, and where --verify runs (default cpu)")
    p.add_argument("--max-depth", type=int, default=MAX_DEPTH, metavar="D",
                   help=f"search no deeper: a policy that fits there is reported as '≥ D (cap)' "
                        f"(default {MAX_DEPTH})")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--verify", action="store_true",
                   help="train two iterations of each depth found and compare the real peak with the plan's")
    return p


def main(argv=None):
    return run_cli(build_parser(), run, argv)


def policies_from(text):
    """``'baseline,liveness'`` → the list (None: every policy); any preset or preset + ``'+params'``
    (``liveness+params``); SNError for an unknown one."""
    if text is None:
        return [p for p in POLICIES if p not in SOLVED]
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise SNError(f"unknown policy '{text}'; known: {', '.join(POLICIES)}")
    for name in names:
        PlanOptions.of(name)  # SNError naming it when it is not a policy
    return list(dict.fromkeys(names))


def default_net():
    """The repository's nets/resnet.yaml, found from the package (so sn-depth works from any
    working directory); SNError when it is not there (an installed copy without the nets)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "nets", "resnet.yaml")
    if not os.path.isfile(path):
        raise SNError(f"no NET.yaml given and the default network is not at {path}; "
                      f"give the path of nets/resnet.yaml (or of another net with a 'depth' parameter)")
    return path


def planner_from_args(args):
    """The depth.Planner for the net, budget, host memory, batch, size, overrides and device
    of ``args`` (``args.net`` is filled in when not given)."""
    budget = parse_size(args.memory)
    if budget <= 0:
        raise SNError(f"--memory must be positive, got '{args.memory}'")
    host_memory = None if args.host_memory is None else parse_size(args.host_memory)
    if host_memory is not None and host_memory <= 0:
        raise SNError(f"--host-memory must be positive, got '{args.host_memory}'")
    check_batch(args.batch)
    if args.max_depth > MAX_SEARCH_DEPTH:
        raise SNError(over("--max-depth", args.max_depth, MAX_SEARCH_DEPTH, "MAX_SEARCH_DEPTH"))
    overrides = parse_overrides(args.set)
    if args.size is not None:
        if args.size < 1:
            raise SNError(f"--size must be at least 1, got {args.size}")
        if args.size > MAX_DATA_SIDE:
            raise SNError(over("--size", args.size, MAX_DATA_SIDE, "MAX_DATA_SIDE"))
        overrides["size"] = args.size
    if args.net is None:
        args.net = default_net()
    return Planner(args.net, budget, overrides=overrides, batch=args.batch, device=args.device,
                   host_memory=host_memory)


def run(args):
    policies = policies_from(args.policies)
    planner = planner_from_args(args)
    start = time.perf_counter()
    # a line per plan; between them, progress (a plan of a deep net takes minutes) and Ctrl-C at once
    with Working(f"sn-depth: searching {os.path.basename(args.net)} with {', '.join(policies)}",
                 limit=f"--max-depth {args.max_depth}") as working:
        results = deepest(planner, policies, max_depth=args.max_depth,
                          progress=lambda probe: _progress(probe, working))
        seconds = time.perf_counter() - start
        stats = planner.stats
        working.write(f"{stats['probes']} plans of {stats['builds']} depths in {seconds:.1f} s "
                      f"(building {stats['build_seconds']:.1f} s, policies and simulation "
                      f"{stats['plan_seconds']:.1f} s, {stats['floors']} floors for the guesses "
                      f"{stats['floor_seconds']:.1f} s)")
        checks = {}
        if args.verify:
            for r in results:
                if r.best is not None:
                    working.write(f"verifying {r.policy} at depth {r.depth} ...")
                    checks[r.policy] = verify(planner, r, device=args.device)
    if args.json:
        print(json.dumps({
            "net": args.net, "batch": args.batch, "size": args.size, "budget_bytes": planner.budget,
            "host_memory_bytes": planner.host_memory,
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


def _progress(probe, working):
    verdict = "fits" if probe.fits else "over"
    working.write(f"  {probe.policy:<20} depth {probe.depth:>6}  arena {human_bytes(probe.arena_bytes):>10}  "
                  f"{verdict}  ({probe.seconds:.2f} s)")
    working.step(f"{probe.policy} depth {probe.depth} {verdict}")


def _seconds(t):
    return f"{t:.1f} s" if t >= 1 else f"{t * 1e3:.1f} ms"


def _over_by(planner, probe):
    """What a plan that does not fit is over by: the budget, else the host memory."""
    if probe.arena_bytes > planner.budget:
        return f"+{human_bytes(probe.arena_bytes - planner.budget)}"
    return f"host +{human_bytes(probe.host_bytes - planner.host_memory)}"


def _report(args, planner, results, checks):
    """The table (and the notes under it) that sn-depth prints."""
    rows = []
    for r in results:
        b = r.best
        depth = "none" if b is None else f"≥ {r.depth} (cap)" if r.at_cap else str(r.depth)
        cells = [r.policy, depth]
        if b is None:
            cells += ["-"] * 7
        else:
            cells += [human_bytes(b.peak_bytes), human_bytes(b.arena_bytes), human_bytes(b.resident_bytes),
                      human_bytes(b.host_bytes), human_bytes(b.lower_bound_bytes), _seconds(b.est_seconds),
                      f"{r.over.depth} ({_over_by(planner, r.over)})" if r.over else "-"]
        if checks:
            c = checks.get(r.policy)
            cells += ["-" if c is None else str(b.peak_bytes),
                      "-" if c is None else str(c["real_peak_bytes"]),
                      "-" if c is None else ("yes" if c["equal"] else "NO")]
        rows.append(cells)
    headers = ["policy", "depth", "peak", "arena", "resident", "host", "lower bound", "est. iter", "next over by"]
    if checks:
        headers += ["planned peak (B)", "run peak (B)", "equal"]
    size = f", size {args.size}" if args.size else ""
    host = f", host memory {human_bytes(planner.host_memory)}" if planner.host_memory is not None else ""
    lines = [f"{args.net}, batch {args.batch}{size}, budget {human_bytes(planner.budget)}{host}, "
             f"times estimated for {planner.costs.device.name}", "", table(rows, headers)]
    for r in results:
        if r.best is None:
            what = ("host memory" if r.over.arena_bytes <= planner.budget else "device memory")
            need = r.over.host_bytes if what == "host memory" else r.over.arena_bytes
            lines.append(f"{r.policy}: not even depth {r.over.depth} fits; it needs {human_bytes(need)} "
                         f"({need} bytes) of {what}")
        elif r.at_cap:
            lines.append(f"{r.policy}: depth {r.depth}, the --max-depth cap, fits: deeper may too "
                         f"(raise --max-depth to search on)")
    for policy, c in checks.items():
        if not c["equal"]:
            lines.append(f"{policy}: the run's peak {c['real_peak_bytes']} bytes differs from the "
                         f"plan's {next(r.best.peak_bytes for r in results if r.policy == policy)}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
