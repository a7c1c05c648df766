"""Gist's encodings (issue 15, part 1): the codecs' kernels (layers/codecs.py, max pooling's
argmax), the encode pass (scheduler/encode.py) and the ``gist`` policy.

The kernels round-trip against NumPy's own (``numpy.packbits``, ``astype(float16)``) and exact
bits, on shapes not a multiple of 8, all zeros, all positive, NaN, infinities and -0.0; the
argmax backward routes every gradient as the backward that compares bottom and top does, bit
for bit. The pass keeps the stashes it should in the form it should; ``gist`` computes
``baseline``'s losses and gradients bit for bit on every net in nets/ (test_passes.py runs
every policy there) and tests/nets, its plan is its run, and on a ReLU/pooling net its stash
across the turn is smaller than liveness's by exactly the bytes counted here from the shapes.
``--lossy fp16`` still trains LeNet on the digits."""

import functools
import glob
import json
import math

import numpy as np
import pytest
from layer_harness import build
from one_line import raises_one_line
from test_memory_passes import CHAIN, assert_same_results, baseline, check_copies, execute, graph_of, tiny
from test_net import feed_for

from superneuron.errors import SNError
from superneuron.layers import codecs
from superneuron.layers.base import Context
from superneuron.net import Net
from superneuron.netfile.spec import load_spec
from superneuron.scheduler.allocator import aligned
from superneuron.scheduler.context import Context as PlanContext
from superneuron.scheduler.cost import CostModel
from superneuron.scheduler.encode import encode, summary
from superneuron.scheduler.inplace import inplace
from superneuron.scheduler.liveness import liveness
from superneuron.scheduler.lower import lower
from superneuron.scheduler.offload import offload
from superneuron.scheduler.policy import apply_policy
from superneuron.scheduler.simulate import simulate
from superneuron.scheduler.steps import Encode
from superneuron.scheduler.workspace import fit
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig

SPECIAL = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -1e-45, 3.0, -2.0], np.float32)


def values(kind, n, rng):
    """``n`` float32 values of ``kind``: random with zeros, all zero, all positive, or the
    special values (NaN of both signs, infinities, -0.0, denormals) repeated."""
    if kind == "zeros":
        return np.zeros(n, np.float32)
    if kind == "positive":
        return rng.uniform(1e-3, 10, n).astype(np.float32)
    if kind == "special":
        return np.resize(SPECIAL, n)
    x = rng.standard_normal(n).astype(np.float32)
    return np.maximum(x, 0)  # a ReLU's output: about half zeros


def kernel_context(codec, n, decode=False):
    ws = np.zeros(codecs.workspace_of(codec, (n,), np.float32, decode), np.uint8)
    return Context(workspace=ws)


def round_trip(codec, x):
    shape, dtype = codecs.encoded_form(codec, x.shape, x.dtype)
    encoded = np.full(shape, 0xAB, dtype)  # stale bytes: the encoder must write what it keeps
    codecs.encode(kernel_context(codec, x.size), codec, x, encoded)
    back = np.full_like(x, 7.0)
    codecs.decode(kernel_context(codec, x.size, decode=True), codec, encoded, back)
    return encoded, back


SIZES = [1, 7, 8, 9, 63, 64, 65, 1001]
KINDS = ["relu", "zeros", "positive", "special"]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_sign_packs_as_numpy_and_decodes_to_the_same_signs(n, kind):
    x = values(kind, n, np.random.default_rng(n))
    encoded, back = round_trip("sign", x)
    assert encoded.nbytes == math.ceil(n / 8)
    np.testing.assert_array_equal(encoded, np.packbits(x > 0))
    np.testing.assert_array_equal(back > 0, x > 0)  # what ReLU's backward reads
    np.testing.assert_array_equal(back, (x > 0).astype(np.float32))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_sparse_keeps_every_bit(n, kind):
    x = values(kind, n, np.random.default_rng(n))
    encoded, back = round_trip("sparse", x)
    np.testing.assert_array_equal(back.view(np.uint32), x.view(np.uint32))  # NaNs, -0.0 included
    assert encoded.nbytes >= x.nbytes  # what the plan counts: the worst case


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_fp16_rounds_as_numpy_does(n, kind):
    x = values(kind, n, np.random.default_rng(n))
    encoded, back = round_trip("fp16", x)
    assert encoded.nbytes == 2 * n
    np.testing.assert_array_equal(back.view(np.uint32), x.astype(np.float16).astype(np.float32).view(np.uint32))


