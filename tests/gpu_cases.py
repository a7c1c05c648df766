"""Every layer type's case for the GPU check (tests/test_gpu.py runs each on CuPy against NumPy):
shapes, settings and inputs in the layer's domain (labels within the classes, probabilities
positive, a mask a MAX Pooling made). tests/test_gpu_cases.py checks on the CPU that every
registered type has a case here or a reason below, and that each case runs, so a GPU call
never fails on a case written wrong."""

import numpy as np
from layer_harness import build, forward

from superneuron.layers.base import Context


def _normal(rng, shapes):
    return [rng.standard_normal(s) for s in shapes]


def _labels(classes, *positive):
    """Inputs: normal scores, then labels in [0, classes) at the other positions, except those
    in ``positive`` (uniform in (0.1, 1.1): probabilities, an infogain matrix)."""
    def make(rng, shapes):
        out = []
        for i, s in enumerate(shapes):
            if i == 0 and 0 not in positive:
                out.append(rng.standard_normal(s))
            elif i in positive:
                out.append(rng.uniform(0.1, 1.1, s))
            else:
                out.append(rng.integers(0, classes, s).astype(np.float64))
        return out
    return make


def _unit(rng, shapes):
    """Targets in [0, 1] after normal scores (SigmoidCrossEntropyLoss)."""
    return [rng.standard_normal(shapes[0]), rng.uniform(0, 1, shapes[1])]


def _pool_mask(rng, shapes):
    """A MAX Pooling's output and mask, as SegNet's Upsample reads them."""
    pool, params = build("Pooling", [(2, 3, 8, 6)], n_tops=2, pool="MAX", kernel_size=2, stride=2)
    return forward(pool, [rng.standard_normal((2, 3, 8, 6))], params)


MORE_CASES = [
    # (type, bottom shapes, settings, inputs(rng, shapes) or None for normal values)
    ("ArgMax", [(2, 5, 3)], dict(axis=1), None),
    ("Slice", [(2, 6, 3)], dict(axis=1, slice_point=[2, 5], tops=3), None),
    ("Exp", [(3, 4, 2)], dict(base=2.0, scale=0.5, shift=1.0), None),
    ("Log", [(3, 4, 2)], dict(base=10.0, scale=0.5, shift=5.0), None),
    ("Threshold", [(3, 4, 2)], dict(threshold=0.2), None),
    ("Clip", [(3, 4, 2)], dict(min=-0.5, max=0.7), None),
    ("Swish", [(3, 4, 2)], dict(beta=2.5), None),
    ("GELU", [(3, 4, 5)], dict(approximate="tanh"), None),
    ("Bias", [(2, 3, 4, 5), (3, 4)], {}, None),
    ("MVN", [(2, 3, 4, 5)], dict(across_channels=True), None),
    ("Reduction", [(2, 3, 4)], dict(operation="SUMSQ", axis=1, coeff=0.5), None),
    ("Tile", [(2, 3, 4)], dict(axis=2, tiles=2), None),
    ("Crop", [(2, 3, 8, 9), (2, 5, 5, 6)], dict(offset=[1, 2]), None),
    ("BatchReindex", [(4, 3, 2), (5,)], {}, _labels(4)),
    ("Filter", [(5, 3, 2), (5, 4), (5, 1)], dict(tops=2), _labels(2, 0, 1)),
    ("Interp", [(2, 3, 5, 7)], dict(height=9, width=13), None),
    ("Normalize", [(2, 3, 4, 5)], dict(across_spatial=False), None),
    ("Upsample", [(2, 3, 4, 3), (2, 3, 4, 3)], dict(scale=2), _pool_mask),
    ("SPP", [(2, 3, 8, 8)], dict(pyramid_height=3), None),
    ("LayerNorm", [(2, 3, 5)], {}, None),
    ("MatMul", [(2, 5, 4), (2, 3, 5)], dict(transpose_a=True, transpose_b=True), None),
    ("Permute", [(2, 3, 4, 5)], dict(order=[0, 2, 1, 3]), None),
    ("Parameter", [(5, 2)], dict(shape=[3, 4]), None),
    ("Embed", [(2, 5)], dict(num_output=4, input_dim=7), lambda rng, s: [rng.integers(0, 7, s[0]).astype(float)]),
    ("MultiHeadAttention", [(2, 7, 6)], dict(num_heads=3, causal=True, query_block=2, dropout_ratio=0.2), None),
    ("LSTM", [(4, 2, 3), (4, 2)], dict(num_output=5), lambda rng, s: [rng.standard_normal(s[0]),
                                                                       (rng.random(s[1]) > 0.3).astype(float)]),
    ("RNN", [(4, 2, 3), (4, 2)], dict(num_output=5), lambda rng, s: [rng.standard_normal(s[0]),
                                                                      (rng.random(s[1]) > 0.3).astype(float)]),
    ("EuclideanLoss", [(4, 3), (4, 3)], {}, None),
    ("SigmoidCrossEntropyLoss", [(4, 3), (4, 3)], {}, _unit),
    ("SoftmaxWithLoss", [(2, 5, 3, 4), (2, 1, 3, 4)], dict(normalization="VALID"), _labels(5)),
    ("Accuracy", [(4, 5), (4,)], dict(top_k=2), _labels(5)),
    ("MultinomialLogisticLoss", [(5, 4), (5,)], {}, _labels(4, 0)),
    ("HingeLoss", [(6, 5), (6,)], dict(norm="L2"), _labels(5)),
    ("ContrastiveLoss", [(6, 3), (6, 3), (6,)], dict(margin=1.5), lambda rng, s: [
        rng.standard_normal(s[0]), rng.standard_normal(s[1]), rng.integers(0, 2, s[2]).astype(float)]),
    ("InfogainLoss", [(5, 4), (5,), (4, 4)], {}, _labels(4, 0, 2)),
]

