"""Training speed on the CPU, superneuron beside PyTorch, in one run.

    python tools/bench_cpu.py [--iters 30] [--json benchmarks/cpu.json]

Trains LeNet on the digits (28x28, batch 64) and CIFAR ResNet-20 (32x32, batch 64, synthetic
CIFAR-shaped data) with SGD + momentum in both frameworks, leaves out the warm-up iterations,
and prints images per second for each and their ratio (superneuron / PyTorch). The two run
alternately, in the same process, so machine noise hits both alike.
"""

import argparse
import json
import os
import platform
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from superneuron import load_net  # noqa: E402
from superneuron.optim import SolverConfig, make_optimizer  # noqa: E402


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


def time_torch(model, x, y, iters, warmup):
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()
    for i in range(warmup + iters):
        if i == warmup:
            start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(xt), yt).backward()
        opt.step()
    return iters * len(x) / (time.perf_counter() - start)


def time_ours(path, overrides, x, y, iters, warmup):
    solver = SolverConfig(base_lr=0.01, momentum=0.9, weight_decay=5e-4)
    net = load_net(path, overrides=overrides, batch=len(x), optimizer=make_optimizer(solver))
    data, label = net.input_names
    feed = {data: x, label: y}
    for i in range(warmup + iters):
        if i == warmup:
            start = time.perf_counter()
        net.train_step(feed, i)
    return iters * len(x) / (time.perf_counter() - start), net.peak_bytes


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    b = args.batch
    cases = [
        ("LeNet, digits 28x28", "nets/lenet.yaml", {}, LeNet(), (b, 1, 28, 28)),
        ("CIFAR ResNet-20, 32x32", "nets/resnet_cifar.yaml", {"depth": 20}, ResNetCifar(20), (b, 3, 32, 32)),
    ]
    results = []
    print(f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads), numpy {np.__version__}")
    print(f"{'net':26s} {'superneuron img/s':>18s} {'PyTorch img/s':>14s} {'ratio':>6s}")
    for name, path, overrides, model, shape in cases:
        x = rng.standard_normal(shape).astype(np.float32)
        y = rng.integers(0, 10, shape[0]).astype(np.float32)
        ours, peak = time_ours(path, overrides, x, y, args.iters, args.warmup)
        theirs = time_torch(model, x, y, args.iters, args.warmup)
        results.append({"net": name, "batch": b, "superneuron_img_per_s": ours,
                        "pytorch_img_per_s": theirs, "ratio": ours / theirs, "peak_bytes": peak})
        print(f"{name:26s} {ours:18.1f} {theirs:14.1f} {ours / theirs:6.2f}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "machine": platform.platform(),
                       "cores": os.cpu_count(), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
