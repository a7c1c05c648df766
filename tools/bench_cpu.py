"""Training speed on the CPU, superneuron beside PyTorch, in one run.

    python tools/bench_cpu.py [--threads 1,2] [--blocks 7] [--iters 4] [--json benchmarks/cpu.json]
    python tools/bench_cpu.py --profile [--net resnet20] [--threads 1] [--iters 6]

Trains LeNet on digit-shaped data (28x28, batch 64) and CIFAR ResNet-20 (32x32, batch 64,
synthetic CIFAR-shaped data) with SGD + momentum in both frameworks. Both are built and
warmed up first; then, at each thread count, they run alternately in blocks of ``--iters``
iterations (ours first in even blocks, PyTorch first in odd ones), ``--blocks`` times, in the
same process, so that machine noise hits both alike. It prints, per net and thread count,
the median images per second of each and the median of the per-block ratios
(superneuron / PyTorch), as a table and (``--json``) as JSON.

``--profile`` times one framework's iteration by parts instead (superneuron's, with PyTorch's
whole iteration alternated beside it for scale): each layer's forward and backward, and within
the convolutions their GEMMs, column gathers and scatters, the rest (transposes, fills, bias)
apart; what is left of the iteration is the runtime between the layers. Use one thread for it
(the default), where other processes on the machine disturb it least.

Threads: OpenBLAS's (threadpoolctl), PyTorch's, and superneuron's kernels'
(superneuron.layers.parallel) are all set to the count measured. Each timed block starts after
a pause of ``SETTLE_SECONDS``: a framework's idle threads spin for a while after its last call
(OpenBLAS's after a GEMM), and without the pause they took the cores from the block after
them (measured: PyTorch's LeNet at 2 threads, 4066-4305 img/s right after 20 NumPy GEMMs on
OpenBLAS's threads, 5038-5333 after a 0.2 s pause, 5216-5281 with no GEMMs before it), which
flattered superneuron's 2-thread ratios before its GEMMs stopped using OpenBLAS's threads.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections import defaultdict

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from superneuron import load_net  # noqa: E402
from superneuron.train.optim import make_optimizer  # noqa: E402
from superneuron.train.solver_config import SolverConfig  # noqa: E402

try:
    from superneuron.layers import parallel
except ImportError:  # an older tree (a "before" profile): its kernels use one thread
    parallel = None


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 20, 5), nn.Conv2d(20, 50, 5)
        self.ip1, self.ip2 = nn.Linear(800, 500), nn.Linear(500, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2, 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2, 2)
        return self.ip2(F.relu(self.ip1(x.flatten(1))))


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.a = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn_a = nn.BatchNorm2d(cout)
        self.b = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn_b = nn.BatchNorm2d(cout)
        self.proj = None
        if stride != 1 or cin != cout:
            self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn_b(self.b(F.relu(self.bn_a(self.a(x)))))
        return F.relu(y + (x if self.proj is None else self.proj(x)))


class ResNetCifar(nn.Module):
    def __init__(self, depth=20):
        super().__init__()
        n = (depth - 2) // 6
        self.conv = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        blocks, cin = [], 16
        for stage, cout in enumerate((16, 32, 64)):
            for i in range(n):
                blocks.append(Block(cin, cout, 2 if i == 0 and stage > 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = self.blocks(F.relu(self.bn(self.conv(x))))
        return self.fc(x.mean((2, 3)))


# the clock every figure is taken with: wall time, or (``--clock cpu``, one thread only) this
# process's CPU time, which other processes on a busy machine disturb far less
CLOCK = [time.perf_counter]

NETS = {  # name → (label, net file, overrides, PyTorch model maker, input shape without batch)
    "lenet": ("LeNet, 28x28", "nets/lenet.yaml", {}, LeNet, (1, 28, 28)),
    "resnet20": ("CIFAR ResNet-20, 32x32", "nets/resnet_cifar.yaml", {"depth": 20},
                 lambda: ResNetCifar(20), (3, 32, 32)),
}


def set_threads(n):
    """Every thread pool of both frameworks to ``n`` threads; returns the BLAS limiter (keep it)."""
    torch.set_num_threads(n)
    if parallel is not None:
        parallel.set_threads(n)
    return threadpool_limits(limits=n)


def torch_step(model, x, y):
    """One PyTorch training iteration as a function of no arguments."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()

    def step(i):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(xt), yt).backward()
        opt.step()
    return step


