"""sn-train: train a network file on real or synthetic data.

    sn-train nets/lenet.yaml
    sn-train nets/resnet_cifar.yaml --data ~/cifar-10-batches-py --set depth=56 --epochs 10
    mpiexec -n 4 sn-train nets/lenet.yaml --batch 16     # data-parallel: 4 ranks, 64 a step

Launched by mpiexec with several ranks, each process is one rank (runtime/collective.py):
--batch is per rank, rank r trains on shard r of each global batch, gradients are averaged,
and only rank 0 prints, logs, tests and writes snapshots.
"""

import argparse
import dataclasses
import math
import os
import signal
import sys
import time

from .. import __version__, report
from ..backend import free_device_bytes
from ..data.feed import data_config, fixed_side, loaders, open_data
from ..errors import SNError
from ..layers import parallel
from ..limits import MAX_SEED
from ..net import Net
from ..runtime.collective import DEFAULT_TIMEOUT, launched_ranks, world
from ..scheduler.allreduce import collective_order
from ..scheduler.steps import ALLREDUCE
from ..sizes import human_bytes
from ..train.optim import make_optimizer
from ..train.snapshot import DEFAULT_KEEP
from ..train.trainer import Trainer
from .common import load_spec_from_args, net_arguments, options_from_args, run_cli, solver_from_args
from .progress import Progress, plan_lines
from .ranks import main as main_of_a_rank


def build_parser():
    p = argparse.ArgumentParser(
        prog="sn-train", description="Train a superneuron network (YAML) with a Caffe-style solver.",
        epilog="Solver values come from --solver FILE, else the net file's `solver:` section, else "
               "defaults; the flags above (--iters, --epochs, --lr, --iter-size, --display, "
               "--test-interval, --snapshot-interval) override them.")
    net_arguments(p)
    p.add_argument("--data", metavar="SRC",
                   help="data source: digits, synthetic, FILE.npz, a CIFAR-10 python folder, an "
                        "image folder, or text[:FILE_OR_FOLDER] (bytes; text alone: Python's "
                        "standard library) (default: the net's Data layer; synthetic for Input nets)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--iters", type=int, metavar="N", help="iterations to train (solver max_iter)")
    length.add_argument("--epochs", type=float, metavar="N", help="passes over the training data")
    p.add_argument("--lr", type=float, metavar="X", help="base learning rate")
    p.add_argument("--iter-size", type=int, metavar="K",
                   help="gradient accumulation (solver iter_size): each iteration sums the gradients "
                        "of K batches of --batch, scales them by 1/K and updates once, as one batch "
                        "of K x --batch would, at the peak memory of one batch (default 1)")
    p.add_argument("--solver", metavar="FILE", help="solver YAML (Caffe solver keys)")
    p.add_argument("--seed", type=int, default=0, help="seed for weights, shuffling and dropout (default 0)")
    p.add_argument("--display", type=int, metavar="N", help="print a line every N iterations")
    p.add_argument("--profile", action="store_true",
                   help="time each layer's algorithms and the copy bandwidth on this device first (cached "
                        "under ~/.cache/superneuron) and schedule by those times; without it a cached "
                        "table is used when there is one, else estimates")
    p.add_argument("--test-interval", type=int, metavar="N", help="test every N iterations (0: only at the end)")
    p.add_argument("--snapshot", metavar="DIR", help="folder for snapshots (enables snapshots)")
    p.add_argument("--snapshot-interval", type=int, metavar="N", help="snapshot every N iterations")
    p.add_argument("--snapshot-keep", type=int, metavar="N", default=DEFAULT_KEEP,
                   help=f"keep the N newest snapshots of the net in the --snapshot folder, removing older "
                        f"ones once a new one is whole (default {DEFAULT_KEEP}; 0 keeps all, as Caffe). "
                        f"One run at a time may write in a folder: a second is refused")
    p.add_argument("--resume", metavar="FILE", help="continue from a snapshot file, or from a folder's "
                   "newest snapshot of this net that is whole (damaged newer ones are skipped, and said)")
    p.add_argument("--weights", metavar="FILE.caffemodel",
                   help="start from Caffe weights, copied by layer name (as caffe train --weights)")
    p.add_argument("--snapshot-format", choices=("npz", "caffemodel"), default="npz",
                   help="caffemodel: beside each snapshot, also the weights as a .caffemodel Caffe reads")
    p.add_argument("--log", metavar="FILE.jsonl", help="write one JSON object per display and test interval")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                   help=f"under mpiexec: seconds a rank waits for the others in a collective before it "
                        f"stops every rank (default {DEFAULT_TIMEOUT:g}; more than a test pass takes)")
    p.add_argument("--sync-bn", action="store_true",
                   help="under mpiexec: BatchNorm's statistics of every rank's batch together (default: "
                        "each rank's own, as Caffe)")
    p.add_argument("--bucket-size", metavar="SIZE", default="25MiB",
                   help="under mpiexec: gradients all-reduced per bucket (default 25MiB, as PyTorch DDP)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="on a GPU: after one warm-up iteration, capture a whole training iteration as a "
                        "CUDA graph and replay it, copying each batch and learning rate in before the "
                        "launch (the same results; less host work per iteration). Where it cannot (the "
                        "CPU, ranks, parameter offload, iter_size > 1, Dropout or a Python layer, a "
                        "solver other than SGD/Nesterov, a failed capture) one line says why and the "
                        "run goes on without it. Tested on the CPU through a stand-in; not yet measured "
                        "on a GPU")
    p.add_argument("--threads", type=int, metavar="N",
                   help="CPU threads for the kernels (default: the CPUs this process may use, or "
                        "SN_THREADS, else OMP_NUM_THREADS, when set); BLAS runs one thread per call inside "
                        "them. Under mpiexec, per rank")
    return p