POOLS = [  # (kernel, stride, pad, input side): overlapping windows, padding, odd sides, global,
    # Caffe's rounded-up last window (10: five outputs, the last window one pixel short)
    (3, 2, 1, 9), (2, 2, 0, 7), (3, 1, 1, 5), (3, 2, 0, 8), (5, 5, 0, 5), (3, 2, 0, 10)]


def max_pool_case(kernel, stride, pad, side):
    """A max pooling of (2, 3, side, side) and an input with ties, NaN, infinities, -0.0 and a
    plane of -inf (every window's first tap), with the top and argmax NumPy computes for it:
    ``(layer, x, top, argmax)``."""
    from superneuron.layers.pool import Pooling
    layer = Pooling("p", ["x"], ["y"], Pooling.config({"pool": "MAX", "kernel_size": kernel, "stride": stride,
                                                       "pad": pad}))
    (shape,) = layer.setup([(2, 3, side, side)])
    x = np.round(np.random.default_rng(side).standard_normal((2, 3, side, side)) * 2).astype(np.float32)
    x.reshape(-1)[::5] = np.resize(SPECIAL, x.size)[::5]
    x[1, 2] = -np.inf
    (enc,) = layer.encodings()
    y, argmax = np.zeros(shape, np.float32), np.zeros(shape, np.uint8)
    layer.forward(Context(), [x], [y], {})
    layer.encode(Context(workspace=np.zeros(enc.workspace, np.uint8)), "argmax", [x], [y], argmax)
    return layer, x, y, argmax


@pytest.mark.parametrize("kernel, stride, pad, side", POOLS)
@pytest.mark.parametrize("kind", ["random", "ties", "special"])
def test_max_pooling_argmax_routes_as_comparing_bottom_and_top(kernel, stride, pad, side, kind):
    from superneuron.layers.pool import NO_MAXIMUM, Pooling
    cfg = Pooling.config({"pool": "MAX", "kernel_size": kernel, "stride": stride, "pad": pad})
    layer = Pooling("p", ["x"], ["y"], cfg)
    (out_shape,) = layer.setup([(2, 3, side, side)])
    rng = np.random.default_rng(kernel * 100 + side)
    x = rng.standard_normal((2, 3, side, side)).astype(np.float32)
    if kind == "ties":
        x = np.round(x).astype(np.float32)  # many equal maxima: the first in scan order wins
    elif kind == "special":
        x.reshape(-1)[::3] = np.resize(SPECIAL, x.size)[::3]
    (enc,) = layer.encodings()
    assert enc.direct and enc.form == (out_shape, np.uint8)
    y = np.zeros(out_shape, np.float32)
    layer.forward(Context(), [x], [y], {})
    argmax = np.zeros(out_shape, np.uint8)
    layer.encode(Context(workspace=np.zeros(enc.workspace, np.uint8)), "argmax", [x], [y], argmax)
    assert argmax.max() < kernel * kernel or kind == "special"
    assert kind != "special" or (argmax == NO_MAXIMUM).any()  # a NaN maximum matches nothing
    written, top = np.zeros_like(argmax), np.zeros_like(y)  # the forward writes it too, when asked
    layer.forward(Context(workspace=np.zeros(enc.workspace, np.uint8), encoded=written), [x], [top], {})
    np.testing.assert_array_equal(written, argmax)
    np.testing.assert_array_equal(top.view(np.uint32), y.view(np.uint32))
    dy = rng.standard_normal(out_shape).astype(np.float32)
    ws = layer.algorithms("backward")[0].workspace
    grads = []
    for bottoms, tops, encoded in (([x], [y], None), ([None], [None], argmax)):
        dx = np.full(x.shape, 5.0, np.float32)
        layer.backward(Context(workspace=np.zeros(ws, np.uint8), encoded=encoded), bottoms, tops,
                       [dy], [dx], {}, {})
        grads.append(dx)
    np.testing.assert_array_equal(grads[1].view(np.uint32), grads[0].view(np.uint32))