def our_net(path, overrides, x, y):
    """``(net, step)``: superneuron's net and one training iteration as ``step(i)``."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    solver = SolverConfig(base_lr=0.01, momentum=0.9, weight_decay=5e-4)
    # no measured cost table from a cache: the algorithms every user gets without --profile
    net = load_net(os.path.join(root, path), overrides=overrides, batch=len(x),
                   optimizer=make_optimizer(solver), costs={})
    data, label = net.input_names
    feed = {data: x, label: y}
    return net, lambda i: net.train_step(feed, i)


def make_pair(name, batch, rng):
    """``(net, ours, theirs)``: both frameworks' iteration functions for net ``name``."""
    _, path, overrides, model, shape = NETS[name]
    x = rng.standard_normal((batch,) + shape).astype(np.float32)
    y = rng.integers(0, 10, batch).astype(np.float32)
    net, ours = our_net(path, overrides, x, y)
    return net, ours, torch_step(model(), x, y)


# Pause before each timed block (see the module docstring)
SETTLE_SECONDS = 0.2


def timed_block(step, iters, counter):
    """Seconds of ``iters`` calls of ``step``, after a pause in which the other framework's
    idle threads stop spinning."""
    time.sleep(SETTLE_SECONDS)
    start = CLOCK[0]()
    for _ in range(iters):
        step(counter[0])
        counter[0] += 1
    return CLOCK[0]() - start


def compare(name, threads, args, rng):
    """Median img/s of each framework and the median per-block ratio, alternating blocks."""
    net, ours, theirs = make_pair(name, args.batch, rng)
    counters = {"ours": [0], "theirs": [0]}
    with set_threads(threads):
        for fn, key in ((ours, "ours"), (theirs, "theirs")):
            timed_block(fn, args.warmup, counters[key])
        rates = {"ours": [], "theirs": []}
        for block in range(args.blocks):
            order = ("ours", "theirs") if block % 2 == 0 else ("theirs", "ours")
            for key in order:
                fn = ours if key == "ours" else theirs
                rates[key].append(args.iters * args.batch / timed_block(fn, args.iters, counters[key]))
    ratios = [a / b for a, b in zip(rates["ours"], rates["theirs"], strict=True)]
    return {"net": NETS[name][0], "threads": threads, "batch": args.batch, "blocks": args.blocks,
            "iters_per_block": args.iters,
            "superneuron_img_per_s": statistics.median(rates["ours"]),
            "pytorch_img_per_s": statistics.median(rates["theirs"]),
            "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "peak_bytes": net.peak_bytes}


def machine_line():
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"torch {torch.__version__}, numpy {np.__version__}, {time.strftime('%Y-%m-%d %H:%M')}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nets", default="lenet,resnet20", help="comma-separated: lenet, resnet20")
    p.add_argument("--threads", default=None, help="comma-separated thread counts (default 1,2; "
                   "with --profile 1)")
    p.add_argument("--blocks", type=int, default=7, help="alternating blocks per framework")
    p.add_argument("--iters", type=int, default=None, help="iterations per block (default 4; "
                   "LeNet 5x that; with --profile, iterations profiled, default 6)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--profile", action="store_true", help="superneuron's iteration by parts")
    p.add_argument("--net", default="resnet20", help="the net --profile times")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: this process's CPU time, for one thread on a busy machine")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    if args.clock == "cpu":
        if any(int(t) != 1 for t in (args.threads or "1").split(",")):
            p.error("--clock cpu measures one thread only (--threads 1)")
        CLOCK[0] = time.process_time
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    if args.profile:
        return profile(args, rng)
    threads = [int(t) for t in (args.threads or "1,2").split(",")]
    results = []
    print(f"CPU: {machine_line()}; {args.clock} clock")
    print(f"{'net':24s} {'threads':>7s} {'superneuron img/s':>18s} {'PyTorch img/s':>14s} "
          f"{'ratio':>6s} {'(min-max)':>11s}")
    base_iters = args.iters or 4
    for name in args.nets.split(","):
        for n in threads:
            args.iters = base_iters * (5 if name == "lenet" else 1)  # LeNet's steps are short
            r = compare(name, n, args, rng)
            results.append(r)
            print(f"{r['net']:24s} {n:7d} {r['superneuron_img_per_s']:18.1f} "
                  f"{r['pytorch_img_per_s']:14.1f} {r['ratio']:6.2f} "
                  f"({r['ratio_min']:.2f}-{r['ratio_max']:.2f})", flush=True)
    out = {"date": time.strftime("%Y-%m-%d"), "machine": platform.platform(), "clock": args.clock,
           "cores": os.cpu_count(), "results": results}
    print(json.dumps({f"{r['net']} @{r['threads']}": round(r["ratio"], 3) for r in results}))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