def main(argv=None):
    if launched_ranks() > 1:  # one of several ranks: they end together and say a failure once
        return main_of_a_rank(build_parser(), run, argv)
    return run_cli(build_parser(), run, argv)


def run(args):
    if not 0 <= args.seed <= MAX_SEED:
        raise SNError(f"--seed must be in 0 .. {MAX_SEED} (MAX_SEED), got {args.seed}")
    if args.snapshot_keep < 0:
        raise SNError(f"--snapshot-keep must be 0 (keep all) or more, got {args.snapshot_keep}")
    if not args.timeout > 0:
        raise SNError(f"--timeout must be more than 0 seconds, got {args.timeout:g}")
    if args.threads is not None:
        if not 1 <= args.threads <= 4096:
            raise SNError(f"--threads must be in 1 .. 4096, got {args.threads}")
        parallel.set_threads(args.threads)
    group = world(args.device, args.timeout)
    if group is not None and group.rank != 0:  # only rank 0 prints (cli/ranks.py)
        sys.stdout = open(os.devnull, "w")
    return _train(args, group)


def _train(args, group):

    ranks, rank = (1, 0) if group is None else (group.size, group.rank)
    spec = _fit_size_to_data(load_spec_from_args(args), args)
    solver = solver_from_args(args, spec)
    data_cfg = data_config(spec, args.data)
    optimizer = make_optimizer(solver)
    options = options_from_args(args)  # a budget and no policy named: auto, the fastest that fits it
    if options.policy == "auto" and options.budget is None:
        # on a GPU, what is free less the libraries' reserve; on the CPU, none (liveness)
        options = dataclasses.replace(options, budget=free_device_bytes(args.device))
    net = Net(spec, options, optimizer=optimizer, costs="measure" if args.profile else None, group=group,
              seed=args.seed)
    if group is not None:
        _check_same_collectives(net, group, args.sync_bn)
    data_cfg, train_set, test_set = open_data(net, data_cfg)
    batch = net.batch * ranks  # the global batch: --batch is per rank
    solver = optimizer.for_epochs(len(train_set), batch)
    train_loader, test_loader = loaders(data_cfg, train_set, test_set, batch, seed=args.seed, shard=(rank, ranks))
    if rank != 0:  # rank 0 alone tests and logs
        test_loader, args.log = None, None
    if not any("TEST" in n.phases and (n.loss_weight or n.layer.type == "Accuracy") for n in net.graph.nodes):
        test_loader = None  # a train file with no TEST loss or accuracy (SSD's): a test pass would show nothing
    trainer = Trainer(net, solver, train_loader, test_loader, snapshot_dir=args.snapshot, log_path=args.log,
                      group=group)
    trainer.snapshot_keep = args.snapshot_keep
    if args.weights:
        if args.resume:
            raise SNError("give --weights or --resume, not both (a snapshot holds the weights)")
        _load_weights(net, args.weights)
    if args.resume:
        path = trainer.restore(args.resume, on_event=_say_skipped)
        print(f"resumed from {path} at iteration {trainer.iteration}")

    n_params = sum(math.prod(net.graph.tensors[t].shape) for t in net.learnable_names)
    plan = net.plans["train"]
    per_rank = f" ({net.batch} per rank x {ranks} ranks)" if group is not None else ""
    print(f"superneuron {__version__} | net {spec.name} ({args.net}) | {len(spec.layers)} layers, "
          f"{n_params:,} parameters | batch {batch}{per_rank}"
          + (f" x iter_size {net.iter_size}" if net.iter_size > 1 else "") + f" | device {net.backend.name}")
    if group is not None:
        buckets = sum(1 for s in net.schedules["train"].steps if s.kind == ALLREDUCE)
        print(f"ranks: {group.describe()}; gradients averaged in {buckets} "
              f"bucket{'s' if buckets != 1 else ''} of up to "
              f"{args.bucket_size}, timeout {args.timeout:g} s; BatchNorm statistics "
              + ("of the global batch (--sync-bn)" if args.sync_bn else "per rank"))
    print(f"data: {data_cfg['source']} ({len(train_set)} train, {len(test_set)} test, "
          f"sample {'x'.join(map(str, train_set.sample_shape))})")
    print(f"solver: {solver.describe()} | {solver.max_iter} iterations")
    print(f"convolutions: {net.backend.convolutions()}")
    print(f"costs: {'measured on this device' if net.costs_measured else 'estimated'}")
    if net.costs_rejected:
        print(report.rejected_line(net.costs_rejected))
    print(f"memory: policy {net.policy}, plan peak {human_bytes(plan.peak_bytes)} (resident "
          f"{human_bytes(plan.resident_bytes)}, {plan.steps} steps); allocating arena of "
          f"{human_bytes(net.arena_bytes)}" + (f", host {human_bytes(plan.host_bytes)}" if plan.host_bytes else "")
          + (f" ({held})" if (held := report.host_resident_words(net.schedules["train"])) else ""))
    for line in plan_lines(trainer, net, solver):
        print(line)
    if net.graph_line:
        print(net.graph_line)
    sys.stdout.flush()

    printer = Progress(solver.max_iter, start=trainer.iteration)
    printer.start_heartbeat()
    started = time.perf_counter()
    first = trainer.iteration
    on_event = printer
    if args.snapshot_format == "caffemodel":
        on_event = _with_caffemodels(net, printer)
    if group is not None and os.environ.get("SN_FAULT"):
        on_event = _with_fault(on_event, rank, os.environ["SN_FAULT"])
    try:
        result = trainer.run(on_event)
    finally:
        printer.close()
    elapsed = time.perf_counter() - started
    done = trainer.iteration - first
    parts = [f"done: trained {spec.name} for {done} iterations in {elapsed:.1f} s"]
    if result and "test_accuracy" in result:
        parts.append(f"test accuracy {100 * result['test_accuracy']:.2f} % ({result['test_samples']} images)")
    if trainer.average_rate:
        parts.append(f"{trainer.average_rate:.0f} img/s (average over the run, its first iteration left out)")
    parts.append(f"peak device memory {human_bytes(net.peak_bytes)}, arena {human_bytes(net.arena_bytes)}")
    if net.graphs is not None and net.graphs.replays:
        parts.append(f"{net.graphs.replays} iterations replayed from the CUDA graph")
    if net.host_bytes:
        parts.append(f"host {human_bytes(net.host_bytes)}, {net.runtime.blocked} waits blocked, "
                     f"{net.runtime.stalls} stalls")
    outside = net.runtime.outside
    if net.backend.name == "gpu" and outside is not None:  # the CPU cannot see NumPy's
        parts.append(f"outside the arena {outside.count} allocations, {human_bytes(outside.bytes)}"
                     f" (last iteration)")
    print(" | ".join(parts))
    if group is not None:
        print(_ranks_line(net, group))
    return 130 if printer.interrupted else 0


