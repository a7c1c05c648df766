"""GPT training speed on the CPU, superneuron beside PyTorch, in one run.

    python tools/bench_gpt_cpu.py [--blocks 5] [--iters 3] [--threads 2] [--set layers=2 d_model=128 ...]

The same decoder (nets/gpt.yaml: pre-norm blocks of causal multi-head attention and a tanh-GELU
MLP, untied head, byte vocabulary) at the same batch and sequence, trained with Adam in both
frameworks on the same random tokens. Both are built and warmed up first; then they run
alternately in blocks of ``--iters`` iterations (ours first in even blocks, PyTorch first in
odd ones), ``--blocks`` times, so that the noise of a shared machine hits both alike. Prints
each block's tokens per second and the median of the per-block ratios (superneuron / PyTorch).
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from superneuron import load_net  # noqa: E402
from superneuron.layers import parallel  # noqa: E402
from superneuron.train.optim import make_optimizer  # noqa: E402
from superneuron.train.solver_config import SolverConfig  # noqa: E402

SETTLE_SECONDS = 0.2  # idle BLAS threads spin after a GEMM; let them stop before the next block


class Block(nn.Module):
    """One pre-norm block as nets/gpt.yaml writes it."""

    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False, is_causal=True)[0]
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, d, heads, seq, vocab):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1))

    def forward(self, ids, targets):
        x = self.tok(ids) + self.pos
        for b in self.blocks:
            x = b(x, self.mask)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    overrides = dict(item.split("=", 1) for item in args.set)
    overrides = {k: int(v) if v.isdigit() else v for k, v in overrides.items()}
    torch.set_num_threads(args.threads)
    parallel.set_threads(args.threads)
    solver = SolverConfig(type="Adam", base_lr=1e-3, momentum=0.9, momentum2=0.99, weight_decay=0.0)
    net = load_net("nets/gpt.yaml", overrides=overrides, policy="liveness", optimizer=make_optimizer(solver))
    data, label = net.input_names
    n, t = net.input_shape(data)
    cfg = {k: overrides.get(k, d) for k, d in dict(layers=2, d_model=128, heads=4, seq=128, vocab=256).items()}
    model = GPT(cfg["layers"], cfg["d_model"], cfg["heads"], cfg["seq"], cfg["vocab"])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.99))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg["vocab"], (n, t))
    targets = rng.integers(0, cfg["vocab"], (n, t))
    feed = {data: ids.astype(np.float32), label: targets.astype(np.float32)}
    t_ids, t_targets = torch.tensor(ids), torch.tensor(targets)
    step = [0]

    def ours():
        net.train_step(feed, step[0])
        step[0] += 1

    def theirs():
        opt.zero_grad(set_to_none=True)
        model(t_ids, t_targets).backward()
        opt.step()

    def timed(fn):
        time.sleep(SETTLE_SECONDS)
        start = time.perf_counter()
        for _ in range(args.iters):
            fn()
        return n * t * args.iters / (time.perf_counter() - start)

    with threadpool_limits(args.threads):
        for fn in (ours, theirs, ours, theirs):  # warm up: plans, caches, first-call costs
            fn()
        ratios, rates = [], {"superneuron": [], "pytorch": []}
        for block in range(args.blocks):
            order = [("superneuron", ours), ("pytorch", theirs)]
            if block % 2:
                order.reverse()
            got = {name: timed(fn) for name, fn in order}
            for name, rate in got.items():
                rates[name].append(rate)
            ratios.append(got["superneuron"] / got["pytorch"])
            print(f"block {block}: superneuron {got['superneuron']:.0f} tokens/s, pytorch "
                  f"{got['pytorch']:.0f} tokens/s, ratio {ratios[-1]:.2f}", flush=True)
    print(f"GPT {cfg} batch {n}, {args.threads} threads: superneuron "
          f"{statistics.median(rates['superneuron']):.0f} tokens/s, pytorch "
          f"{statistics.median(rates['pytorch']):.0f} tokens/s, median ratio {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