# -- --profile: one iteration by parts ---------------------------------------------------------

CONV_TYPES = ("Convolution", "Deconvolution")
FUSED_GROUP = ("BatchNorm", "Scale", "ReLU", "Eltwise", "Split")
# functions of superneuron.layers' modules (those a tree has) → the part their time goes to
CONV_HELPERS = {("conv", "gather"): "im2col gathers", ("im2col", "columns"): "im2col gathers",
                ("im2col_rows", "rows_of"): "im2col gathers",
                ("conv", "scatter_add"): "col2im scatter_add",
                ("im2col_rows", "_scatter_taps"): "col2im scatter_add"}
PARTS = ["convolution GEMMs", "col2im scatter_add", "im2col gathers",
         "convolution: transposes, fills, bias", "BatchNorm, Scale, ReLU, Eltwise, Split",
         "other layers (pooling, inner product, loss)", "optimizer update", "runtime between layers"]


class PartTimer:
    """Exclusive time per part: a timed call's time less that of the timed calls inside it."""

    def __init__(self):
        self.totals = defaultdict(float)
        self.stack = []  # [label, layer type, time of timed calls inside]

    def wrap(self, fn, label):
        """``fn`` timed under ``label`` (a string, or a function of the enclosing layer type)."""
        def timed(*a, **k):
            if threading.current_thread() is not threading.main_thread():
                return fn(*a, **k)  # a part of a split kernel: its caller times it whole
            layer = self.stack[-1][1] if self.stack else None
            name = label(layer) if callable(label) else label
            if name is None:  # not inside a layer of interest: untimed
                return fn(*a, **k)
            return self._exclusive([name, layer, 0.0], fn, a, k, None)
        return timed

    def _exclusive(self, entry, fn, a, k, whole):
        """``fn(*a, **k)`` with its exclusive time (less what timed calls inside it took) added
        to ``entry``'s part; its whole time goes to the enclosing entry's inner time or, if
        ``whole`` is a part's name, to that part."""
        start = CLOCK[0]()
        self.stack.append(entry)
        try:
            return fn(*a, **k)
        finally:
            self.stack.pop()
            spent = CLOCK[0]() - start
            self.totals[entry[0]] += spent - entry[2]
            if whole is not None:
                self.totals[whole] += spent
            elif self.stack:
                self.stack[-1][2] += spent

    def layer(self, fn, layer_type):
        """A layer method: its exclusive time goes to its type's part."""
        part = ("convolution: transposes, fills, bias" if layer_type in CONV_TYPES
                else "BatchNorm, Scale, ReLU, Eltwise, Split" if layer_type in FUSED_GROUP
                else "other layers (pooling, inner product, loss)")

        def timed(*a, **k):
            return self._exclusive([part, layer_type, 0.0], fn, a, k, "layers")
        return timed


