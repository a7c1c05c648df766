"""sn-plan: how much device memory one training iteration of a network needs under a memory
policy, without running a kernel or allocating the arena.

    sn-plan nets/resnet.yaml --set depth=152 --policy liveness --memory 12GiB
    sn-plan nets/vgg16.yaml --layers --timeline vgg.png --trace vgg.json
    sn-plan nets/lenet.yaml --profile        # time each layer on this CPU (cached) first
    sn-plan nets/resnet.yaml --set depth=50 --device gpu --ranks 8 --link 100GB/s

The estimated iteration time comes from the cost model (scheduler/cost.py): the layers' flops
and bytes at --device's assumed rates, or, with --profile, each kernel timed once on the CPU
backend (cached under ~/.cache/superneuron, or $SN_CACHE_DIR; an algorithm whose results miss
float64's by more than float32 rounding is left out and named); copies to and from the host at
the device's copy bandwidth, on streams of their own. It shows what recomputation and stalls
on copies add, against the same net under ``liveness``.

Exit status: 0 when the plan fits the budget (or none is given) and --host-memory, 3 when it
does not, 2 for a bad network file or option.
"""

import argparse
import dataclasses
import json
import math
import sys

from .. import report
from ..backend import get_backend, gpu_available, planning_kernels
from ..errors import SNError
from ..explore.tradeoff import tradeoff
from ..files import check_output_path
from ..graph import Graph
from ..planning import lowered, min_memory, plan, solver_floor
from ..runtime.profile import load_or_measure
from ..scheduler.allocator import aligned
from ..scheduler.allreduce import sync_bn_sums
from ..scheduler.cost import LINKS, CostModel
from ..scheduler.encode import summary
from ..scheduler.placement import PLACEMENTS, arena_bytes
from ..scheduler.simulate import compute_step, overflow_at
from ..scheduler.steps import ALLREDUCE, COMMUNICATION, MEMORY, WAIT_REDUCE
from ..sizes import parse_size
from ..train.optim import make_optimizer
from .common import load_spec_from_args, net_arguments, options_from_args, run_cli, solver_from_args
from .progress import Working


def build_parser():
    p = argparse.ArgumentParser(
        prog="sn-plan", description="Plan one training iteration's device memory (no kernels run).",
        epilog="Exit status: 0 fits, 3 does not fit the --memory budget, 2 bad input.")
    net_arguments(p)
    p.add_argument("--solver", metavar="FILE",
                   help="solver YAML: its optimiser state is resident (default: the net's solver: "
                        "section, else SGD with momentum, as sn-train)")
    p.add_argument("--iter-size", type=int, metavar="K",
                   help="plan gradient accumulation over K batches (solver iter_size): the gradients' "
                        "accumulators are resident; one batch's activations at a time")
    p.add_argument("--data", metavar="synthetic[:CxHxW]",
                   help="a Caffe .prototxt's Data layers become synthetic data of their shape "
                        "(crop_size, or CxHxW where the file does not say)")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    p.add_argument("--steps", action="store_true", help="print every step with the bytes live after it")
    p.add_argument("--layers", action="store_true",
                   help="print a per-layer table: working sets, bytes live, what runs in place")
    p.add_argument("--timeline", metavar="FILE.png", help="plot the bytes live over the steps")
    p.add_argument("--trace", metavar="FILE.json", help="write a Chrome/Perfetto trace of the steps")
    p.add_argument("--min-memory", action="store_true",
                   help="also find the smallest --memory under which the policy's plan fits (plans "
                        "at that budget fit, one byte less does not; a bisection over budgets)")
    p.add_argument("--tradeoff", metavar="FILE.png",
                   help="plot estimated time against budget (2/3, 1/2, 1/3, 1/4 of liveness's peak and the "
                        "smallest budget a heuristic fits) for each policy, and print the table")
    p.add_argument("--ranks", type=int, default=1, metavar="N",
                   help="data-parallel ranks: plan the gradients' all-reduce in buckets, and show it")
    p.add_argument("--link", metavar="BW[,LATENCY]",
                   help="the ranks' link, e.g. 100GB/s or 25GB/s,10us (default: the device's: "
                        "shared memory on the CPU, NVLink on GPUs)")
    p.add_argument("--sync-bn", action="store_true",
                   help="with --ranks: BatchNorm's statistics of the global batch, as sn-train --sync-bn; "
                        "their all-reduces (latency, none overlapped) are added to the estimate")
    p.add_argument("--bucket-size", metavar="SIZE", default="25MiB",
                   help="gradients all-reduced per bucket (default 25MiB, as PyTorch DDP)")
    p.add_argument("--profile", action="store_true",
                   help="time each layer's algorithms on the CPU backend (cached) and plan with "
                        "those times instead of estimates")
    return p