@pytest.mark.parametrize("n", [1, 7, 8, 9, 63, 1001])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chunk", [1 << 21, 16, 8])
def test_relu_backward_from_its_sign_bits_gives_the_default_bits(n, kind, chunk, monkeypatch):
    """ReLU's direct form: its backward reads the packed signs of its top, span by span (the
    default's spans fill its mask's bytes; ``chunked`` takes CHUNK values at a time), and writes
    the bits the backward from the top writes, in place on its top gradient too."""
    from superneuron.layers.activation import ReLU
    monkeypatch.setattr(ReLU, "CHUNK", chunk)  # spans of a few values: several, a ragged last
    layer, _ = build("ReLU", [(n,)], np.float32)
    x = values(kind, n, np.random.default_rng(n))
    y = np.zeros_like(x)
    layer.forward(Context(), [x], [y], {})
    direct = next(e for e in layer.encodings() if e.direct)
    bits = np.zeros(*direct.form)
    layer.encode(Context(workspace=np.zeros(direct.workspace, np.uint8)), "sign", [None], [y], bits)
    np.testing.assert_array_equal(bits, np.packbits(y > 0))
    written, top = np.zeros_like(bits), x.copy()  # the forward writes it too, when asked (in place)
    layer.forward(Context(workspace=np.zeros(direct.workspace, np.uint8), encoded=written), [top], [top], {})
    np.testing.assert_array_equal(written, bits)
    np.testing.assert_array_equal(top.view(np.uint32), y.view(np.uint32))
    algos = {a.name: a for a in layer.algorithms("backward")}
    assert set(algos) == ({"default", "chunked"} if n > chunk else {"default"})
    dy = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    dy[::5] = -0.0
    for algo, offered in algos.items():  # each algorithm offered, from the top and from the bits
        want = np.full(n, 7.0, np.float32)
        layer.backward(Context(workspace=np.zeros(offered.workspace, np.uint8), algo=algo), [None], [y],
                       [dy], [want], {}, {})
        np.testing.assert_array_equal(want.view(np.uint32), (dy * (y > 0)).view(np.uint32))
        for in_place in (False, True):
            dx = dy.copy() if in_place else np.full(n, 7.0, np.float32)
            top_grad = dx if in_place else dy.copy()
            layer.backward(Context(workspace=np.zeros(offered.workspace, np.uint8), algo=algo, encoded=bits),
                           [None], [None], [top_grad], [dx], {}, {})
            np.testing.assert_array_equal(dx.view(np.uint32), want.view(np.uint32))


def test_no_argmax_form_for_average_pooling_or_windows_past_a_byte():
    from superneuron.layers.pool import Pooling
    ave = Pooling("p", ["x"], ["y"], Pooling.config({"pool": "AVE", "kernel_size": 2, "stride": 2}))
    ave.setup([(1, 1, 4, 4)])
    big = Pooling("p", ["x"], ["y"], Pooling.config({"pool": "MAX", "global_pooling": True}))
    big.setup([(1, 1, 16, 16)])  # 256 taps: 255 is "no maximum"
    assert ave.encodings() == [] and big.encodings() == []


# -- the pass ----------------------------------------------------------------------------------

HEAD_2 = """\
name: n
input: {data: [2, 3, 5, 5], label: [2]}
layers:
"""


def encoded(schedule):
    """``{encoded tensor: codec}`` of what a schedule's Encode steps, and Forwards that write
    their layer's own form, write."""
    return {t: codec for t, codec, _, _ in summary(schedule)["tensors"]}


