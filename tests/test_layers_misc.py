"""ReLU, Dropout, BatchNorm, Scale, LRN, Eltwise, Concat, Split, Softmax, SoftmaxWithLoss and
Accuracy: finite-difference gradients, in-place runs, agreement with torch.nn.functional,
Dropout's reproducible mask, BatchNorm's running statistics, errors and memory."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from layer_harness import backward, build, forward, gradcheck, peak_allocation
from one_line import raises_one_line

from superneuron.errors import LayerError
from superneuron.layers.base import Context
from superneuron.scheduler.cost import CostModel

KIB = 1024
RNG_SEED = 11  # the seed of each test's own generator (the rng fixture, conftest.py)


def randn(rng, *shape):
    return rng.standard_normal(shape)


def random_shape(rng, ndim):
    return tuple(int(d) for d in rng.integers(2, 5, ndim))


def labels_for(rng, shape, classes, ignored=True):
    """Float class numbers of ``shape``, some of them -1 (ignored) when ``ignored``."""
    lab = rng.integers(-1 if ignored else 0, classes, shape).astype(np.float64)
    lab.flat[0] = 0  # at least one label counts
    return lab


def torch_run(fn, inputs, dy, grad=(0,)):
    """Value of ``fn(*inputs)`` and the gradients of <dy, fn> for the inputs indexed in ``grad``."""
    ts = [torch.tensor(x, requires_grad=i in grad) for i, x in enumerate(inputs)]
    y = fn(*ts)
    y.backward(torch.as_tensor(dy, dtype=y.dtype))
    return y.detach().numpy(), [ts[i].grad.numpy() for i in grad]


def run_both(layer, bottoms, params, dy, train=True):
    """Our top and bottom gradients for top gradient ``dy``."""
    tops = forward(layer, bottoms, params, train=train)
    bgrads, pgrads = backward(layer, bottoms, tops, [dy], params, train=train)
    return tops[0], bgrads, pgrads


# -- gradient checks (float64), with in-place runs for in-place layers -------------------------

def grad_cases(seed=5):
    rng = np.random.default_rng(seed)
    s4, s2 = random_shape(rng, 4), random_shape(rng, 2)
    cases = [
        ("ReLU", [s4], {}),
        ("ReLU", [s2], dict(negative_slope=float(rng.uniform(0.05, 0.5)))),
        ("ReLU", [s4], dict(negative_slope=2.5)),
        ("Dropout", [s4], dict(dropout_ratio=float(rng.uniform(0.2, 0.7)))),
        ("BatchNorm", [s4], {}),
        ("BatchNorm", [s2], dict(eps=1e-3)),
        ("BatchNorm", [s4], dict(use_global_stats=True)),
        ("Scale", [s4], {}),
        ("Scale", [s4], dict(bias_term=True)),
        ("Scale", [s2], dict(bias_term=True, axis=-1)),
        ("LRN", [(2, 7, 3, 2)], dict(local_size=3, alpha=float(rng.uniform(0.5, 2)), beta=0.75, k=2.0)),
        ("LRN", [(2, 6, 2, 3)], dict(local_size=5, alpha=1.5, beta=float(rng.uniform(0.3, 1)), k=1.0)),
        ("LRN", [(3, 2, 4)], dict(local_size=5, alpha=1.0)),  # window wider than the channels
        ("Eltwise", [s4] * 2, {}),
        ("Eltwise", [s4] * 3, dict(coeff=[float(c) for c in rng.uniform(-2, 2, 3)])),
        ("Eltwise", [s2] * 3, dict(coeff=[1, -1, 0.5])),
        ("Eltwise", [s4] * 2, dict(operation="PROD")),
        ("Eltwise", [s2] * 3, dict(operation="PROD")),
        ("Eltwise", [s4] * 2, dict(operation="MAX")),
        ("Eltwise", [s2] * 3, dict(operation="MAX")),
        ("Concat", [(2, 3, 4), (3, 3, 4), (1, 3, 4)], dict(axis=0)),
        ("Concat", [(2, 3, 4, 2), (2, 1, 4, 2)], {}),
        ("Concat", [(2, 3, 4), (2, 3, 1), (2, 3, 2)], dict(axis=2)),
        ("Concat", [s4], {}),
        ("Softmax", [s2], {}),
        ("Softmax", [s4], {}),
        ("Softmax", [s4], dict(axis=-1)),
    ]
    return cases


@pytest.mark.parametrize("type_name, shapes, cfg", grad_cases())
def test_gradcheck(rng, type_name, shapes, cfg):
    layer, params = build(type_name, shapes, **cfg)
    if type_name == "BatchNorm":  # running statistics away from 0 and 1
        set_running_stats(params, randn(rng, *params["mean"].shape),
                          rng.uniform(0.5, 2.0, params["variance"].shape))
    gradcheck(layer, [randn(rng, *s) for s in shapes], params)


def test_gradcheck_test_mode(rng):
    """Outside training BatchNorm uses its running statistics and Dropout passes x through."""
    layer, params = build("BatchNorm", [(3, 4, 2, 2)])
    set_running_stats(params, randn(rng, 4), rng.uniform(0.5, 2.0, 4))
    gradcheck(layer, [randn(rng, 3, 4, 2, 2)], params, train=False)
    layer, params = build("Dropout", [(3, 4)])
    gradcheck(layer, [randn(rng, 3, 4)], params, train=False)


def test_split_gradcheck_and_sum(rng):
    layer, params = build("Split", [(2, 3, 4)], n_tops=3)
    assert layer.top_shapes == [(2, 3, 4)] * 3 and layer.ALIAS_TOPS and not layer.INTERNAL
    x = randn(rng, 2, 3, 4)
    gradcheck(layer, [x], params)
    tops = forward(layer, [x], params)
    assert all(np.array_equal(t, x) for t in tops)
    g = [randn(rng, 2, 3, 4) for _ in range(3)]
    (dx,), _ = backward(layer, [x], tops, [g[0], None, g[2]], params)
    np.testing.assert_array_equal(dx, g[0] + g[2])
    (dx,), _ = backward(layer, [x], tops, [None, g[1], None], params)
    np.testing.assert_array_equal(dx, g[1])
    (dx,), _ = backward(layer, [x], tops, [None, None, None], params)
    np.testing.assert_array_equal(dx, 0)


@pytest.mark.parametrize("shape, cfg", [
    ((5, 4), {}),
    ((3, 4, 2, 3), {}),
    ((6, 3), dict(normalize=False)),
    ((3, 5, 2, 2), dict(ignore_label=2)),
])
def test_softmax_loss_gradcheck(shape, cfg):
    rng = np.random.default_rng(sum(shape))
    lab_shape = shape[:1] + shape[2:]
    layer, params = build("SoftmaxWithLoss", [shape, lab_shape], **cfg)
    assert layer.top_shapes == [()] and layer.LOSS and layer.LABEL_BOTTOMS == (1,)
    _, bgrads, _ = gradcheck(layer, [randn(rng, *shape), labels_for(rng, lab_shape, shape[1])], params)
    assert bgrads[1] is None


# -- against PyTorch ---------------------------------------------------------------------------

@pytest.mark.parametrize("slope", [0.0, 0.2])
def test_relu_vs_torch(rng, slope):
    layer, params = build("ReLU", [(4, 3, 5, 5)], negative_slope=slope)
    x, dy = randn(rng, 4, 3, 5, 5), randn(rng, 4, 3, 5, 5)
    y, (dx,), _ = run_both(layer, [x], params, dy)
    ty, (tdx,) = torch_run(lambda t: F.leaky_relu(t, slope) if slope else F.relu(t), [x], dy)
    np.testing.assert_allclose(y, ty, rtol=1e-12)
    np.testing.assert_allclose(dx, tdx, rtol=1e-12)


def set_running_stats(params, mean, variance):
    """Give a BatchNorm these running statistics (a scale factor of 1: the sums are them)."""
    params["mean"][...], params["variance"][...], params["scale_factor"][...] = mean, variance, 1.0


@pytest.mark.parametrize("shape", [(6, 5), (4, 3, 5, 6)])
def test_batchnorm_training_vs_torch(rng, shape):
    f, eps = 0.9, 1e-4
    layer, params = build("BatchNorm", [shape], moving_average_fraction=f, eps=eps)
    c = shape[1]
    set_running_stats(params, randn(rng, c), rng.uniform(0.5, 2.0, c))
    mean, var = torch.tensor(params["mean"]), torch.tensor(params["variance"])
    x, dy = randn(rng, *shape) * 3 + 1, randn(rng, *shape)
    ty, (tdx,) = torch_run(lambda t: F.batch_norm(t, mean, var, training=True, momentum=1 - f, eps=eps),
                           [x], dy)
    y, (dx,), _ = run_both(layer, [x], params, dy)
    np.testing.assert_allclose(y, ty, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dx, tdx, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("f", [0.999, 0.9, 0.0])
def test_batchnorm_running_statistics_are_caffes_unbiased_average(rng, f):
    """Caffe's three blobs: after batches 1..T the statistics used at test time are
    sum_t f^(T-t) stat_t / sum_t f^(T-t), stat_t being the batch mean and the unbiased batch
    variance (torch's), so one iteration already gives that batch's statistics (and not
    0.001 of them, as a plain moving average from 0 would)."""
    shape = (5, 3, 2, 2)
    layer, params = build("BatchNorm", [shape], moving_average_fraction=f)
    np.testing.assert_array_equal(params["scale_factor"], 0)  # Caffe's blobs start at zero
    batches = [randn(rng, *shape) * (t + 1) + t for t in range(4)]
    weights, means, variances = [], [], []
    for t, x in enumerate(batches):
        forward(layer, [x], params)
        tx = torch.tensor(x).transpose(0, 1).reshape(3, -1)
        means.append(tx.mean(1).numpy())
        variances.append(tx.var(1, unbiased=True).numpy())
        weights = [f ** (t - k) for k in range(t + 1)]
        want_mean = sum(w * m for w, m in zip(weights, means)) / sum(weights)
        want_var = sum(w * v for w, v in zip(weights, variances)) / sum(weights)
        got_mean, got_var = layer.running_stats(np, params)
        np.testing.assert_allclose(got_mean, want_mean, rtol=1e-12)
        np.testing.assert_allclose(got_var, want_var, rtol=1e-12)
    # and test mode normalises with exactly those
    x = randn(rng, *shape)
    y = forward(layer, [x], params, train=False)[0]
    ty = F.batch_norm(torch.tensor(x), torch.tensor(got_mean), torch.tensor(got_var), training=False, eps=1e-5)
    np.testing.assert_allclose(y, ty.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cfg, train", [({}, False), (dict(use_global_stats=True), True)])
def test_batchnorm_global_stats_vs_torch(rng, cfg, train):
    layer, params = build("BatchNorm", [(4, 3, 5, 5)], **cfg)
    set_running_stats(params, randn(rng, 3), rng.uniform(0.5, 2.0, 3))
    before = {k: v.copy() for k, v in params.items()}
    mean, var = torch.tensor(params["mean"]), torch.tensor(params["variance"])
    x, dy = randn(rng, 4, 3, 5, 5), randn(rng, 4, 3, 5, 5)
    ty, (tdx,) = torch_run(lambda t: F.batch_norm(t, mean, var, training=False, eps=1e-5), [x], dy)
    y, (dx,), _ = run_both(layer, [x], params, dy, train=train)
    np.testing.assert_allclose(y, ty, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, tdx, rtol=1e-12)
    for k in ("mean", "variance", "scale_factor"):
        np.testing.assert_array_equal(params[k], before[k])


def test_batchnorm_recompute_leaves_running_stats(rng):
    layer, params = build("BatchNorm", [(4, 3, 2, 2)])
    x = randn(rng, 4, 3, 2, 2)
    ws = np.zeros(layer.algorithms("forward")[0].workspace, np.uint8)
    y1, y2 = np.zeros_like(x), np.zeros_like(x)
    layer.forward(Context(np, workspace=ws), [x], [y1], params)
    after_first = {k: v.copy() for k, v in params.items()}
    assert not np.array_equal(after_first["mean"], 0)  # the first forward did update them
    layer.forward(Context(np, workspace=ws, recompute=True), [x], [y2], params)
    np.testing.assert_array_equal(y2, y1)
    for k in params:
        np.testing.assert_array_equal(params[k], after_first[k])


def test_batchnorm_state_buffers():
    layer, params = build("BatchNorm", [(2, 5, 3, 3)])
    specs = {p.name: p for p in layer.param_specs()}
    assert list(specs)[:3] == ["mean", "variance", "scale_factor"]  # Caffe's blobs, in order
    assert not any(p.learnable for p in specs.values())
    for k in ("mean", "variance", "scale_factor"):
        np.testing.assert_array_equal(params[k], 0)
    assert layer.INPLACE and layer.backward_reads() == ((), (0,))


@pytest.mark.parametrize("bias", [False, True])
def test_scale_vs_torch(rng, bias):
    layer, params = build("Scale", [(3, 4, 2, 5)], bias_term=bias)
    x, dy = randn(rng, 3, 4, 2, 5), randn(rng, 3, 4, 2, 5)
    names = ["weight"] + (["bias"] if bias else [])
    y, (dx,), pg = run_both(layer, [x], params, dy)

    def fn(t, w, b=None):
        out = t * w.reshape(1, -1, 1, 1)
        return out if b is None else out + b.reshape(1, -1, 1, 1)

    ty, tgrads = torch_run(fn, [x] + [params[k] for k in names], dy, grad=tuple(range(1 + len(names))))
    np.testing.assert_allclose(y, ty, rtol=1e-12)
    np.testing.assert_allclose(dx, tgrads[0], rtol=1e-12)
    for k, g in zip(names, tgrads[1:], strict=True):
        np.testing.assert_allclose(pg[k], g, rtol=1e-10)
    assert not layer.INPLACE and layer.backward_reads() == ((0,), ())


def test_scale_default_parameters_follow_caffe():
    layer, params = build("Scale", [(2, 3, 4, 4)])
    assert [p.name for p in layer.param_specs()] == ["weight"]  # bias_term defaults to false
    layer, _ = build("Scale", [(2, 3, 4, 4)], bias_term=True)
    fillers = {p.name: p.filler for p in layer.param_specs()}
    assert fillers["weight"]["value"] == 1.0 and fillers["bias"]["value"] == 0.0


def test_scale_costs_the_passes_its_gpu_kernels_make():
    """The estimates count Scale's backward at four passes over the map (dy and x read for the
    parameters' sums, then dy read and dx written), twice its forward's two: an elementwise
    layer's default counts three."""
    layer, _ = build("Scale", [(32, 64, 28, 28)], dtype=np.float32, bias_term=True)
    model = CostModel("gpu")
    seconds = {phase: model.algo_seconds(layer, phase, model.algorithms(layer, phase)[0])
               for phase in ("forward", "backward")}
    nbytes = 32 * 64 * 28 * 28 * 4
    assert seconds["forward"] == pytest.approx(2 * nbytes / model.device.bandwidth, rel=1e-3)
    assert seconds["backward"] == pytest.approx(4 * nbytes / model.device.bandwidth, rel=1e-3)


@pytest.mark.parametrize("size, alpha, beta, k",
                         [(3, 0.7, 0.75, 1.0), (5, 2.0, 0.6, 2.0), (5, 1e-4, 0.75, 1.0)])
def test_lrn_vs_torch(rng, size, alpha, beta, k):
    # torch divides the window's sum of squares by size, as Caffe's alpha/n does
    layer, params = build("LRN", [(2, 7, 4, 3)], local_size=size, alpha=alpha, beta=beta, k=k)
    x, dy = randn(rng, 2, 7, 4, 3), randn(rng, 2, 7, 4, 3)
    y, (dx,), _ = run_both(layer, [x], params, dy)
    ty, (tdx,) = torch_run(lambda t: F.local_response_norm(t, size, alpha, beta, k), [x], dy)
    np.testing.assert_allclose(y, ty, rtol=1e-10)
    np.testing.assert_allclose(dx, tdx, rtol=1e-9, atol=1e-12)


def test_lrn_by_hand():
    # one pixel, channels [1, 2, 3], n=3, alpha=3, beta=1, k=1: the middle channel's window
    # holds 1 + 4 + 9 = 14, so y = 2 / (1 + 3/3 * 14) = 2/15; the first: 1 / (1 + 5)
    layer, params = build("LRN", [(1, 3, 1, 1)], local_size=3, alpha=3.0, beta=1.0, k=1.0)
    y = forward(layer, [np.array([1.0, 2.0, 3.0]).reshape(1, 3, 1, 1)], params)[0]
    np.testing.assert_allclose(y.ravel(), [1 / 6, 2 / 15, 3 / 14])


@pytest.mark.parametrize("op, n", [("SUM", 2), ("SUM", 3), ("PROD", 3), ("MAX", 2), ("MAX", 3)])
def test_eltwise_vs_torch(rng, op, n):
    shape = (2, 3, 4, 3)
    coeff = [0.5, -1.5, 2.0][:n] if op == "SUM" and n == 3 else []
    layer, params = build("Eltwise", [shape] * n, operation=op, coeff=coeff)
    xs, dy = [randn(rng, *shape) for _ in range(n)], randn(rng, *shape)
    y, dxs, _ = run_both(layer, xs, params, dy)

    def fn(*ts):
        if op == "SUM":
            return sum(c * t for c, t in zip(coeff or [1.0] * n, ts, strict=True))
        if op == "PROD":
            return ts[0] * ts[1] * ts[2]
        return torch.stack(ts).amax(0)  # no ties among random values

    ty, tgrads = torch_run(fn, xs, dy, grad=tuple(range(n)))
    np.testing.assert_allclose(y, ty, rtol=1e-12)
    for dx, tdx in zip(dxs, tgrads, strict=True):
        np.testing.assert_allclose(dx, tdx, rtol=1e-12)


def test_eltwise_max_tie_goes_to_first_bottom():
    layer, params = build("Eltwise", [(4,)] * 3, operation="MAX")
    a = np.array([1.0, 2.0, 3.0, 0.0])
    b = np.array([1.0, 5.0, 3.0, 0.0])
    c = np.array([0.0, 5.0, 3.0, 0.5])
    y, dxs, _ = run_both(layer, [a, b, c], params, np.ones(4))
    np.testing.assert_array_equal(y, [1, 5, 3, 0.5])
    np.testing.assert_array_equal(dxs[0], [1, 0, 1, 0])
    np.testing.assert_array_equal(dxs[1], [0, 1, 0, 0])
    np.testing.assert_array_equal(dxs[2], [0, 0, 0, 1])


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_concat_vs_torch(rng, axis):
    base = [3, 2, 4, 2]
    shapes = []
    for extra in (1, 3, 2):
        s = list(base)
        s[axis] = extra
        shapes.append(tuple(s))
    layer, params = build("Concat", shapes, axis=axis)
    xs = [randn(rng, *s) for s in shapes]
    dy = randn(rng, *layer.top_shapes[0])
    y, dxs, _ = run_both(layer, xs, params, dy)
    ty, tgrads = torch_run(lambda *ts: torch.cat(ts, axis), xs, dy, grad=(0, 1, 2))
    np.testing.assert_array_equal(y, ty)
    for dx, tdx in zip(dxs, tgrads, strict=True):
        np.testing.assert_array_equal(dx, tdx)


@pytest.mark.parametrize("shape, axis", [((5, 7), 1), ((2, 4, 3, 3), 1), ((2, 4, 3, 5), -1), ((3, 4, 2), 0)])
def test_softmax_vs_torch(rng, shape, axis):
    layer, params = build("Softmax", [shape], axis=axis)
    x, dy = randn(rng, *shape) * 5, randn(rng, *shape)
    y, (dx,), _ = run_both(layer, [x], params, dy)
    ty, (tdx,) = torch_run(lambda t: F.softmax(t, axis), [x], dy)
    np.testing.assert_allclose(y, ty, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(dx, tdx, rtol=1e-10, atol=1e-14)


def test_softmax_large_scores_stay_finite():
    layer, params = build("Softmax", [(2, 3)], dtype=np.float32)
    y = forward(layer, [np.array([[1000.0, 0.0, -1000.0], [50.0, 50.0, 50.0]], np.float32)], params)[0]
    np.testing.assert_allclose(y, [[1, 0, 0], [1 / 3, 1 / 3, 1 / 3]], rtol=1e-6)


@pytest.mark.parametrize("shape, cfg", [
    ((6, 5), {}),
    ((3, 4, 3, 2), {}),
    ((6, 5), dict(normalize=False)),
    ((4, 5, 2, 2), dict(ignore_label=3)),
])
def test_softmax_loss_vs_torch(shape, cfg):
    rng = np.random.default_rng(3)
    lab_shape = shape[:1] + shape[2:]
    ignore = cfg.get("ignore_label", -1)
    lab = labels_for(rng, lab_shape, shape[1], ignored=ignore == -1)
    layer, params = build("SoftmaxWithLoss", [shape, lab_shape], **cfg)
    x, weight = randn(rng, *shape) * 4, 1.7
    reduction = "mean" if cfg.get("normalize", True) else "sum"
    scale = 1.0 if reduction == "mean" else 1.0 / shape[0]  # normalize: false divides by N
    ty, (tdx,) = torch_run(lambda t, lb: scale * F.cross_entropy(t, lb.long(), ignore_index=ignore,
                                                                reduction=reduction),
                           [x, lab], weight)
    y, (dx, dlab), _ = run_both(layer, [x, lab], params, np.asarray(weight))
    assert y.shape == () and dlab is None
    np.testing.assert_allclose(y, ty, rtol=1e-12)
    np.testing.assert_allclose(dx, tdx, rtol=1e-10, atol=1e-15)


def test_softmax_loss_all_ignored_and_huge_scores():
    layer, params = build("SoftmaxWithLoss", [(2, 3), (2,)], dtype=np.float32)
    x = np.array([[1e4, 0, -1e4], [0, 0, 0]], np.float32)
    y, (dx, _), _ = run_both(layer, [x, np.array([-1.0, -1.0], np.float32)], params, np.float32(1))
    assert y == 0 and not np.any(dx)
    y = forward(layer, [x, np.array([2.0, 0.0], np.float32)], params)[0]
    np.testing.assert_allclose(y, (2e4 + np.log(3)) / 2, rtol=1e-6)  # -log p = 2e4 and log 3


def test_accuracy_vs_torch_topk():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((20, 6, 3))
    lab = labels_for(rng, (20, 3), 6)
    valid = lab >= 0
    for k in (1, 2, 4):
        layer, params = build("Accuracy", [x.shape, lab.shape], top_k=k)
        assert not layer.BACKWARD and layer.top_shapes == [()]
        got = forward(layer, [x, lab], params)[0]
        top = torch.tensor(x).topk(k, dim=1).indices.numpy()  # (20, k, 3)
        hit = (top == np.maximum(lab, 0)[:, None, :].astype(int)).any(axis=1)
        np.testing.assert_allclose(got, hit[valid].mean(), rtol=1e-12)


def test_accuracy_ties_and_ignored_by_hand():
    # sample 0 (label 1): ties with class 0, none strictly higher: right even for top_k 1 (Caffe)
    # sample 1 (label 1): class 0 scores higher: wrong for top_k 1, right for top_k 2
    # sample 2 (label 2): ignored with ignore_label 2; else wrong for top_k 1 (class 1 is higher)
    # sample 3 (label -1): always ignored
    x = np.array([[1.0, 1.0, 0.0], [2.0, 1.0, 0.0], [0.0, 9.0, 0.0], [9.0, 0.0, 0.0]])
    lab = np.array([1.0, 1.0, 2.0, -1.0])
    for cfg, expected in ((dict(top_k=1, ignore_label=2), 1 / 2), (dict(top_k=2, ignore_label=2), 2 / 2),
                          (dict(top_k=1), 1 / 3)):
        layer, params = build("Accuracy", [x.shape, lab.shape], **cfg)
        np.testing.assert_allclose(forward(layer, [x, lab], params)[0], expected)


# -- Dropout -----------------------------------------------------------------------------------

def dropout_run(p, seed, x, train=True, inplace=False):
    layer, params = build("Dropout", [x.shape], dtype=x.dtype, dropout_ratio=p)
    return forward(layer, [x], params, seed=seed, train=train, inplace=inplace)[0], layer, params


def test_dropout_mask_statistics_and_reproducibility(rng):
    p, x = 0.3, rng.uniform(1.0, 2.0, (64, 32, 16)).astype(np.float32)
    y1, layer, params = dropout_run(p, 7, x)
    y2, _, _ = dropout_run(p, 7, x)
    y3, _, _ = dropout_run(p, 8, x)
    np.testing.assert_array_equal(y1, y2)  # the same seed: the same mask
    assert not np.array_equal(y1 != 0, y3 != 0)
    dropped = np.mean(y1 == 0)
    assert abs(dropped - p) < 4 * np.sqrt(p * (1 - p) / x.size)  # binomial: 4 sigma
    kept = y1 != 0
    np.testing.assert_allclose(y1[kept], x[kept] / (1 - p), rtol=1e-6)
    # the backward draws the same mask again, reading neither bottom nor top
    assert layer.backward_reads() == ((), ())
    dy = np.ones_like(x)
    (dx,), _ = backward(layer, [x], [y1], [dy], params, seed=7)
    np.testing.assert_array_equal(dx != 0, kept)
    np.testing.assert_allclose(dx[kept], 1 / (1 - p), rtol=1e-6)
    # in place gives the same top
    yi, _, _ = dropout_run(p, 7, x, inplace=True)
    np.testing.assert_array_equal(yi, y1)


def test_dropout_test_mode_is_identity(rng):
    x = randn(rng, 4, 5)
    y, layer, params = dropout_run(0.5, 3, x, train=False)
    np.testing.assert_array_equal(y, x)
    y, _, _ = dropout_run(0.5, 3, x, train=False, inplace=True)
    np.testing.assert_array_equal(y, x)
    y, _, _ = dropout_run(0.0, 3, x)
    np.testing.assert_array_equal(y, x)


# -- declarations, errors, workspace and memory ------------------------------------------------

def test_flags():
    flags = {"ReLU": (True, True), "Dropout": (True, True), "BatchNorm": (True, True),
             "Scale": (False, True), "LRN": (False, True), "Eltwise": (False, True),
             "Concat": (False, True), "Split": (False, True), "Softmax": (True, True)}
    from superneuron.layers import layer_class
    for name, (inplace, cheap) in flags.items():
        cls = layer_class(name)
        assert (cls.INPLACE, cls.CHEAP) == (inplace, cheap), name
    assert layer_class("SoftmaxWithLoss").LOSS and not layer_class("Accuracy").BACKWARD


@pytest.mark.parametrize("type_name, shapes, cfg, message", [
    ("Eltwise", [(8, 256, 56, 56), (8, 64, 56, 56)], {},
     r"bottoms \(8,256,56,56\) and \(8,64,56,56\) differ"),
    ("Eltwise", [(2, 3)] * 2, dict(operation="PROD", coeff=[1, 2]),
     "coeff is only allowed with operation SUM"),
    ("Eltwise", [(2, 3)] * 3, dict(coeff=[1, 2]), "2 coeff value"),
    ("Concat", [(2, 3, 4), (2, 3, 5)], {}, r"bottoms \(2,3,4\) and \(2,3,5\) differ outside axis 1"),
    ("Concat", [(2, 3), (2, 3)], dict(axis=2), "axis 2 is out of range"),
    ("SoftmaxWithLoss", [(4, 10), (4, 2)], {},
     r"labels \(4,2\) hold 8 values, but scores \(4,10\) need 4 \(one per sample\)"),
    ("SoftmaxWithLoss", [(4, 10, 2, 2), (4,)], {}, r"need 16 \(one per sample and position\)"),
    ("Accuracy", [(4, 10), (5,)], {}, "need 4"),
    ("Accuracy", [(4, 3), (4,)], dict(top_k=4), "top_k must be between 1 and the 3 classes"),
    ("ReLU", [(2, 3)], dict(negative_slope=-0.1), "negative_slope must be >= 0"),
    ("Dropout", [(2, 3)], dict(dropout_ratio=1.0), r"dropout_ratio must be in \[0, 1\)"),
    ("LRN", [(2, 3, 4, 4)], dict(local_size=4), "local_size must be a positive odd number"),
    ("BatchNorm", [(5,)], {}, "at least 2 dims"),
    ("Scale", [(2, 3)], dict(axis=3), "axis 3 is out of range"),
    ("Softmax", [(2, 3)], dict(axis=-3), "axis -3 is out of range"),
])
def test_errors(type_name, shapes, cfg, message):
    with raises_one_line(LayerError, match=message):
        build(type_name, shapes, **cfg)


@pytest.mark.parametrize("scores, labels", [
    ((4, 5), (4, 1, 1)), ((4, 5), (4, 1)), ((4, 5, 1, 1), (4,)), ((2, 5, 3, 3), (2, 1, 3, 3)),
])
def test_labels_are_matched_by_count_as_caffe(scores, labels):
    """Caffe checks only that there is one label per sample (and position): the loss and
    accuracy of any label layout of the right count equal those of the (N, ...) layout."""
    rng = np.random.default_rng(4)
    x = randn(rng, *scores)
    lab = rng.integers(0, scores[1], labels).astype(np.float64)
    flat_shape = scores[:1] + scores[2:]
    for name in ("SoftmaxWithLoss", "Accuracy"):
        layer, params = build(name, [scores, labels])
        ref, ref_params = build(name, [scores, flat_shape])
        got = forward(layer, [x, lab], params)[0]
        want = forward(ref, [x, lab.reshape(flat_shape)], ref_params)[0]
        assert got == want and np.isfinite(got)


def test_label_out_of_range_fails(rng):
    layer, params = build("SoftmaxWithLoss", [(2, 3), (2,)])
    with raises_one_line(LayerError, match="label 3 is out of range for 3 classes"):
        forward(layer, [randn(rng, 2, 3), np.array([0.0, 3.0])], params)


MEMORY_CASES = [
    ("ReLU", [(8, 16, 64, 64)], {}),
    ("ReLU", [(8, 16, 64, 64)], dict(negative_slope=0.1)),
    ("Dropout", [(8, 16, 64, 64)], {}),
    ("BatchNorm", [(8, 16, 64, 64)], {}),
    ("BatchNorm", [(8192, 64)], {}),
    ("BatchNorm", [(8, 16, 64, 64)], dict(use_global_stats=True)),
    ("Scale", [(8, 16, 64, 64)], dict(bias_term=True)),
    ("LRN", [(8, 16, 64, 64)], {}),
    ("Eltwise", [(8, 16, 64, 64)] * 3, dict(coeff=[1, -2, 0.5])),
    ("Eltwise", [(8, 16, 64, 64)] * 3, dict(operation="PROD")),
    ("Eltwise", [(8, 16, 64, 64)] * 3, dict(operation="MAX")),
    ("Concat", [(8, 16, 64, 64), (8, 8, 64, 64)], {}),
    ("Split", [(8, 16, 64, 64)], {}),
    ("Softmax", [(8, 16, 64, 64)], {}),
    ("Softmax", [(8192, 64)], {}),
    ("SoftmaxWithLoss", [(8, 16, 64, 64), (8, 64, 64)], {}),
    ("SoftmaxWithLoss", [(4096, 128), (4096,)], {}),
    ("Accuracy", [(8, 16, 64, 64), (8, 64, 64)], dict(top_k=3)),
]


def memory_inputs(type_name, shapes, rng):
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    if type_name in ("SoftmaxWithLoss", "Accuracy"):
        xs[1] = rng.integers(-1, shapes[0][1], shapes[1]).astype(np.float32)
    return xs


@pytest.mark.parametrize("type_name, shapes, cfg", MEMORY_CASES)
def test_peak_allocation(type_name, shapes, cfg):
    n_tops = 3 if type_name == "Split" else None
    layer, params = build(type_name, shapes, np.float32, n_tops=n_tops, **cfg)
    xs = memory_inputs(type_name, shapes, np.random.default_rng(0))
    assert peak_allocation(layer, xs, params) < 256 * KIB


def run_phase(layer, phase, nbytes, xs, tops, params):
    """Run one phase of ``layer`` with a workspace of exactly ``nbytes``."""
    ctx = Context(np, workspace=np.zeros(nbytes, np.uint8) if nbytes else None)
    if phase == "forward":
        return layer.forward(ctx, xs, tops, params)
    bg = [None if i in layer.LABEL_BOTTOMS else np.zeros_like(x) for i, x in enumerate(xs)]
    layer.backward(ctx, xs, tops, [np.ones_like(t) for t in tops], bg, params,
                   {k: np.zeros_like(v) for k, v in params.items()})


@pytest.mark.parametrize("type_name, shapes, cfg", MEMORY_CASES)
def test_workspace_is_exact(type_name, shapes, cfg):
    """Each phase runs in the workspace it declares and fails with one byte less."""
    shapes = [(min(s[0], 8),) + tuple(min(d, 6) for d in s[1:]) if len(s) > 2 else (min(s[0], 8),) + s[1:]
              for s in shapes]
    n_tops = 3 if type_name == "Split" else None
    layer, params = build(type_name, shapes, np.float32, n_tops=n_tops, **cfg)
    xs = memory_inputs(type_name, shapes, np.random.default_rng(1))
    tops = [np.zeros(s, np.float32) for s in layer.top_shapes]
    for phase in ("forward", "backward") if layer.BACKWARD else ("forward",):
        need = layer.algorithms(phase)[0].workspace
        run_phase(layer, phase, need, xs, tops, params)
        if need:
            with pytest.raises(AssertionError, match="exceeds workspace"):
                run_phase(layer, phase, need - 1, xs, tops, params)