def instrument(net, timer):
    """Wrap the layer methods of ``net``'s layer classes, the convolution helpers, NumPy's
    matmul (a convolution's GEMM inside a convolution, the enclosing layer's part elsewhere)
    and the optimizer's update. Returns a function undoing it all."""
    import importlib
    undo = []

    def patch(owner, name, new):
        old = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        setattr(owner, name, new)
        undo.append(lambda: setattr(owner, name, old))

    for cls in {type(node.layer) for node in net.graph.nodes}:
        for phase in ("forward", "backward"):
            for klass in cls.__mro__:  # the class that defines it
                if phase in klass.__dict__:
                    break
            if klass.__name__ == "Layer":
                continue
            wrapped = timer.layer(getattr(cls, phase), cls.__name__)
            own = cls.__dict__.get(phase)
            undo.append(lambda c=cls, p=phase, o=own: setattr(c, p, o) if o else delattr(c, p))
            setattr(cls, phase, wrapped)
    for (module, name), part in CONV_HELPERS.items():
        try:
            module = importlib.import_module("superneuron.layers." + module)
        except ImportError:
            continue
        if hasattr(module, name):
            patch(module, name, timer.wrap(getattr(module, name), part))
    for name in ("matmul", "dot"):
        patch(np, name, timer.wrap(getattr(np, name), lambda layer: None if layer is None else
                                   "convolution GEMMs" if layer in CONV_TYPES else
                                   timer.stack[-1][0]))
    patch(net.optimizer, "update", timer.wrap(net.optimizer.update, "optimizer update"))

    def restore():
        for fn in reversed(undo):
            fn()
    return restore


def profile(args, rng):
    """Print superneuron's iteration of ``args.net`` by parts, PyTorch's whole one beside it."""
    threads = int((args.threads or "1").split(",")[0])
    iters = args.iters or 6
    net, ours, theirs = make_pair(args.net, args.batch, rng)
    steps = sum(s.kind in ("forward", "backward") for s in net.schedules["train"].steps)
    with set_threads(threads):
        counters = [0], [0]
        timed_block(ours, args.warmup, counters[0])
        timed_block(theirs, args.warmup, counters[1])
        timer, ours_s, theirs_s = PartTimer(), [], []
        for _ in range(args.blocks):
            theirs_s.append(timed_block(theirs, 1, counters[1]))
            restore = instrument(net, timer)
            try:
                ours_s.append(timed_block(ours, iters, counters[0]) / iters)
            finally:
                restore()
        total = sum(ours_s) * iters
    parts = {k: v / (args.blocks * iters) for k, v in timer.totals.items()}
    per_iter = total / (args.blocks * iters)
    accounted = sum(parts.get(k, 0.0) for k in PARTS[:-2]) + parts.get("optimizer update", 0.0)
    parts["runtime between layers"] = per_iter - accounted
    rows = [{"part": k, "ms": 1e3 * parts.get(k, 0.0), "share": parts.get(k, 0.0) / per_iter}
            for k in PARTS]
    print(f"CPU: {machine_line()}, {threads} thread(s), {args.clock} clock")
    print(f"superneuron {NETS[args.net][0]}, batch {args.batch}: {1e3 * per_iter:.1f} ms per "
          f"iteration (median block {1e3 * statistics.median(ours_s):.1f} ms), PyTorch "
          f"{1e3 * statistics.median(theirs_s):.1f} ms (median)" + f"; {steps} layer steps")
    print("| part | ms | share |\n|---|---|---|")
    for r in rows:
        print(f"| {r['part']} | {r['ms']:.1f} | {100 * r['share']:.0f} % |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "machine": platform.platform(),
                       "threads": threads, "net": args.net, "ms_per_iteration": 1e3 * per_iter,
                       "pytorch_ms": 1e3 * statistics.median(theirs_s), "parts": rows}, f, indent=2)


if __name__ == "__main__":
    main()
