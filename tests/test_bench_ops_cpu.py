"""tools/bench_ops_cpu.py times each step of a plan beside a PyTorch operation: each pair must do
the same work, or its table compares unlike things. On a small CIFAR ResNet, every timed step's
outputs equal those of the PyTorch operation set beside it (PyTorch's BatchNorm with weight 1
and bias 0, which is superneuron's BatchNorm alone)."""

import os
import sys

import numpy as np
import torch

from superneuron import load_net

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import bench_ops_cpu  # noqa: E402


def close(ours, theirs):
    theirs = theirs.numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4 * np.abs(theirs).max())


def test_each_step_does_what_its_pytorch_twin_does():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the maps are tiny: PyTorch's second thread only costs its wake-ups
    try:
        check_pairs()
    finally:
        torch.set_num_threads(threads)


def check_pairs():
    net = load_net(os.path.join(ROOT, "nets/resnet_cifar.yaml"), overrides={"depth": 8, "size": 8}, batch=2,
                   costs={})
    schedule, rng = net.schedules["train"], np.random.default_rng(0)
    paired = set()
    for step in schedule.steps:
        if step.kind not in ("forward", "backward"):
            continue
        node = schedule.graph.nodes[step.node]
        if node.layer.type not in bench_ops_cpu.TIMED:
            continue
        ops = bench_ops_cpu.operands(node, rng)
        twin = bench_ops_cpu.theirs(node, step.kind, ops)
        size = schedule.tensors[step.workspace].nbytes if step.workspace else 0
        run, out = bench_ops_cpu.ours(node, step, size, schedule.tensors, ops)
        if twin is None:
            continue
        expected = twin()
        run()
        kind = node.layer.type
        if step.kind == "forward":
            close(out[0], expected[0] if kind == "BatchNorm" else expected)
        elif kind == "Convolution":
            dx, dw = out[0][0], out[1]["weight"]
            if dx is not None:
                close(dx, expected[0])
            close(dw, expected[1])
        else:
            close(out[0][0], expected[0] if kind == "BatchNorm" else expected)
        paired.add((kind, step.kind))
    assert paired == {("Convolution", "forward"), ("Convolution", "backward"), ("BatchNorm", "forward"),
                      ("BatchNorm", "backward"), ("ReLU", "forward"), ("ReLU", "backward"),
                      ("Eltwise", "forward"), ("Split", "backward")}