# Types without a case here, and why (each is checked some other way).
EXCLUDED = {
    "Flatten": "its top is a view of its bottom: no kernel",
    "Reshape": "its top is a view of its bottom: no kernel",
    "Split": "its tops are views of its bottom: no kernel",
    "Silence": "no top: no kernel",
    "Input": "copies the feed: no kernel",
    "Data": "copies the feed: no kernel",
    "MemoryData": "copies the feed: no kernel",
    "HDF5Data": "reads files on the host and copies the batch: no kernel",
    "DummyData": "fills from the backend's generator, whose numbers differ between NumPy and CuPy",
    "Dropout": "the backend's generator: its masks differ between NumPy and CuPy (test_gpu's own test)",
    "Python": "a user's NumPy code on host copies by design (tests/test_python_layer.py)",
    "PriorBox": "shapes only, computed at set-up on the host",
    "MultiBoxLoss": "matching and mining on the host by design, as the SSD fork runs them",
    "DetectionOutput": "non-maximum suppression on the host by design, as the SSD fork runs it",
}


def build_case(case, dtype=np.float64):
    """The layer and parameters of ``case`` (its settings' ``tops``: how many tops)."""
    cfg = dict(case[2])
    return build(case[0], case[1], dtype=dtype, n_tops=cfg.pop("tops", None), **cfg)


def inputs_of(case, rng):
    """The bottoms of ``case`` (a CASES or MORE_CASES entry), drawn from ``rng``."""
    make = case[3] if len(case) > 3 and case[3] is not None else _normal
    return make(rng, case[1])


def run_case(layer, params, bottoms, xp, backend):
    """A forward and, where the layer has one, a backward on ``xp`` (NumPy or CuPy) with
    ``backend``; the tops, bottom gradients and parameter gradients on the host."""
    f = layer.algorithms("forward")[0]
    bottoms = [xp.asarray(x) for x in bottoms]
    params = {k: xp.asarray(v) for k, v in params.items()}
    tops = [xp.zeros(s, layer.dtype) for s in layer.top_shapes]
    layer.forward(Context(xp, workspace=xp.zeros(max(f.workspace, 1), xp.uint8), seed=5, backend=backend),
                  bottoms, tops, params)
    host = backend.to_host
    if not layer.BACKWARD:
        return [host(t) for t in tops], [], {}
    b = layer.algorithms("backward")[0]
    tg = [xp.asarray(np.random.default_rng(2).standard_normal(s).astype(layer.dtype)) for s in layer.top_shapes]
    bg = [None if i in layer.LABEL_BOTTOMS else xp.zeros(s, layer.dtype) for i, s in enumerate(layer.bottom_shapes)]
    pg = {p.name: xp.zeros(p.shape, layer.dtype) for p in layer.param_specs() if p.learnable}
    layer.backward(Context(xp, workspace=xp.zeros(max(b.workspace, 1), xp.uint8), seed=5, backend=backend),
                   bottoms, tops, tg, bg, params, pg)
    return [host(t) for t in tops], [host(g) for g in bg if g is not None], {k: host(v) for k, v in pg.items()}
