"""Whole networks: the Runtime against PyTorch, and the arena owning memory (plan equals run,
measured from the kernels' operands: test_plan_equals_run.py)."""

import tracemalloc

import numpy as np
import pytest
from torch_ref import run_torch

from superneuron import load_net

# Small sizes so a whole iteration of each net runs in a moment on the CPU.
SMALL = {
    "nets/lenet.yaml": {},
    "nets/alexnet.yaml": {"size": 67, "classes": 10},
    "nets/vgg16.yaml": {"size": 32, "classes": 10},
    "nets/googlenet.yaml": {"size": 64, "classes": 10},
    "nets/resnet.yaml": {"depth": 18, "size": 64, "classes": 10},
    "nets/resnet_cifar.yaml": {"depth": 20},
}


def feed_for(net, seed=0):
    rng = np.random.default_rng(seed)
    data, label = net.input_names
    x = rng.standard_normal(net.input_shape(data)).astype(np.float32)
    classes = next(net.graph.tensors[n.bottoms[0]].shape[1] for n in net.graph.losses)
    y = rng.integers(0, classes, net.input_shape(label)).astype(np.float32)
    return {data: x, label: y}


def small_net(path, batch=2, **kw):
    overrides = {k: v for k, v in SMALL[path].items()}
    return load_net(path, overrides=overrides, batch=batch, **kw)


@pytest.mark.parametrize("path", ["nets/resnet.yaml", "nets/googlenet.yaml", "nets/lenet.yaml",
                                  "nets/resnet_cifar.yaml"])
def test_loss_and_every_gradient_match_pytorch(path):
    """The loss and every parameter gradient equal PyTorch's for the same weights and inputs,
    to float32 rounding (ResNet-18 among them)."""
    net = small_net(path)
    feed = feed_for(net)
    loss = net.forward_backward(feed)
    ref_loss, ref_grads, _ = run_torch(net, feed)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    learnable = net.learnable_names
    assert set(ref_grads) == set(learnable)
    for name in learnable:
        g, r = net.grad(name), ref_grads[name]
        scale = max(np.abs(r).max(), 1e-3)
        np.testing.assert_allclose(g, r, rtol=0, atol=2e-4 * scale, err_msg=name)


@pytest.mark.parametrize("policy", ["baseline", "liveness"])
def test_steady_state_iterations_allocate_only_bookkeeping(policy):
    """Outside the arena, an iteration allocates only small bookkeeping (views, contexts, the
    NumPy buffers of strided ufuncs — at most a few hundred KiB, independent of the batch),
    far below the net's activations."""
    net = small_net("nets/resnet_cifar.yaml", batch=8, policy=policy)
    feed = feed_for(net)
    net.forward_backward(feed)
    tracemalloc.start()
    try:
        net.forward_backward(feed, iteration=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    activations = sum(t.nbytes for t in net.graph.tensors.values() if t.kind == "data")
    assert peak < 512 * 1024 and peak < activations / 10, (peak, activations)


def test_same_seed_same_result_and_api_round_trips():
    a, b = small_net("nets/lenet.yaml", seed=3), small_net("nets/lenet.yaml", seed=3)
    feed = feed_for(a)
    assert a.forward_backward(feed) == b.forward_backward(feed)
    w = np.full_like(a.param("ip2/weight"), 0.5)
    a.set_param("ip2/weight", w)
    np.testing.assert_array_equal(a.param("ip2/weight"), w)
    assert a.blob("ip2").shape == (2, 10)
