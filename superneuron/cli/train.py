"""sn-train: train a network file on real or synthetic data.

    sn-train nets/lenet.yaml
    sn-train nets/resnet_cifar.yaml --data ~/cifar-10-batches-py --set depth=56 --epochs 10
"""

import argparse
import math
import sys
import time

from .. import __version__
from ..errors import SNError
from ..limits import MAX_SEED
from ..sizes import human_bytes
from .common import load_spec_from_args, net_arguments, policy_from_args, run_cli, sizes_from_args, solver_from_args


def build_parser():
    p = argparse.ArgumentParser(
        prog="sn-train", description="Train a superneuron network (YAML) with a Caffe-style solver.",
        epilog="Solver values come from --solver FILE, else the net file's `solver:` section, else "
               "defaults; the flags below override them.")
    net_arguments(p)
    p.add_argument("--data", metavar="SRC",
                   help="data source: digits, synthetic, FILE.npz, a CIFAR-10 python folder or an "
                        "image folder (default: the net's Data layer; synthetic for Input nets)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--iters", type=int, metavar="N", help="iterations to train (solver max_iter)")
    length.add_argument("--epochs", type=float, metavar="N", help="passes over the training data")
    p.add_argument("--lr", type=float, metavar="X", help="base learning rate")
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
    p.add_argument("--resume", metavar="FILE", help="continue from a snapshot file, or from a folder's "
                   "newest snapshot of this net that is whole (damaged newer ones are skipped, and said)")
    p.add_argument("--weights", metavar="FILE.caffemodel",
                   help="start from Caffe weights, copied by layer name (as caffe train --weights)")
    p.add_argument("--snapshot-format", choices=("npz", "caffemodel"), default="npz",
                   help="caffemodel: beside each snapshot, also the weights as a .caffemodel Caffe reads")
    p.add_argument("--log", metavar="FILE.jsonl", help="write one JSON object per display and test interval")
    return p


def main(argv=None):
    return run_cli(build_parser(), run, argv)


def run(args):
    from ..data import Loader, check_labels, open_source, source_config, source_kind
    from ..net import Net
    from ..optim import make_optimizer
    from ..train import Trainer

    if not 0 <= args.seed <= MAX_SEED:
        raise SNError(f"--seed must be in 0 .. {MAX_SEED} (MAX_SEED), got {args.seed}")
    spec = load_spec_from_args(args)
    solver = solver_from_args(args, spec)
    data_cfg = _data_config(spec, args, source_config)
    optimizer = make_optimizer(solver)
    memory, host_memory, limit = sizes_from_args(args)
    net = Net(spec, device=args.device, seed=args.seed, optimizer=optimizer, memory=memory,
              policy=policy_from_args(args), placement=args.placement, workspace_limit=limit,
              host_memory=host_memory,
              costs="measure" if args.profile else None)
    classes = net.classes
    if data_cfg is None:  # an Input net: synthetic data shaped like its input, with its classes
        data_cfg = _synthetic_like(net, classes, source_config)
    train_set, test_set = open_source(data_cfg)
    if classes is not None:
        check_labels(train_set, classes, data_cfg["source"])
        check_labels(test_set, classes, data_cfg["source"])
    _check_sample_shape(net, train_set, data_cfg["source"])
    batch = net.batch
    solver = optimizer.for_epochs(len(train_set), batch)
    train_loader = Loader(train_set, batch, shuffle=data_cfg.get("shuffle", True), seed=args.seed, train=True)
    if source_kind(data_cfg["source"]) in ("lmdb", "imagelist"):  # decoded per batch: read ahead on a thread
        from ..readahead import ReadAhead
        train_loader = ReadAhead(train_loader)
    test_loader = Loader(test_set, batch, shuffle=False, seed=args.seed, train=False) if len(test_set) else None
    trainer = Trainer(net, solver, train_loader, test_loader, snapshot_dir=args.snapshot, log_path=args.log)
    if args.weights:
        if args.resume:
            raise SNError("give --weights or --resume, not both (a snapshot holds the weights)")
        _load_weights(net, args.weights)
    if args.resume:
        path = trainer.restore(args.resume, on_event=_say_skipped)
        print(f"resumed from {path} at iteration {trainer.iteration}")

    n_params = sum(math.prod(net.graph.tensors[t].shape) for t in net.learnable_names)
    plan = net.plans["train"]
    print(f"superneuron {__version__} | net {spec.name} ({args.net}) | {len(spec.layers)} layers, "
          f"{n_params:,} parameters | batch {batch} | device {net.backend.name}")
    print(f"data: {data_cfg['source']} ({len(train_set)} train, {len(test_set)} test, "
          f"sample {'x'.join(map(str, train_set.sample_shape))})")
    print(f"solver: {solver.describe()} | {solver.max_iter} iterations")
    print(f"costs: {'measured on this device' if net.costs_measured else 'estimated'}")
    print(f"memory: policy {net.policy}, plan peak {human_bytes(plan.peak_bytes)} (resident "
          f"{human_bytes(plan.resident_bytes)}, {plan.steps} steps); allocating arena of "
          f"{human_bytes(net.arena_bytes)}" + (f", host {human_bytes(plan.host_bytes)}" if plan.host_bytes else ""))

    printer = _Printer(solver.max_iter, start=trainer.iteration)
    started = time.perf_counter()
    first = trainer.iteration
    on_event = printer
    if args.snapshot_format == "caffemodel":
        on_event = _with_caffemodels(net, printer)
    try:
        result = trainer.run(on_event)
    finally:
        printer.close()
    elapsed = time.perf_counter() - started
    done = trainer.iteration - first
    parts = [f"done: trained {spec.name} for {done} iterations in {elapsed:.1f} s"]
    if result and "test_accuracy" in result:
        parts.append(f"test accuracy {100 * result['test_accuracy']:.2f} % ({result['test_samples']} images)")
    if printer.rate:
        parts.append(f"{printer.rate:.0f} img/s")
    parts.append(f"peak device memory {human_bytes(net.peak_bytes)}")
    if net.host_bytes:
        parts.append(f"host {human_bytes(net.host_bytes)}, {net.runtime.blocked} waits blocked, "
                     f"{net.runtime.stalls} stalls")
    outside = net.runtime.outside
    if net.backend.name == "gpu" and outside is not None:  # the CPU cannot see NumPy's
        parts.append(f"outside the arena {outside.count} allocations, {human_bytes(outside.bytes)}"
                     f" (last iteration)")
    print(" | ".join(parts))
    return 130 if printer.interrupted else 0