def _check_same_collectives(net, group, sync_bn):
    """SNError unless every rank's plan makes its collectives in the same order (scheduler/
    allreduce.collective_order): else one rank's sum would meet another's and training would
    go wrong, or hang. Each rank plans alone; measured times (--profile) or the solver's
    time limit (optimal, auto) can make their plans differ."""
    import zlib

    order = collective_order(net.schedules["train"], sync_bn)
    if not group.agree(zlib.crc32(repr(order).encode()), "the comparison of the ranks' plans"):
        raise SNError("the ranks' plans make their collectives in different orders (each rank plans alone, "
                      "and times measured on each, or the solver of the optimal and auto policies stopped by "
                      "its time limit, can plan differently): give every rank the same --bucket-size, a "
                      "policy other than optimal and auto, and the same costs (without --profile)")


def _ranks_line(net, group):
    """What every rank ends with, gathered on rank 0: its arena's real peak against its plan's
    (plan equals run on every rank) and a checksum of its parameters (all the same)."""
    import zlib
    peaks = group.gather(net.peak_bytes, "the end of training")
    planned = group.gather(max(p.peak_bytes for p in net.plans.values()), "the end of training")
    crc = 0
    for name in net.learnable_names:
        crc = zlib.crc32(net.param(name).tobytes(), crc)
    sums = group.gather(crc, "the end of training")
    same = "plan equals run on every rank" if peaks == planned else f"plan {planned} != run {peaks}"
    return (f"ranks: peak per rank {', '.join(map(str, peaks))} bytes ({same}); parameters "
            + ("identical on every rank" if len(set(sums)) == 1 else f"DIFFER between ranks (crc32 {sums})"))