def test_relu_pool_stashes_become_a_sign_mask_and_an_argmax():
    """In conv → BN → Scale → ReLU → max pool, the pool's backward reads its argmax, so the
    ReLU's output is read after the turn by the ReLU's backward alone, which reads its own
    1-bit form: no map comes back for it. Each form is written by its layer's forward, in the
    same pass (no Encode step); the ReLU's output goes once the pool's forward has read it."""
    g = graph_of(CHAIN)
    s = apply_policy(lower(g), "gist")
    assert encoded(s) == {"pool1#argmax": "argmax", "relu1#sign": "sign", "relu3#sign": "sign"}
    assert not any(x.kind == "decode" for x in s.steps)
    steps = [x for x in s.steps if x.kind not in ("alloc", "free")]
    turn = next(i for i, x in enumerate(steps) if x.kind == "backward")
    at = {x.describe(g): i for i, x in enumerate(steps)}
    assert not any(x.kind == "encode" for x in steps)
    assert at["Forward(pool1) [default] writes pool1#argmax"] < turn
    assert "Backward(pool1) [default] reads pool1#argmax" in at
    for i in (1, 3):
        assert at[f"Forward(relu{i}) [default] writes relu{i}#sign"] < turn
        assert f"Backward(relu{i}) [default] reads relu{i}#sign" in at
    frees = [k for k, x in enumerate(s.steps) if x.kind == "free" and x.tensor == "scale1"]
    first_backward = next(k for k, x in enumerate(s.steps) if x.kind == "backward")
    assert frees and frees[0] < first_backward  # the map is not kept across the turn
    assert_same_results(g, s)


def test_a_forward_writing_its_own_form_costs_the_forms_bytes_alone_on_a_gpu():
    """On the GPU model a ReLU's or max pooling's Forward that writes its own form adds the
    form's bytes alone (the kernel has the operands at hand); an Encode of its own would read
    them again, at 9x the argmax's bytes and 33x the signs'. On the CPU, where NumPy does read
    them again, it adds what that Encode would take."""
    g = graph_of(CHAIN)
    s = apply_policy(lower(g), "gist")
    fused = [x for x in s.steps if x.kind == "forward" and x.encoded is not None]
    assert {g.nodes[x.node].layer.type for x in fused} == {"ReLU", "Pooling"}
    for device in ("gpu", "cpu"):
        model = CostModel(device)
        for step in fused:
            added = model.step_seconds(s, step) - model.step_seconds(s, step._replace(encoded=None))
            alone = model.step_seconds(s, Encode(step.encoded, "?", node=step.node))
            if device == "gpu":
                assert added == pytest.approx(s.tensors[step.encoded].nbytes / model.device.bandwidth)
                assert added * 8 < alone
            else:
                assert added == pytest.approx(alone)


def test_a_forward_with_a_workspace_leaves_its_form_to_an_encode_step(monkeypatch):
    """Where the layer's forward has a workspace of its own, its form is written by an Encode
    right after it (with the form's scratch), and the results are baseline's, bit for bit."""
    from superneuron.layers.base import Algo
    from superneuron.layers.pool import Pooling
    plain = Pooling.algorithms
    monkeypatch.setattr(Pooling, "algorithms",
                        lambda self, phase: [Algo("default", 4096)] if phase == "forward" else plain(self, phase))
    g = graph_of(CHAIN)
    s = apply_policy(lower(g), "gist")
    assert encoded(s) == {"pool1#argmax": "argmax", "relu1#sign": "sign", "relu3#sign": "sign"}
    steps = [x for x in s.steps if x.kind not in ("alloc", "free")]
    at = {x.describe(g): i for i, x in enumerate(steps)}
    assert at["Encode(pool1#argmax) [argmax]"] == at["Forward(pool1) [default]"] + 1
    assert "Forward(relu1) [default] writes relu1#sign" in at
    assert_same_results(g, s)


def test_a_leaky_relu_keeps_the_sign_tensor_form_decoded_before_its_backward():
    """A leaky ReLU has no direct form: its top's signs are kept as the tensor form, which a
    Decode writes back (1.0 and 0.0) right before its backward."""
    g = graph_of(CHAIN.replace("type: ReLU,", "type: ReLU, negative_slope: 0.1,"))
    s = apply_policy(lower(g), "gist")
    assert encoded(s) == {"pool1#argmax": "argmax", "scale1#sign": "sign", "scale3#sign": "sign"}
    steps = [x for x in s.steps if x.kind not in ("alloc", "free")]
    turn = next(i for i, x in enumerate(steps) if x.kind == "backward")
    at = {x.describe(g): i for i, x in enumerate(steps)}
    for r in ("scale1", "scale3"):
        decode = at[f"Decode({r}#sign) [sign]"]
        assert decode > turn and steps[decode + 1].describe(g) == f"Backward(relu{r[-1]}) [default]"
    assert_same_results(g, s)


