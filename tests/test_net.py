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


TINY = "tests/nets/tiny.yaml"


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


# How far a float32 run may be from PyTorch's float64 one, relative to each parameter's largest
# gradient: what float32 rounding gives on that net, measured (ours; PyTorch's own float32 run
# is as far), with room of about four times. A single loose figure for all would let LeNet,
# which rounding leaves good to 1e-6, be wrong in its fifth digit unseen.
F32_TOLERANCE = {
    "nets/lenet.yaml": 3e-6,         # 5e-7 (PyTorch f32: 8e-7): dot products of at most 800 terms
    "nets/resnet.yaml": 1e-4,        # 2.3e-5 (2.0e-5): 18 BatchNorms at batch 2, down to 2x2 maps
    # 2.1e-3 (2.1e-3): the first blocks' weight gradients are small differences of large terms
    # (BatchNorm takes out the mean at batch 2), so float32 leaves three digits of them; the
    # float64 run below holds this net, with LeNet, to 1e-10
    "nets/resnet_cifar.yaml": 1e-2,
}


def compare_with_pytorch(path, dtype, tolerance):
    """The loss and every parameter gradient of a ``dtype`` run against PyTorch in float64."""
    import torch
    net = small_net(path, dtype=dtype)
    feed = feed_for(net)
    loss = net.forward_backward(feed)
    ref_loss, ref_grads, _ = run_torch(net, feed, dtype=torch.float64)
    assert loss == pytest.approx(ref_loss, rel=tolerance, abs=0)
    learnable = net.learnable_names
    assert set(ref_grads) == set(learnable)
    for name in learnable:
        g, r = net.grad(name), ref_grads[name]
        scale = max(np.abs(r).max(), 1e-3)
        np.testing.assert_allclose(g, r, rtol=0, atol=tolerance * scale, err_msg=name)


@pytest.mark.parametrize("path", sorted(F32_TOLERANCE))
def test_loss_and_every_gradient_match_pytorch(path):
    """The loss and every parameter gradient equal PyTorch's for the same weights and inputs,
    to the float32 rounding of each net (ResNet-18 among them; GoogLeNet with its Dropout,
    whose mask the reference builds itself: torch_ref.dropout_scale)."""
    compare_with_pytorch(path, "float32", F32_TOLERANCE[path])


@pytest.mark.parametrize("path", ["nets/lenet.yaml", "nets/resnet_cifar.yaml", "nets/googlenet.yaml"])
def test_in_float64_the_nets_compute_what_pytorch_computes(path):
    """In float64 no rounding hides anything: the same loss and gradients to 1e-10 (measured:
    2e-15, 1.4e-14 and 6e-15). GoogLeNet is compared in float64 only: at batch 2 some of its
    ReLUs see pre-activations within float32 rounding of zero (8e-5 of inception_3a's
    3x3_reduce outputs within 1e-6), and which way such a mask falls depends on the order a
    GEMM sums in (the BLAS build, the CPU, the layout of the columns): one order cost the
    gradients upstream 4e-3 of their scale, another 1e-6."""
    compare_with_pytorch(path, "float64", 1e-10)


def test_the_reference_dropout_mask_drops_its_ratio():
    """The mask torch_ref builds on its own drops about the ratio and scales the rest, and
    differs between iterations (else the comparison above would prove little)."""
    from torch_ref import dropout_scale
    net = load_net(TINY)
    node = net.graph.node("drop")
    p = node.layer.cfg["dropout_ratio"]
    a, b = dropout_scale(net, node, 0), dropout_scale(net, node, 1)
    assert set(np.unique(a)) == {0, np.float32(1 / (1 - p))} and not np.array_equal(a, b)
    big = load_net(TINY, overrides={"batch": 64, "width": 16})
    dropped = (dropout_scale(big, big.graph.node("drop")) == 0).mean()
    assert abs(dropped - p) < 0.03, dropped


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
    for name in a.learnable_names:
        assert a.grad(name).tobytes() == b.grad(name).tobytes(), name
    w = np.full_like(a.param("ip2/weight"), 0.5)
    a.set_param("ip2/weight", w)
    np.testing.assert_array_equal(a.param("ip2/weight"), w)
    assert a.blob("ip2").shape == (2, 10)


def test_another_seed_gives_other_weights_and_other_dropout_masks():
    """The control of the test above: the seed reaches the fillers and the Dropout masks, so
    equal results under one seed are not equal by accident."""
    a, c = small_net("nets/lenet.yaml", seed=3), small_net("nets/lenet.yaml", seed=4)
    assert not np.array_equal(a.param("conv1/weight"), c.param("conv1/weight"))
    feed = feed_for(a)
    assert a.forward_backward(feed) != c.forward_backward(feed)
    # same weights, other seed: only the Dropout masks differ
    a, c = load_net(TINY, seed=3), load_net(TINY, seed=4)
    for name in a.param_names:
        c.set_param(name, a.param(name))
    feed = feed_for(a)
    loss_a, loss_c = a.forward_backward(feed), c.forward_backward(feed)
    assert loss_a != loss_c
    again = load_net(TINY, seed=3)
    assert again.forward_backward(feed) == loss_a