def _load_weights(net, path):
    """Copy a .caffemodel into ``net`` by layer name and say what happened to each layer."""
    from ..caffe.weights import load_weights
    report = load_weights(net, path)
    print(f"weights: {path}: copied {len(report['copied'])} layers, skipped {len(report['skipped'])} "
          f"(not in the file), refused {len(report['refused'])}, unused {len(report['unused'])}")
    for name in report["skipped"]:
        print(f"weights: skipped {name} (not in the file; keeps its initial values)")
    for name, why in report["refused"]:
        print(f"weights: refused {name}: {why} (keeps its initial values)")


def _with_caffemodels(net, printer):
    """``printer`` that also writes the weights as NAME_iter_N.caffemodel beside each snapshot."""
    from ..caffe.weights import write_caffemodel

    def on_event(event):
        if event["kind"] in ("snapshot", "interrupted") and event.get("path"):
            path = write_caffemodel(net, event["path"][:-len(".npz")] + ".caffemodel")
            printer(event)
            printer.write(f"weights: {path}")
            return
        printer(event)
    return on_event


def _say_skipped(event):
    if event["kind"] == "skipped_snapshot":
        print(f"resume: skipped {event['error']}")


def _data_config(spec, args, source_config):
    """The Data layer's configuration with ``--data`` replacing its source, or for an Input net
    the ``--data`` source (None when there is none: see :func:`_synthetic_like`)."""
    first = spec.layers[0]
    if first.type == "Data":
        if args.data:
            first.cfg.update(source_config(args.data, first.cfg))
        return first.cfg
    if args.data:
        return source_config(args.data, {"batch_size": first.cfg["shape"][0][0]})
    return None


def _synthetic_like(net, classes, source_config):
    """Learnable synthetic data with the shape and classes of an Input net."""
    shape = net.input_shape(net.input_names[0])
    if len(shape) != 4 or shape[2] != shape[3]:
        raise SNError(f"input '{net.input_names[0]}' has shape {shape}: pass --data (synthetic data "
                      f"is made for square images only)")
    cfg = source_config("synthetic", {"batch_size": shape[0]})
    cfg.update(channels=shape[1], size=shape[2], classes=classes or 10)
    return cfg


def _check_sample_shape(net, dataset, source):
    name = net.input_names[0]
    want = tuple(net.input_shape(name)[1:])
    if tuple(dataset.sample_shape) != want:
        raise SNError(f"{source}: samples have shape {tuple(dataset.sample_shape)}; the net's input "
                      f"'{name}' expects {want}")


class _Printer:
    """Progress: a bar on a terminal, plain lines at each display interval otherwise."""

    def __init__(self, total, start=0):
        self.total, self.rate, self.interrupted = total, None, False
        self.bar = None
        if sys.stdout.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=start, unit="it", dynamic_ncols=True, leave=False)

    def write(self, line):
        (self.bar.write if self.bar else print)(line)
        sys.stdout.flush()

    def __call__(self, event):
        kind = event["kind"]
        if kind == "iter":
            if self.bar:
                self.bar.update(1)
                self.bar.set_postfix(loss=f"{event['loss']:.4f}")
        elif kind == "display":
            if event.get("img_per_s"):
                self.rate = event["img_per_s"]
            acc = f" | acc {event['accuracy']:.3f}" if "accuracy" in event else ""
            speed = f" | {event['img_per_s']:.0f} img/s" if event.get("img_per_s") else ""
            self.write(f"iter {event['iter']}/{self.total} | loss {event['loss']:.4f}{acc} | "
                       f"lr {event['lr']:.2e}{speed} | peak {human_bytes(event['peak_bytes'])}")
        elif kind == "test":
            acc = f", accuracy {100 * event['test_accuracy']:.2f} %" if "test_accuracy" in event else ""
            self.write(f"test @ iter {event['iter']}: loss {event['test_loss']:.4f}{acc} "
                       f"({event['test_samples']} images)")
        elif kind == "snapshot":
            self.write(f"snapshot: {event['path']}")
        elif kind == "interrupted":
            self.interrupted = True
            saved = f"; snapshot {event['path']}" if event["path"] else ""
            self.write(f"interrupted at iteration {event['iter']}{saved}")

    def close(self):
        if self.bar:
            self.bar.close()


if __name__ == "__main__":
    sys.exit(main())
