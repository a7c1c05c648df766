"""Pooling's ``chunked`` backward (layers/pool.py): a few samples at a time, with the room of one
chunk for workspace. The same bits as ``default`` (every window lies in one sample), from the
bottom and top or from the argmax form, NaN and infinities included; PyTorch's gradients; its
workspace exact and a chunk's; offered only below the batch; and it brings the backward of
GoogLeNet's max poolings, the steps a budget binds at, down to a few MiB."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from layer_harness import assert_workspace_exact, build

from superneuron.layers.base import Context, workspace_bytes
from superneuron.layers.pool import Pooling

# (window configuration): five samples, so chunks of two leave a last one of one
CASES = [dict(pool="MAX", kernel_size=3, stride=2, pad=1),  # windows overlap
         dict(pool="MAX", kernel_size=3, stride=1, pad=1),  # GoogLeNet's branch pooling
         dict(pool="MAX", kernel_size=2, stride=2),         # windows tile the image
         dict(pool="AVE", kernel_size=3, stride=2, pad=1)]
IDS = ["max-overlap", "max-s1", "max-tiles", "ave"]
SHAPE = (5, 3, 8, 7)


@pytest.fixture
def two_samples(monkeypatch):
    """``chunked`` takes two samples of SHAPE at a time (the routed gradient's bytes)."""
    def layer_for(dtype, **cfg):
        layer, _ = build("Pooling", [SHAPE], dtype, **cfg)
        sample = int(np.prod(layer.top_shapes[0][1:])) * np.dtype(dtype).itemsize
        monkeypatch.setattr(Pooling, "CHUNK_BYTES", 2 * sample)
        return build("Pooling", [SHAPE], dtype, **cfg)[0]
    return layer_for


def inputs(dtype, rng):
    """A bottom with ties, NaN and infinities among its values, and a top gradient."""
    x = np.round(rng.standard_normal(SHAPE) * 2).astype(dtype)  # ties: the first maximum wins
    x.reshape(-1)[::17] = np.nan
    x.reshape(-1)[5::23] = np.inf
    x.reshape(-1)[9::29] = -np.inf
    return x


def backward(layer, x, dy, algo, argmax=None):
    """The bottom gradient under the algorithm named ``algo``, from the bottom and top or from
    ``argmax``."""
    y = np.zeros(layer.top_shapes[0], layer.dtype)
    layer.forward(Context(), [x], [y], {})
    offered = next(a for a in layer.algorithms("backward") if a.name == algo)
    dx = np.full(SHAPE, 7.0, layer.dtype)
    reads = ([None], [None]) if argmax is not None else ([x], [y])
    with np.errstate(invalid="ignore"):  # an average over inf and -inf
        layer.backward(Context(workspace=np.zeros(offered.workspace, np.uint8), algo=algo, encoded=argmax),
                       *reads, [dy], [dx], {}, {})
    return dx


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cfg", CASES, ids=IDS)
def test_chunked_gives_the_default_bits(rng, two_samples, cfg, dtype):
    layer = two_samples(dtype, **cfg)
    assert [a.name for a in layer.algorithms("backward")] == ["default", "chunked"]
    x = inputs(dtype, rng) if cfg["pool"] == "MAX" else rng.standard_normal(SHAPE).astype(dtype)
    dy = rng.standard_normal(layer.top_shapes[0]).astype(dtype)
    want = backward(layer, x, dy, "default")
    np.testing.assert_array_equal(backward(layer, x, dy, "chunked"), want)
    if cfg["pool"] == "MAX":  # from the argmax form too
        (enc,) = layer.encodings()
        y = np.zeros(layer.top_shapes[0], dtype)
        layer.forward(Context(), [x], [y], {})
        argmax = np.zeros(*enc.form)
        layer.encode(Context(workspace=np.zeros(enc.workspace, np.uint8)), "argmax", [x], [y], argmax)
        np.testing.assert_array_equal(backward(layer, x, dy, "chunked", argmax), want)


@pytest.mark.parametrize("cfg", CASES, ids=IDS)
def test_chunked_matches_pytorch(rng, two_samples, cfg):
    layer = two_samples(np.float64, **cfg)
    x = rng.standard_normal(SHAPE)  # no ties: PyTorch's first maximum is ours
    dy = rng.standard_normal(layer.top_shapes[0])
    t = torch.tensor(x, requires_grad=True)
    pool = F.max_pool2d if cfg["pool"] == "MAX" else F.avg_pool2d
    kwargs = dict(kernel_size=cfg["kernel_size"], stride=cfg["stride"], padding=cfg.get("pad", 0), ceil_mode=True)
    if cfg["pool"] == "AVE":
        kwargs["count_include_pad"] = True
    pool(t, **kwargs).backward(torch.tensor(dy))
    np.testing.assert_allclose(backward(layer, x, dy, "chunked"), t.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cfg", CASES, ids=IDS)
def test_chunked_workspace_is_one_chunks_and_exact(rng, two_samples, cfg):
    layer = two_samples(np.float32, **cfg)
    top = layer.top_shapes[0]
    per = ([np.bool_] * 2 if cfg["pool"] == "MAX" else []) + [np.float32]
    default, chunked = layer.algorithms("backward")
    assert default.workspace == workspace_bytes(*[(top, d) for d in per])
    assert chunked.workspace == workspace_bytes(*[((2, *top[1:]), d) for d in per]) < default.workspace
    assert chunked.speed < default.speed  # a little slower: the workspace pass weighs it so
    assert_workspace_exact(layer, rng.standard_normal(SHAPE).astype(np.float32), {})


def test_chunk_is_whole_samples_within_its_bytes_and_offered_only_below_the_batch():
    # GoogLeNet's inception_3b_pool at batch 32: 3x3 stride 1 over 480x28x28, 1.4 MiB a sample
    layer, _ = build("Pooling", [(32, 480, 28, 28)], np.float32, pool="MAX", kernel_size=3, stride=1, pad=1)
    assert layer.chunk == Pooling.CHUNK_BYTES // (480 * 28 * 28 * 4) == 5
    default, chunked = layer.algorithms("backward")
    assert default.workspace >> 20 == 68 and chunked.workspace >> 20 == 10
    layer, _ = build("Pooling", [(2, 4, 8, 8)], np.float32, pool="MAX", kernel_size=2, stride=2)
    assert [a.name for a in layer.algorithms("backward")] == ["default"]  # the batch fits one chunk
    assert [a.name for a in layer.algorithms("forward")] == ["default"]


def test_average_pooling_uploads_its_divisors_once_not_at_every_call():
    """On a device, the window sizes an average pooling divides by are a layer constant
    (Layer.constant): uploaded at the first call and kept, so no iteration after the first
    copies from the host (inside a CUDA graph's capture such a copy is an error); a new
    setup's sizes are uploaded anew."""
    import types
    layer, _ = build("Pooling", [(2, 3, 9, 9)], dtype=np.float32, pool="AVE", kernel_size=3, stride=2)
    uploads = []

    def asarray(value, dtype=None):
        uploads.append(value)
        return np.array(value, dtype=dtype)
    device = types.SimpleNamespace(asarray=asarray, divide=np.divide)  # a stand-in for CuPy
    a = np.ones(layer.top_shapes[0], np.float32)
    outs = [np.empty_like(a) for _ in range(3)]
    for out in outs[:2]:
        layer._divide_by_sizes(device, a, out)
    assert len(uploads) == 2  # rows and columns, once
    layer._divide_by_sizes(np, a, outs[2])
    np.testing.assert_array_equal(outs[0], outs[2])
    layer.setup([(2, 3, 7, 7)])
    layer._divide_by_sizes(device, np.ones(layer.top_shapes[0], np.float32), np.empty(layer.top_shapes[0], np.float32))
    assert len(uploads) == 4
