"""A training iteration's kernels one by one, superneuron's beside PyTorch's, on the CPU.

    python tools/bench_ops_cpu.py [--net resnet20] [--batch 64] [--rounds 7] [--threads 1]
                                  [--clock cpu] [--json FILE]

Where tools/bench_cpu.py times whole iterations, this says where the difference lies. The net
is planned as bench_cpu.py plans it (nets/resnet_cifar.yaml, or LeNet), and every forward and
backward step of its plan is timed on its own: the layer's kernel with the algorithm and the
workspace the plan chose, on arrays of the step's shapes, beside the PyTorch operation that
does the same work in bench_cpu.py's PyTorch model (``conv2d`` and ``convolution_backward``,
``native_batch_norm`` and its backward, ``relu`` and ``threshold_backward``, the shortcut's and
the fan-out's ``add``). Steps of one layer type, phase and shape are one row, with how many
there are in an iteration; the two alternate, ``--rounds`` times (the order turned each
round), and each row gives the median milliseconds of one call.

PyTorch's BatchNorm2d is superneuron's BatchNorm and Scale together: its time is on the
BatchNorm rows, and the Scale rows have none. PyTorch's autograd passes the sum's gradient on
without a copy (superneuron copies it to the shortcut's gradient): none either. The layers
after the last stage (pooling, inner product, loss: under 1 % of an iteration) are left out,
and so are the optimiser and the runtime between the steps: the totals are the kernels of
an iteration, each timed alone (three calls in a row), less than a whole iteration costs.
"""

import argparse
import json
import os
import statistics
import sys
import time
from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F
from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_cpu  # noqa: E402  (tools/: its nets, its planning, its thread settings)

from superneuron.graph import storage_root  # noqa: E402
from superneuron.layers import parallel  # noqa: E402
from superneuron.layers.base import Context  # noqa: E402

TIMED = ("Convolution", "BatchNorm", "Scale", "ReLU", "Eltwise", "Split")


def _arrays(shapes, rng):
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def operands(node, rng):
    """``{"x", "dy", "params"}``: random bottoms, top gradients and parameters of ``node``."""
    layer = node.layer
    return {"x": _arrays(layer.bottom_shapes, rng), "dy": _arrays(layer.top_shapes, rng),
            "params": {s.name: rng.uniform(0.9, 1.1, s.shape).astype(np.float32) for s in layer.param_specs()}}


def ours(node, step, size, tensors, ops):
    """``(run, outputs)``: a function of no arguments running ``step`` (a forward or backward of
    ``node``) on the arrays ``ops``, with the plan's algorithm and a workspace of its size, and
    what it writes (the tops; or the bottoms' and the parameters' gradients). A top (a bottom's
    gradient) that the plan puts in its bottom's (its top gradient's) memory is that array here
    too; a backward's tops are its forward's, run once first."""
    layer, x, params = node.layer, ops["x"], ops["params"]
    same = lambda a, b: storage_root(tensors, a) == storage_root(tensors, b)  # noqa: E731
    y = [x[0] if same(t, node.bottoms[0]) else np.empty(s, np.float32)
         for t, s in zip(node.tops, layer.top_shapes, strict=True)]
    ws = np.empty(max(size, 1), np.uint8)

    def ctx():
        return Context(np, workspace=ws, algo=step.algorithm)

    if step.kind == "forward":
        return (lambda: layer.forward(ctx(), x, y, params)), y
    layer.forward(ctx(), x, y, params)
    dy = ops["dy"]
    dx = [None if g is None else dy[0] if same(g, node.top_grads[0]) else np.empty(s, np.float32)
          for g, s in zip(node.bottom_grads, layer.bottom_shapes, strict=True)]
    dp = {k: np.empty_like(params[k]) for k in node.param_grads}
    return (lambda: layer.backward(ctx(), x, y, dy, dx, params, dp)), (dx, dp)


def theirs(node, phase, ops):
    """PyTorch's operation doing ``node``'s ``phase`` in bench_cpu.py's model on copies of the
    arrays ``ops`` (a function of no arguments returning its outputs), or None where PyTorch
    runs none."""
    layer = node.layer
    x, dy = (torch.from_numpy(ops[k][0].copy()) for k in ("x", "dy"))
    kind = layer.type
    if kind == "Convolution":
        w = torch.from_numpy(ops["params"]["weight"].copy())
        args = (list(layer.stride), list(layer.pad), list(layer.dilation))
        g = layer.cfg["group"]
        if phase == "forward":
            return lambda: F.conv2d(x, w, None, *args, g)
        mask = [node.bottom_grads[0] is not None, True, False]
        return lambda: torch.ops.aten.convolution_backward(dy, x, w, None, *args, False, [0, 0], g, mask)
    if kind == "BatchNorm":  # PyTorch's BatchNorm2d(affine): superneuron's BatchNorm and Scale
        c = layer.bottom_shapes[0][1]
        w, b, rm, rv = torch.ones(c), torch.zeros(c), torch.zeros(c), torch.ones(c)
        eps = layer.cfg["eps"]
        if phase == "forward":
            return lambda: torch.native_batch_norm(x, w, b, rm, rv, True, 0.1, eps)
        _, mean, invstd = torch.native_batch_norm(x, w, b, rm, rv, True, 0.1, eps)
        return lambda: torch.ops.aten.native_batch_norm_backward(dy, x, w, rm, rv, mean, invstd, True, eps,
                                                                 [True, True, True])
    if kind == "ReLU":
        if phase == "forward":
            return lambda: torch.relu(x)
        y = torch.relu(x)
        return lambda: torch.ops.aten.threshold_backward(dy, y, 0)
    if (kind, phase) == ("Eltwise", "forward"):
        other = torch.from_numpy(ops["x"][1].copy())
        return lambda: torch.add(x, other)
    if (kind, phase) == ("Split", "backward"):
        other = torch.from_numpy(ops["dy"][1].copy())
        return lambda: torch.add(dy, other)
    return None  # Scale (in PyTorch's BatchNorm), the sum's backward, the fan-out's forward