def main(argv=None):
    return run_cli(build_parser(), run, argv)


def plan_from_args(args, keep=None):
    """``(schedule, plan, figures, cost model)`` for the network, policy, placement, budget and
    workspace limit in ``args``; with ``args.profile``, algorithms are ranked and timed by
    measurement (the cost model is then the measured one, else the estimates of --device).
    ``keep`` (a dict) gets ``'base'``: the baseline schedule planned, and ``'options'``: the
    options.PlanOptions planned under."""
    ranks, link = ranks_from_args(args)
    options = options_from_args(args, policy="baseline", ranks=ranks)  # sn-plan's default: baseline
    budget, host_memory = options.budget, options.host_memory
    if getattr(args, "data", None) and not str(args.net).lower().endswith(".prototxt"):
        raise SNError("--data applies to Caffe .prototxt nets (a YAML net plans with its own Data layers)")
    spec = load_spec_from_args(args)
    optimizer = make_optimizer(solver_from_args(args, spec))  # the same resident state as sn-train
    # on a GPU with cuDNN the convolutions offer cuDNN's plans, as in sn-train's run
    graph = Graph(spec, kernels=planning_kernels(args.device))
    model, profile = CostModel(args.device, link=link), None
    if getattr(args, "profile", False):
        usable = args.device == "gpu" and gpu_available()[0]
        backend = get_backend("gpu" if usable else "cpu")
        profiled = load_or_measure(graph, backend)
        model = CostModel(backend.name, profiled.table, link=link)
        profile = {"cache": profiled.path, "measured": profiled.measured, "entries": len(profiled.table),
                   "rejected": [list(r) for r in profiled.rejected]}
    base = lowered(graph, optimizer=optimizer)
    if keep is not None:
        keep["base"], keep["options"] = base, options
    memo = {}
    schedule, the_plan = plan(base, options, cost=model, memo=memo)
    info = figures(schedule, the_plan, budget)
    info["optimal"] = memo.get("optimal")
    timeline = model.timeline(schedule)
    liveness = options.name == "liveness"
    live = schedule if liveness else plan(base, "liveness", cost=model, placement=options.placement,
                                          workspace_limit=options.workspace_limit)[0]
    reference = timeline if liveness else model.timeline(live)
    info["encoded"] = encoded_figures(schedule, live)
    info.update(est_seconds=timeline.seconds, est_stall_seconds=timeline.stall,
                est_recompute_seconds=timeline.recompute, copied_bytes=timeline.copied,
                est_liveness_seconds=reference.seconds,
                host_memory_bytes=host_memory, host_fits=host_memory is None or the_plan.host_bytes <= host_memory)
    info["cost_model"] = "measured" if profile else f"estimate ({model.device.name})"
    if ranks > 1:
        info["data_parallel"] = data_parallel(schedule, timeline, model, ranks, getattr(args, "sync_bn", False))
    if getattr(args, "min_memory", False):
        info["min_memory_bytes"] = min_memory(base, options, cost=model, budget=None)
        if options.solved:  # a heuristic's plan fits min_memory_bytes; the solver's may fit under it
            info["min_memory_floor_bytes"] = solver_floor(base, options, cost=model)
    info["profile"] = profile
    return schedule, the_plan, info, model


def encoded_figures(schedule, live):
    """What ``schedule`` keeps encoded (scheduler/encode.py's summary) and the bytes stashed
    across the forward/backward turn beside those of ``live``, the liveness schedule; None
    where nothing is encoded."""
    found = summary(schedule)
    if not found["tensors"]:
        return None
    return {"tensors": [{"name": n, "codec": c, "stands_for": w, "bytes": b} for n, c, w, b in found["tensors"]],
            "stash_bytes": found["stash_bytes"], "liveness_stash_bytes": summary(live)["stash_bytes"]}