def test_a_relu_output_a_convolution_reads_stays_whole_losslessly():
    """ReLU → convolution: the convolution's backward needs the values (its weight gradient),
    so no lossless form serves both readers (the sparse one is never counted smaller); with
    --lossy fp16 it is kept in half precision."""
    g = graph_of(HEAD_2 + """\
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 1}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: conv2, type: Convolution, bottom: conv1, top: conv2, num_output: 4, kernel_size: 1}
  - {name: fc, type: InnerProduct, bottom: conv2, top: fc, num_output: 3}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
""")
    assert encoded(apply_policy(lower(g), "gist")) == {}
    assert encoded(apply_policy(lower(g), "gist", lossy=("fp16",)))["conv1#fp16"] == "fp16"


def test_lossy_fp16_is_used_only_when_asked_and_halves_the_other_stashes():
    g = graph_of(CHAIN)
    plain = encoded(apply_policy(lower(g), "gist"))
    lossy = encoded(apply_policy(lower(g), "gist", lossy=("fp16",)))
    assert "fp16" not in plain.values()
    halves = {t for t, c in lossy.items() if c == "fp16"}
    assert {t for t, c in lossy.items() if c != "fp16"} == set(plain) and halves
    s = apply_policy(lower(g), "gist", lossy=("fp16",))
    for t in halves:
        assert s.tensors[t].nbytes * 2 == s.tensors[t[:-len("#fp16")]].nbytes
    assert "label" not in {t.split("#")[0] for t in halves}  # labels stay exact
    with raises_one_line(SNError, match="policy 'liveness' does not encode; use --policy gist"):
        apply_policy(lower(g), "liveness", lossy=("fp16",))


RELU_POOL = """\
name: relu_pool
input: {data: [4, 3, 16, 16], label: [4]}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 8, kernel_size: 1}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: pool1, type: Pooling, bottom: conv1, top: pool1, pool: MAX, kernel_size: 2, stride: 2}
  - {name: conv2, type: Convolution, bottom: pool1, top: conv2, num_output: 16, kernel_size: 1}
  - {name: relu2, type: ReLU, bottom: conv2, top: conv2}
  - {name: pool2, type: Pooling, bottom: conv2, top: pool2, pool: MAX, kernel_size: 3, stride: 2, pad: 1}
  - {name: fc, type: InnerProduct, bottom: pool2, top: fc, num_output: 10}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
"""


def test_gist_stashes_less_than_liveness_by_the_bytes_the_shapes_give():
    """Each ReLU output (4·C·H·W float32) is kept as a mask of one bit a value, and its pool
    keeps one byte an output beside its output: counted here from the shapes alone."""
    g = graph_of(RELU_POOL)
    live, gist = (apply_policy(lower(g), p) for p in ("liveness", "gist"))
    saved = 0
    for c, side, out in ((8, 16, 8), (16, 8, 5)):  # Caffe rounds up: ceil((8 + 2 - 3) / 2) + 1
        n = 4 * c * side * side
        saved += aligned(4 * n) - aligned(math.ceil(n / 8)) - aligned(4 * c * out * out)
    assert summary(live)["stash_bytes"] - summary(gist)["stash_bytes"] == saved
    plans = simulate(live), simulate(gist)
    assert plans[1].peak_bytes < plans[0].peak_bytes
    assert_same_results(g, gist)


@pytest.mark.parametrize("lossy", [(), ("fp16",)])
@pytest.mark.parametrize("graph", [tiny, lambda: graph_of(CHAIN), lambda: graph_of(RELU_POOL)],
                         ids=["tiny", "chain", "relu_pool"])