def rows_of(net, rng):
    """``{(type, phase, shape, algorithm): [count, PyTorch's, ours]}`` over the train plan's steps."""
    schedule = net.schedules["train"]
    rows = OrderedDict()
    for step in schedule.steps:
        if step.kind not in ("forward", "backward"):
            continue
        node = schedule.graph.nodes[step.node]
        layer = node.layer
        if layer.type not in TIMED or (step.kind == "forward" and layer.ALIAS_TOPS):
            continue  # (a Split's forward: its tops are views of its bottom, nothing runs)
        shape = tuple(layer.bottom_shapes[0])
        if layer.type == "Convolution":
            shape += (layer.cfg["num_output"], layer.kernel[0], layer.stride[0])
        key = (layer.type, step.kind, shape, step.algorithm)
        if key in rows:
            rows[key][0] += 1
            continue
        size = schedule.tensors[step.workspace].nbytes if step.workspace else 0
        ops = operands(node, rng)
        rows[key] = [1, theirs(node, step.kind, ops), ours(node, step, size, schedule.tensors, ops)[0]]
    return rows


def measure(rows, rounds, clock, reps=3):
    """Median ms of one call of each row's two functions, alternated."""
    out = []
    for (kind, phase, shape, algo), (count, torch_fn, our_fn) in rows.items():
        fns = {"ours": our_fn, "theirs": torch_fn or (lambda: None)}
        times = {k: [] for k in fns}
        for f in fns.values():
            f()
        for r in range(rounds):
            for k in (("ours", "theirs") if r % 2 == 0 else ("theirs", "ours")):
                start = clock()
                for _ in range(reps):
                    fns[k]()
                times[k].append((clock() - start) / reps * 1e3)
        out.append({"layer": kind, "phase": phase, "shape": list(shape), "algorithm": algo, "count": count,
                    "superneuron_ms": statistics.median(times["ours"]),
                    "pytorch_ms": statistics.median(times["theirs"]) if torch_fn else 0.0})
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--net", default="resnet20", choices=sorted(bench_cpu.NETS))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    p.add_argument("--json")
    args = p.parse_args()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    rng = np.random.default_rng(0)
    _, path, overrides, _, shape = bench_cpu.NETS[args.net]
    x = rng.standard_normal((args.batch,) + shape).astype(np.float32)
    y = rng.integers(0, 10, args.batch).astype(np.float32)
    net, _ = bench_cpu.our_net(path, overrides, x, y)
    with bench_cpu.set_threads(args.threads), threadpool_limits(args.threads), parallel.numpy_settings():
        results = measure(rows_of(net, rng), args.rounds, clock)
    print(f"CPU: {bench_cpu.machine_line()}; {args.threads} thread(s), {args.clock} clock, "
          f"{NAME.get(args.net, args.net)} batch {args.batch}")
    print("| layer | phase | bottom shape (conv: + K, kernel, stride) | algorithm | count | superneuron ms "
          "| PyTorch ms | ratio |\n|---|---|---|---|---|---|---|---|")
    totals = {}
    for r in results:
        ratio = r["pytorch_ms"] / r["superneuron_ms"] if r["pytorch_ms"] else 0.0
        print(f"| {r['layer']} | {r['phase']} | {'x'.join(map(str, r['shape']))} | {r['algorithm']} | "
              f"{r['count']} | {r['superneuron_ms']:.2f} | {r['pytorch_ms']:.2f} | {ratio:.2f} |")
        group = "Convolution " + r["phase"] if r["layer"] == "Convolution" else "the others"
        for k, key in (("ours", "superneuron_ms"), ("theirs", "pytorch_ms")):
            totals.setdefault(group, {"ours": 0.0, "theirs": 0.0})[k] += r["count"] * r[key]
    all_ = {k: sum(t[k] for t in totals.values()) for k in ("ours", "theirs")}
    for group, t in list(totals.items()) + [("an iteration's kernels", all_)]:
        print(f"{group}: superneuron {t['ours']:.1f} ms, PyTorch {t['theirs']:.1f} ms "
              f"(ratio {t['theirs'] / t['ours']:.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "machine": bench_cpu.machine_line(), "threads": args.threads, "clock": args.clock,
                       "rows": results, "totals_ms": {**totals, "iteration": all_}}, f, indent=1)


NAME = {k: v[0] for k, v in bench_cpu.NETS.items()}

if __name__ == "__main__":
    main()