FAULT_PAUSE = 4.0  # seconds a rank that SN_FAULT pauses is silent


def _with_fault(on_event, rank, fault):
    """A test hook (``SN_FAULT=RANK:ITER:exit|kill|hang|raise|pause``): rank RANK, after
    iteration ITER, exits at once, is killed (SIGKILL), stops answering, raises an error, or
    is silent for FAULT_PAUSE seconds, then goes on (a slow rank, as the others see it)."""
    try:
        who, when, what = fault.split(":")
        who, when = int(who), int(when)
    except ValueError:
        raise SNError(f"SN_FAULT={fault}: expected RANK:ITER:exit|kill|hang|raise|pause") from None

    def hooked(event):
        on_event(event)
        if event["kind"] != "iter" or event["iter"] != when or rank != who:
            return
        if what == "exit":
            os._exit(9)
        if what == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if what == "hang":
            time.sleep(3600)
        if what == "pause":
            time.sleep(FAULT_PAUSE)  # a signal meanwhile is noted by its handler, and the sleep goes on
            return
        raise SNError(f"a fault injected by SN_FAULT after iteration {when}")
    return hooked


def _load_weights(net, path):
    """Copy a .caffemodel into ``net`` by layer name and say what happened to each layer."""
    # here, not at the top: Caffe's formats load protobuf, which costs start-up time
    from ..netfile.caffe.weights import load_weights
    report = load_weights(net, path)
    print(f"weights: {path}: copied {len(report['copied'])} layers, skipped {len(report['skipped'])} "
          f"(not in the file), refused {len(report['refused'])}, unused {len(report['unused'])}")
    for name in report["skipped"]:
        print(f"weights: skipped {name} (not in the file; keeps its initial values)")
    for name, why in report["refused"]:
        print(f"weights: refused {name}: {why} (keeps its initial values)")


def _with_caffemodels(net, printer):
    """``printer`` that also writes the weights as NAME_iter_N.caffemodel beside each snapshot."""
    # here, not at the top: Caffe's formats load protobuf, which costs start-up time
    from ..netfile.caffe.weights import write_caffemodel

    def on_event(event):
        if event["kind"] in ("snapshot", "interrupted") and event.get("path"):
            path = os.path.splitext(event["path"])[0] + ".caffemodel"
            if not os.path.exists(path):  # a snapshot_prefix's .solverstate has its own already
                write_caffemodel(net, path)
            printer(event)
            printer.write(f"weights: {path}")
            return
        printer(event)
    return on_event


def _say_skipped(event):
    if event["kind"] == "skipped_snapshot":
        print(f"resume: skipped {event['error']}")


def _fit_size_to_data(spec, args):
    """``spec`` again with its ``size`` parameter set to the side of ``--data``'s samples where
    feed.fixed_side says so (``--set size=N`` given: never), and the change said."""
    size_given = any(str(item).partition("=")[0].strip() == "size" for item in args.set)
    side = fixed_side(spec, args.data, size_given)
    if side is None:
        return spec
    print(f"data: {args.data} has {side}x{side} samples: the net's size parameter is set to {side} "
          f"(it was {spec.params['size']}; --set size=N to choose)")
    args.set = [*args.set, f"size={side}"]
    return load_spec_from_args(args)


if __name__ == "__main__":
    sys.exit(main())
