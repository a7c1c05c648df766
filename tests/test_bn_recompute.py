"""A recomputed BatchNorm normalises with the mean and invstd its forward saved (layers/norm.py):
the forward's bits in one pass over its bottom, no sums, no all-reduce of synchronised
statistics, its running statistics left alone; the cost model prices that recomputation
below the forward (Cost.rec_bytes); the saved mean is scratch that snapshots leave out."""

import numpy as np
import pytest
from layer_harness import build
from test_fuse import _values

from superneuron.layers import norm, parallel
from superneuron.layers.base import Context
from superneuron.layers.norm import ScaleAfter
from superneuron.scheduler.cost import CostModel

SHAPE = (6, 5, 4, 3)


class _Ranks:
    """One rank's stand-in for synchronised BatchNorm's group: its sums are its own."""

    size = 1

    def __init__(self):
        self.calls = 0

    def sum(self, array, why):
        self.calls += 1
        return array


def _no_sums(*args, **kwargs):
    raise AssertionError("a recomputation took a per-channel sum")


@pytest.mark.parametrize("scale, relu", [(None, False), ("bias", True), ("plain", False)])
@pytest.mark.parametrize("synced", [False, True])
@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_a_recomputed_batchnorm_gives_its_forwards_bits_from_the_saved_statistics(scale, relu, synced, threads,
                                                                                   monkeypatch):
    monkeypatch.setattr(parallel, "CACHE_BYTES", 256)
    bn, params = build("BatchNorm", [SHAPE], dtype=np.float32)
    rng = np.random.default_rng(3)
    x = _values(SHAPE, rng)
    x[np.isnan(x)] = 2.0
    if scale is not None:
        layer, scale_params = build("Scale", [SHAPE], dtype=np.float32, bias_term=scale == "bias")
        for k in scale_params:
            scale_params[k][...] = rng.standard_normal(scale_params[k].shape)
    room = np.zeros(bn.algorithms("forward")[0].workspace, np.uint8)
    ranks = _Ranks() if synced else None

    def run(recompute):
        y, z = np.zeros(SHAPE, np.float32), np.zeros(SHAPE, np.float32)
        after = None if scale is None else ScaleAfter(layer, scale_params, z)
        bn.forward(Context(workspace=room, recompute=recompute, ranks=ranks, scale=after, relu=relu), [x], [y], params)
        return y, z
    first = run(False)
    kept = {k: v.copy() for k, v in params.items()}
    assert not np.array_equal(kept["saved_mean"], 0) and not np.array_equal(kept["mean"], 0)
    summed = ranks.calls if synced else 0
    monkeypatch.setattr(norm, "_channel_sum", _no_sums)
    monkeypatch.setattr(norm, "_channel_dot", _no_sums)
    again = run(True)
    for a, b in zip(first, again, strict=True):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    for k in params:  # the running statistics, the scale factor, the saved ones: untouched
        assert np.array_equal(params[k].view(np.uint32), kept[k].view(np.uint32)), k
    assert not synced or ranks.calls == summed == 2  # the forward's two sums; none again


def test_the_cost_model_prices_a_batchnorms_recomputation_at_two_passes_of_its_three():
    """On the estimates, BatchNorm's training forward reads its map twice and writes it once
    (the GPU's sums, then x_hat); its recomputation reads it once; a layer without a cheaper
    recomputation costs its forward; a measured forward is scaled alike."""
    bn, _ = build("BatchNorm", [(32, 64, 28, 28)], dtype=np.float32)
    relu, _ = build("ReLU", [(32, 64, 28, 28)], dtype=np.float32)
    model = CostModel("gpu")
    algo = model.algorithms(bn, "forward")[0]
    forward = model.algo_seconds(bn, "forward", algo)
    nbytes = 32 * 64 * 28 * 28 * 4
    assert forward == pytest.approx(3 * nbytes / model.device.bandwidth, rel=1e-3)
    assert model.recompute_seconds(bn, algo) == pytest.approx(forward * 2 / 3)
    r = model.algorithms(relu, "forward")[0]
    assert model.recompute_seconds(relu, r) == model.algo_seconds(relu, "forward", r)
    global_stats, _ = build("BatchNorm", [(32, 64, 28, 28)], dtype=np.float32, use_global_stats=True)
    g = model.algorithms(global_stats, "forward")[0]
    assert model.algo_seconds(global_stats, "forward", g) == pytest.approx(2 * nbytes / model.device.bandwidth,
                                                                           rel=1e-3)
    from superneuron.scheduler.cost import entry_key
    measured = CostModel("gpu", {entry_key(bn, algo.name, "forward"): 3e-3})
    assert measured.recompute_seconds(bn, algo) == pytest.approx(2e-3)


def test_snapshots_leave_the_saved_mean_out_and_keep_their_fingerprint(monkeypatch):
    """``saved_mean`` is written by every training forward before anything reads it: not a
    snapshot's, and the fingerprint of a net with BatchNorm is what it was without it, so the
    snapshots written before it load."""
    from superneuron.net import Net
    from superneuron.netfile.spec import load_spec
    from superneuron.train import snapshot
    spec = load_spec("nets/resnet_cifar.yaml", batch=2)
    net = Net(spec)
    saved = [n for n in net.param_names if n.endswith("/saved_mean")]
    assert saved and not set(saved) & set(net.kept_names)
    assert not any(k.endswith("/saved_mean") for k in snapshot.expected_arrays(net))
    now = snapshot.fingerprint(net)
    specs = norm.BatchNorm.param_specs
    monkeypatch.setattr(norm.BatchNorm, "param_specs", lambda self: [p for p in specs(self) if p.kept])
    assert snapshot.fingerprint(Net(spec)) == now


@pytest.mark.gpu
@pytest.mark.parametrize("bias", [None, True])
def test_a_batchnorm_recomputed_on_the_gpu_gives_its_forwards_bits(bias):
    """The CUDA kernels (``bn_stats`` saving the mean, then ``bn_normalize[_scale_bias]``):
    the recomputation's x_hat (and Scale top) are the forward's, bit for bit, on CuPy."""
    import cupy
    shape = (16, 8, 5, 5)
    bn, params = build("BatchNorm", [shape], dtype=np.float32)
    params = {k: cupy.asarray(v) for k, v in params.items()}
    x = cupy.asarray(np.random.default_rng(4).standard_normal(shape).astype(np.float32))
    if bias is not None:
        layer, scale_params = build("Scale", [shape], dtype=np.float32, bias_term=bias)
        scale_params = {k: cupy.asarray(np.random.default_rng(5).standard_normal(v.shape).astype(np.float32))
                        for k, v in scale_params.items()}
    room = cupy.zeros(bn.algorithms("forward")[0].workspace, cupy.uint8)

    def run(recompute):
        y, z = cupy.zeros(shape, cupy.float32), cupy.zeros(shape, cupy.float32)
        after = None if bias is None else ScaleAfter(layer, scale_params, z)
        bn.forward(Context(cupy, workspace=room, recompute=recompute, scale=after, relu=True), [x], [y], params)
        return y, z
    first = run(False)
    kept = {k: v.copy() for k, v in params.items()}
    for a, b in zip(first, run(True), strict=True):
        assert cupy.array_equal(a.view(cupy.uint32), b.view(cupy.uint32))
    for k in params:
        assert cupy.array_equal(params[k], kept[k]), k