def ranks_from_args(args):
    """``(ranks, cost.Link)`` from --ranks and --link (bandwidth, and optionally latency)."""
    ranks = getattr(args, "ranks", 1) or 1
    if ranks < 1:
        raise SNError(f"--ranks must be at least 1, got {ranks}")
    link = dataclasses.replace(LINKS["cpu" if args.device == "cpu" else "gpu"], ranks=ranks)
    text = getattr(args, "link", None)
    if text:
        rate, _, latency = text.partition(",")
        try:
            bandwidth = parse_size(rate.strip().removesuffix("/s"))
            seconds = _seconds(latency) if latency else link.latency
        except (SNError, ValueError):
            raise SNError(f"--link {text}: expected a bandwidth and optionally a latency, as "
                          f"100GB/s or 25GB/s,10us") from None
        if bandwidth <= 0:
            raise SNError(f"--link {text}: the bandwidth must be more than 0")
        link = dataclasses.replace(link, bandwidth=float(bandwidth), latency=seconds)
    return ranks, link


def _seconds(text):
    text = text.strip()
    for unit, scale in (("us", 1e-6), ("ms", 1e-3), ("ns", 1e-9), ("s", 1.0)):
        if text.endswith(unit):
            value = float(text[:-len(unit)])
            if not 0 <= value < float("inf"):  # NaN too
                raise ValueError(text)
            return value * scale
    raise ValueError(text)


def data_parallel(schedule, timeline, model, ranks, sync_bn=False):
    """The all-reduce figures of a data-parallel plan: each bucket (its gradients, bytes, the
    step after which it starts, its estimated seconds, and how much of it the compute stream
    waited for), the communication overlapped and exposed, and the estimated scaling
    efficiency: one rank's iteration (the same steps without the all-reduces) over this one.
    ``sync_bn``: synchronised BatchNorm's all-reduces too (``sync_bn``: their number, bytes and
    seconds), counted as communication and all exposed."""
    steps = schedule.steps
    exposed = {}
    for i, _stream, start, end in timeline.spans:
        if steps[i].kind == WAIT_REDUCE:
            exposed[steps[i].tensor] = end - start
    buckets = []
    for i, step in enumerate(steps):
        if step.kind == ALLREDUCE:
            k = i - 1
            while k > 0 and (steps[k].kind in MEMORY or steps[k].kind in COMMUNICATION):
                k -= 1
            nbytes = schedule.tensors[step.tensor].nbytes
            buckets.append({"bucket": step.tensor, "gradients": len(step.grads), "bytes": nbytes,
                            "after": steps[k].describe(schedule.graph).split(" [")[0],
                            "seconds": model.link.allreduce_seconds(nbytes),
                            "exposed_seconds": exposed.get(step.tensor, 0.0)})
    sums = sync_bn_sums(schedule) if sync_bn else []
    synced = sum(model.link.allreduce_seconds(b) for b in sums)
    communication, seconds = timeline.communication + synced, timeline.seconds + synced
    overlapped = timeline.communication - timeline.exposed
    alone = model.timeline(schedule.replace([s for s in steps if s.kind not in COMMUNICATION])).seconds
    return {"ranks": ranks, "link_bytes_per_s": model.link.bandwidth, "link_latency_s": model.link.latency,
            "buckets": buckets, "communication_seconds": communication,
            "exposed_seconds": timeline.exposed + synced, "overlapped_seconds": overlapped,
            "sync_bn": {"allreduces": len(sums), "bytes": sum(sums), "seconds": synced} if sync_bn else None,
            "one_rank_seconds": alone, "scaling_efficiency": alone / seconds if seconds else 1.0}