@pytest.mark.parametrize("placement", ["dynamic", "planned"])
def test_plan_equals_run_with_encodings(graph, placement, lossy):
    g = graph()
    s = apply_policy(lower(g), "gist", placement=placement, lossy=lossy)
    assert encoded(s)
    if lossy:  # half-precision stashes (11 bits): each gradient within a percent (those that are
        # zero but for rounding, a bias before BatchNorm, within 1e-5)
        runtime, plan, loss, grads, _ = execute(s)
        base_loss, base_grads, _ = baseline(g)
        assert loss == pytest.approx(base_loss, rel=1e-3)
        for name, grad in base_grads.items():
            assert np.linalg.norm(grads[name] - grad) <= 1e-2 * np.linalg.norm(grad) + 1e-5, name
    else:
        runtime, plan = assert_same_results(g, s)[:2]
    assert (runtime.peak_bytes, runtime.arena_bytes) == (plan.peak_bytes, plan.arena_bytes)
    assert runtime.stalls == 0 and plan.lower_bound_bytes <= plan.peak_bytes <= plan.arena_bytes


def test_offloaded_stashes_travel_encoded():
    """Encode before offload: the stashes the offload pass sends to the host are the encoded
    forms, so the host holds less than offloading the maps themselves; results stay exact."""
    g = graph_of(CHAIN)
    context = PlanContext()
    plain, coded = lower(g), lower(g)
    for apply in (inplace, liveness, offload, fit):
        plain = apply(plain, context)
    for apply in (inplace, liveness, encode, offload, fit):
        coded = apply(coded, context)
    check_copies(coded)
    sent = {s.tensor for s in coded.steps if s.kind == "offload"}
    assert sent & set(encoded(coded))
    assert 0 < simulate(coded).host_bytes < simulate(plain).host_bytes
    runtime, plan = assert_same_results(g, coded)[:2]
    assert runtime.host_peak == plan.host_bytes and runtime.peak_bytes == plan.peak_bytes


@functools.lru_cache(maxsize=None)
def _trained(path, policy):
    spec = load_spec(path, batch=2)
    net = Net(spec, policy=policy, optimizer=make_optimizer(SolverConfig(base_lr=0.01, momentum=0.9)))
    losses = [net.train_step(feed_for(net, seed=i), i) for i in range(2)]
    return net, losses


@pytest.mark.parametrize("path", sorted(glob.glob("tests/nets/*.yaml")))
def test_gist_trains_bit_for_bit_as_baseline_on_the_test_nets(path):
    """Two training iterations of every net in tests/nets (nets/ is test_passes.py's): the
    same losses and the same weights and statistics after them, bit for bit."""
    base, base_losses = _trained(path, "baseline")
    gist, gist_losses = _trained(path, "gist")
    assert gist_losses == base_losses and all(np.isfinite(base_losses))
    for name in base.param_names:
        np.testing.assert_array_equal(gist.param(name), base.param(name), err_msg=name)
    assert gist.peak_bytes == gist.plans["train"].peak_bytes


def test_sn_plan_shows_the_encoded_stashes(capsys):
    from superneuron.cli.plan import main
    assert main(["tests/nets/digits_bn.yaml", "--policy", "gist", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)["encoded"]
    codecs_used = {t["codec"] for t in info["tensors"]}
    assert codecs_used == {"argmax", "sign"} and info["stash_bytes"] < info["liveness_stash_bytes"]
    assert main(["tests/nets/digits_bn.yaml", "--policy", "gist", "--lossy", "fp16"]) == 0
    out = capsys.readouterr().out
    assert "encoded " in out and "fp16" in out and "saves" in out


def test_lossy_needs_a_policy_that_encodes(capsys):
    from superneuron.cli.plan import main
    assert main(["tests/nets/digits_bn.yaml", "--policy", "liveness", "--lossy", "fp16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--policy gist" in err[0]


@pytest.mark.slow
def test_lossy_fp16_still_learns_the_digits(tmp_path):
    """digits_bn (conv → BN → Scale → ReLU → max pool, 300 iterations) with every stash but
    the masks and argmaxes in half precision: within a point or two of its 92.5 % in full."""
    from superneuron.cli.train import main
    log = tmp_path / "fp16.jsonl"
    assert main(["tests/nets/digits_bn.yaml", "--policy", "gist", "--lossy", "fp16", "--log", str(log),
                 "--display", "100"]) == 0
    records = [json.loads(line) for line in open(log)]
    assert [r["test_accuracy"] for r in records if "test_accuracy" in r][-1] >= 0.9
