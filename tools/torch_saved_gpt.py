"""What PyTorch's autograd keeps for a GPT's backward: its saved tensors, counted.

    python tools/torch_saved_gpt.py [--layers 12 --d-model 768 --heads 12 --seq 1024 --vocab 256 --batch 8]

Builds tools/bench_gpt_cpu.py's GPT (the layout of nets/gpt.yaml) on the CPU, runs its
forward and loss under ``torch.autograd.graph.saved_tensors_hooks``, and adds up the bytes of
every distinct tensor the graph saved for the backward (parameters apart: they are resident in
both frameworks). That is what eager PyTorch holds at the end of the forward besides the
parameters, the figure to set beside sn-plan's peaks. It runs the forward for real (GPT-2
small at 8 x 1024 tokens: some 6 GB and a minute on two cores): on the ``meta`` device
PyTorch's attention takes another path, which saves the probabilities (measured: 5.3 MB
against 2.9 MB on the CPU for one small layer), so the count would not be what users get.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gpt_cpu import GPT  # noqa: E402


def saved_bytes(layers, d_model, heads, seq, vocab, batch):
    """``(saved activation bytes, parameter bytes)`` of one forward of the GPT."""
    model = GPT(layers, d_model, heads, seq, vocab)
    ids = torch.zeros(batch, seq, dtype=torch.long)
    targets = torch.zeros(batch, seq, dtype=torch.long)
    params = {id(p) for p in model.parameters()}
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    seen = {}

    def pack(t):
        # a tensor saved twice (or a view of a saved one) is kept once: key by what it is a view of
        base = t._base if t._base is not None else t
        if id(base) not in params and not isinstance(base, torch.nn.Parameter):
            seen[id(base)] = base.numel() * base.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids, targets)
    return sum(seen.values()), param_bytes


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("layers", 12), ("d-model", 768), ("heads", 12), ("seq", 1024), ("vocab", 256), ("batch", 8)):
        p.add_argument(f"--{name}", type=int, default=default)
    a = p.parse_args(argv)
    saved, params = saved_bytes(a.layers, a.d_model, a.heads, a.seq, a.vocab, a.batch)
    gib = 1 << 30
    print(f"PyTorch {torch.__version__} autograd, GPT layers {a.layers} d {a.d_model} heads {a.heads} "
          f"seq {a.seq} vocab {a.vocab} batch {a.batch}: saved for the backward {saved / gib:.2f} GiB; "
          f"parameters {params / gib:.2f} GiB (x4 with gradients and Adam's two moments: {4 * params / gib:.2f} GiB)")


if __name__ == "__main__":
    main()