def figures(schedule, plan, budget):
    """The plan's figures as a JSON-ready dict (both allocators' arenas, the fit)."""
    graph = schedule.graph
    placement = "dynamic" if schedule.offsets is None else "planned"
    arenas = {k: plan.arena_bytes if k == placement else arena_bytes(schedule, k) for k in PLACEMENTS}
    fits = plan.fits(budget)
    overflow = None
    if not fits:
        overflow = overflow_at(schedule, plan, budget)
    data = graph.inputs[0].tops[0] if graph.inputs else None
    on_device = set(schedule.resident)
    accums = [t for t in schedule.resident + schedule.host_resident if schedule.tensors[t].kind == "accum"]
    return {
        "net": graph.name, "batch": graph.tensors[data].shape[0] if data else None,
        "iter_size": schedule.rounds,
        # the gradients' accumulators (iter_size > 1): resident on the device, or on the host
        # under +params, where they are part of host_bytes' resident masters
        "accumulator_bytes": sum(aligned(schedule.tensors[t].nbytes) for t in accums if t in on_device),
        "host_accumulator_bytes": sum(schedule.tensors[t].nbytes for t in accums if t not in on_device),
        "policy": schedule.policy, "placement": placement, "steps": plan.steps,
        "learnable_params": sum(math.prod(t.shape) for t in graph.tensors.values() if t.kind == "param"),
        "peak_bytes": plan.peak_bytes,
        "peak_step": compute_step(schedule, plan.peak_step),
        "resident_bytes": plan.resident_bytes, "lower_bound_bytes": plan.lower_bound_bytes,
        "peak_over_lower_bound": round(plan.peak_bytes / max(plan.lower_bound_bytes, 1), 4),
        "chosen_bound_bytes": plan.chosen_bound_bytes,
        "peak_over_chosen_bound": round(plan.peak_bytes / max(plan.chosen_bound_bytes, 1), 4),
        "arena_bytes": plan.arena_bytes,
        "arenas": arenas,
        **{f"arena_bytes_{k}": v for k, v in arenas.items()},
        **{f"fragmentation_{k}": round(v / max(plan.peak_bytes, 1), 4) for k, v in arenas.items()},
        "host_bytes": plan.host_bytes,
        "budget_bytes": budget, "fits": fits, "overflow": overflow,
        # a user's Python layers: the scheduler cannot see inside them (layers/python_layer.py)
        "opaque_layers": [n.name for n in graph.nodes if not n.layer.RECOMPUTABLE],
    }


def run(args):
    if args.timeline:  # before planning: a typo in a path should cost nothing
        report.timeline_format(args.timeline)
        check_output_path(args.timeline, "timeline")
    if args.trace:
        check_output_path(args.trace, "trace")
    if args.tradeoff:
        report.timeline_format(args.tradeoff)
        check_output_path(args.tradeoff, "tradeoff")
    keep = {}  # the baseline schedule, for --tradeoff to plan again
    with _working(args):
        schedule, plan, info, model = plan_from_args(args, keep) if args.tradeoff else plan_from_args(args)
        if args.tradeoff:
            # each policy as the table names it: no lossy encodings, one rank, parameters resident
            weighed = dataclasses.replace(keep["options"], budget=None, lossy=(), ranks=1, offload_params=False)
            info["tradeoff"] = tradeoff(keep["base"], weighed, model, info["est_liveness_seconds"])
    return _print(args, schedule, plan, info, model)


def _working(args):
    """Progress while planning (on stderr: stdout may be --json) and Ctrl-C at once."""
    policy = options_from_args(args).policy
    solver = policy in ("optimal", "auto") or args.tradeoff
    cap = f"the solver's time cap: {args.solver_time:g} s" if solver and args.solver_time else None
    return Working(f"sn-plan: planning {args.net} with policy {policy}", limit=cap)


def _print(args, schedule, plan, info, model):
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        print(report.plan_summary(info))
        print(report.time_summary(info))
        if info["encoded"]:
            print(report.encoded_summary(info["encoded"]))
        if info.get("optimal"):
            print(report.optimal_line(info["optimal"]))
        if "data_parallel" in info:
            print(report.data_parallel_summary(info["data_parallel"]))
        if "min_memory_bytes" in info:
            print(report.min_memory_line(info))
        if info["opaque_layers"]:
            names = ", ".join(f"'{n}'" for n in info["opaque_layers"])
            print(f"opaque        Python layers {names}: their bottoms and tops kept for their backward, "
                  "never recomputed")
        if info["profile"]:
            verb = "measured and wrote" if info["profile"]["measured"] else "read"
            print(f"profile       {verb} {info['profile']['cache']}")
            if info["profile"]["rejected"]:
                print(report.rejected_line(info["profile"]["rejected"]))
        if args.layers:
            print()
            print(report.layers_table(schedule, plan))
        if args.steps:
            print()
            print(report.steps_table(schedule, plan))
    if args.timeline:
        _write(args, args.timeline, report.write_timeline, schedule, plan, info["budget_bytes"])
    if args.trace:
        _write(args, args.trace, report.write_trace, schedule, plan, model)
    if args.tradeoff:
        if not args.json:
            print()
            print(report.tradeoff_table(info["tradeoff"]))
        _write(args, args.tradeoff, report.write_tradeoff, info["tradeoff"])
    return 0 if info["fits"] and info["host_fits"] else 3


def _write(args, path, write, *what):
    write(path, *what)  # SNError naming the path when the bytes did not get there
    if not args.json:
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
