"""Winograd F(2x2, 3x3) against im2col (and PyTorch) on single 3x3 convolutions, on the CPU.

    python tools/bench_winograd.py [--shapes 64x16x32,64x32x16,64x64x8,32x128x28,32x256x14]
                                   [--rounds 5] [--threads 1] [--clock cpu] [--json FILE]
    python tools/bench_winograd.py --net nets/vgg16.yaml --set size=32 --set classes=10 --batch 16

``--net`` times whole training iterations of a net instead, planned twice: as every user gets
it (Winograd where the cost model chooses it) and with Winograd refused (its speed estimate
set to nothing), the two alternated ``--rounds`` times, and prints the median seconds of each.

Each shape is ``NxCxS``: batch N, C channels in and out, S x S maps, pad 1. For each, the
forward and the backward (dw and dx) of superneuron's Convolution with ``im2col`` and with
``winograd``, F(4x4, 3x3)'s forward (not offered: see layers/winograd.py), and PyTorch's
``conv2d`` forward and backward, run alternately ``--rounds`` times (the order turned each
round); it prints the median milliseconds of each and the ratios im2col / winograd (the
speed the cost model should give Winograd: scheduler/cost.py divides by it).
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch
from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from superneuron.layers import layer_class, parallel, winograd  # noqa: E402
from superneuron.layers.base import Context  # noqa: E402


def conv_layer(n, c, s):
    cls = layer_class("Convolution")
    layer = cls("conv", ["x"], ["y"], cls.config({"num_output": c, "kernel_size": 3, "pad": 1,
                                                  "bias_term": False}), dtype=np.float32)
    layer.bottom_shapes = [(n, c, s, s)]
    layer.top_shapes = layer.setup(layer.bottom_shapes)
    return layer


def kernels(n, c, s):
    """``{name: callable}`` of one shape's kernels."""
    layer = conv_layer(n, c, s)
    rng = np.random.default_rng(0)
    x, dy = (rng.standard_normal((n, c, s, s)).astype(np.float32) for _ in range(2))
    w = (rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    y, dx, dw = np.empty_like(x), np.empty_like(x), np.empty_like(w)
    out = {}
    for phase in ("forward", "backward"):
        for algo in layer.algorithms(phase):
            if algo.name not in ("im2col", "winograd"):
                continue
            ws = np.empty(max(algo.workspace, 1), np.uint8)
            ctx = lambda a=algo.name, ws=ws: Context(np, workspace=ws, algo=a)  # noqa: E731
            if phase == "forward":
                out[f"{algo.name} fwd"] = lambda ctx=ctx: layer.forward(ctx(), [x], [y], {"weight": w})
            else:
                out[f"{algo.name} bwd"] = lambda ctx=ctx: layer.backward(ctx(), [x], [None], [dy], [dx], {"weight": w},
                                                                         {"weight": dw})
    plan4 = winograd.Tiling(4, n, c, s, s, c, (1, 1))
    ws4 = [np.empty(shape, dt) for shape, dt in plan4.workspace_shapes(np.float32)]
    out["winograd4 fwd"] = lambda: winograd.convolve(np, plan4, ws4, w, x, y)
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    tdy = torch.from_numpy(dy)
    out["torch fwd"] = lambda: torch.nn.functional.conv2d(tx.detach(), tw.detach(), padding=1)

    def torch_bwd():
        torch.autograd.grad(torch.nn.functional.conv2d(tx, tw, padding=1), (tx, tw), tdy)
    out["torch bwd"] = torch_bwd
    return out


def bench_net(args, clock):
    """Median seconds of a training iteration of ``args.net`` with and without Winograd."""
    from superneuron import load_net
    from superneuron.train.optim import make_optimizer
    from superneuron.train.solver_config import SolverConfig

    overrides = {}
    for item in args.set:
        key, value = item.split("=", 1)
        overrides[key] = json.loads(value)
    nets, real_speed = {}, winograd.speed
    for name, speed in (("winograd", real_speed), ("without", lambda layer, phase: 1e-3)):
        winograd.speed = speed
        try:
            net = load_net(args.net, overrides=overrides, batch=args.batch, costs={},
                           optimizer=make_optimizer(SolverConfig(base_lr=0.01, momentum=0.9)))
        finally:
            winograd.speed = real_speed
        chosen = sum(s.algorithm == "winograd" for s in net.schedules["train"].steps)
        rng = np.random.default_rng(0)
        data, label = net.input_names
        feed = {data: rng.standard_normal(net.input_shape(data)).astype(np.float32),
                label: np.zeros(net.input_shape(label), np.float32)}
        nets[name] = (net, feed, chosen)
        net.train_step(feed, 0)  # warm up
    times = {name: [] for name in nets}
    for r in range(args.rounds):
        for name in (list(nets) if r % 2 == 0 else list(nets)[::-1]):
            net, feed, _ = nets[name]
            start = clock()
            net.train_step(feed, r + 1)
            times[name].append(clock() - start)
    med = {name: statistics.median(t) for name, t in times.items()}
    for name, (_, _, chosen) in nets.items():
        print(f"{name:>9}: {med[name] * 1e3:8.1f} ms per iteration ({chosen} Winograd steps)")
    print(f"without / winograd: {med['without'] / med['winograd']:.3f}")
    return {"net": args.net, "set": args.set, "batch": args.batch, "seconds": med,
            "winograd_steps": nets["winograd"][2], "speedup": med["without"] / med["winograd"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--net", help="time whole iterations of this net file with and without Winograd")
    p.add_argument("--set", action="append", default=[], help="net parameter KEY=VALUE (with --net)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--shapes", default="64x16x32,64x32x16,64x64x8,32x128x28,32x256x14")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    p.add_argument("--json")
    args = p.parse_args()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    parallel.set_threads(args.threads)
    torch.set_num_threads(args.threads)
    results = []
    if args.net:
        with threadpool_limits(args.threads):
            results = bench_net(args, clock)
    with threadpool_limits(args.threads), parallel.numpy_settings():
        for shape in ([] if args.net else args.shapes.split(",")):
            n, c, s = map(int, shape.split("x"))
            ks = kernels(n, c, s)
            times = {name: [] for name in ks}
            for f in ks.values():
                f()  # warm up
            for r in range(args.rounds):
                for name in (list(ks) if r % 2 == 0 else list(ks)[::-1]):
                    start = clock()
                    ks[name]()
                    times[name].append((clock() - start) * 1e3)
            med = {name: statistics.median(t) for name, t in times.items()}
            row = {"shape": shape, "ms": med,
                   "im2col/winograd fwd": med["im2col fwd"] / med["winograd fwd"],
                   "im2col/winograd bwd": med["im2col bwd"] / med["winograd bwd"],
                   "im2col/winograd4 fwd": med["im2col fwd"] / med["winograd4 fwd"]}
            results.append(row)
            print(f"{shape:>10}  " + "  ".join(f"{k} {v:7.2f}" for k, v in med.items())
                  + f"  | speed fwd {row['im2col/winograd fwd']:.2f} bwd {row['im2col/winograd bwd']:.2f}"
                  f" (F4 fwd {row['im2col/winograd4 fwd']:.2f})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, shared", "threads": args.threads,
                       "clock": args.clock, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
