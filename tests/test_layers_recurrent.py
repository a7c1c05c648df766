"""Caffe's LSTM and RNN layers: against PyTorch's nn.LSTM and nn.RNN where a sequence starts at
t = 0 (the markers PyTorch has no equal of), against float64 finite differences with
sequences that restart mid-way and a static input, in the workspace they declare, without
hidden allocations, and under every policy with baseline's bits in a net."""

import functools

import numpy as np
import pytest
import torch
from layer_harness import build, forward, gradcheck, peak_allocation

from superneuron.layers.base import Context
from superneuron.net import Net
from superneuron.netfile.spec import loads_spec

T, N, D, H = 5, 3, 4, 6


def markers(rng, restarts=True):
    cont = np.ones((T, N))
    cont[0] = 0
    if restarts:
        cont[2, 1] = cont[3, 2] = 0  # two streams start new sequences mid-way
    return cont


def _torch_lstm(params):
    """nn.LSTM with the layer's weights: ``(run, grads)``, ``run(tx)`` its output and
    ``grads()`` its weights' gradients named and ordered as the layer's (Caffe's gate order
    i, f, o, g; PyTorch's i, f, g, o)."""
    ref = torch.nn.LSTM(D, H).double()

    def to_torch(w):
        i, f, o, g = np.split(w, 4)
        return torch.tensor(np.concatenate([i, f, g, o]))

    def to_caffe(w):
        i, f, g, o = np.split(w.numpy(), 4)
        return np.concatenate([i, f, o, g])

    with torch.no_grad():
        ref.weight_ih_l0.copy_(to_torch(params["W_xc"]))
        ref.weight_hh_l0.copy_(to_torch(params["W_hc"]))
        ref.bias_ih_l0.copy_(to_torch(params["b_c"]))
        ref.bias_hh_l0.zero_()
    return (lambda tx: ref(tx)[0],
            lambda: {"W_xc": to_caffe(ref.weight_ih_l0.grad), "W_hc": to_caffe(ref.weight_hh_l0.grad)})


def _torch_rnn(params):
    """nn.RNN with the layer's weights, then Caffe's output layer (tanh of an inner product):
    ``(run, grads)`` as :func:`_torch_lstm`'s."""
    ref = torch.nn.RNN(D, H).double()
    with torch.no_grad():
        ref.weight_ih_l0.copy_(torch.tensor(params["W_xh"]))
        ref.weight_hh_l0.copy_(torch.tensor(params["W_hh"]))
        ref.bias_ih_l0.copy_(torch.tensor(params["b_h"]))
        ref.bias_hh_l0.zero_()
    w_ho = torch.tensor(params["W_ho"], requires_grad=True)
    return (lambda tx: torch.tanh(ref(tx)[0] @ w_ho.T + torch.tensor(params["b_o"])),
            lambda: {"W_hh": ref.weight_hh_l0.grad.numpy(), "W_ho": w_ho.grad.numpy()})


@pytest.mark.parametrize("kind, reference, seed", [("LSTM", _torch_lstm, 0), ("RNN", _torch_rnn, 1)])
def test_matches_torch_from_a_zero_state(kind, reference, seed):
    rng = np.random.default_rng(seed)
    layer, params = build(kind, [(T, N, D), (T, N)], num_output=H)
    x, cont = rng.standard_normal((T, N, D)), markers(rng, restarts=False)
    dy = rng.standard_normal((T, N, H))
    (top,) = forward(layer, [x, cont], params)
    run, torch_grads = reference(params)
    tx = torch.tensor(x, requires_grad=True)
    out = run(tx)
    out.backward(torch.tensor(dy))
    assert np.allclose(top, out.detach().numpy(), atol=1e-12)
    bgrads, pgrads = _backward(layer, [x, cont], top, dy, params)
    assert np.allclose(bgrads[0], tx.grad.numpy(), atol=1e-12)
    expected = torch_grads()
    assert len(expected) == 2
    for name, grad in expected.items():
        assert np.allclose(pgrads[name], grad, atol=1e-12), name


def _backward(layer, bottoms, top, dy, params):
    algo = layer.algorithms("backward")[0]
    ctx = Context(np, workspace=np.zeros(algo.workspace, np.uint8))
    bgrads = [np.zeros(b.shape) if i not in layer.LABEL_BOTTOMS else None for i, b in enumerate(bottoms)]
    pgrads = {p.name: np.full(p.shape, np.nan) for p in layer.param_specs()}  # overwritten, never added to
    layer.backward(ctx, bottoms, [top], [dy], bgrads, params, pgrads)
    return bgrads, pgrads


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
@pytest.mark.parametrize("static", [False, True])
def test_gradients_are_the_finite_differences_with_restarts(kind, static):
    rng = np.random.default_rng(2)
    shapes = [(T, N, 2, 2), (T, N)] + ([(N, 3)] if static else [])
    layer, params = build(kind, shapes, num_output=H)
    bottoms = [rng.standard_normal(shapes[0]), markers(rng)] + ([rng.standard_normal((N, 3))] if static else [])
    gradcheck(layer, bottoms, params)


def test_a_restart_cuts_the_sequence_off_from_its_past():
    """Where cont is 0, the step's output does not depend on anything before it."""
    rng = np.random.default_rng(3)
    layer, params = build("LSTM", [(T, N, D), (T, N)], num_output=H)
    x, cont = rng.standard_normal((T, N, D)), markers(rng)
    (a,) = forward(layer, [x, cont], params)
    x2 = x.copy()
    x2[:2, 1] += 10.0  # stream 1 before its restart at t = 2
    (b,) = forward(layer, [x2, cont], params)
    assert np.array_equal(a[2:, 1], b[2:, 1]) and not np.allclose(a[:2, 1], b[:2, 1])


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_runs_in_its_workspace_and_allocates_nothing_big(kind):
    rng = np.random.default_rng(4)
    t, n, d, h = 40, 8, 32, 32
    layer, params = build(kind, [(t, n, d), (t, n)], dtype=np.float32, num_output=h)
    params = {k: v.astype(np.float32) for k, v in params.items()}
    x, cont = rng.standard_normal((t, n, d)).astype(np.float32), np.ones((t, n), np.float32)
    for phase in ("forward", "backward"):
        algo = layer.algorithms(phase)[0]
        for nbytes, ok in ((algo.workspace, True), (algo.workspace - 1, False)):
            ctx = Context(np, workspace=np.zeros(nbytes, np.uint8))
            top = np.zeros(layer.top_shapes[0], np.float32)
            grads = {k: np.zeros_like(v) for k, v in params.items()}
            if phase == "forward":
                run = functools.partial(layer.forward, ctx, [x, cont], [top], params)
            else:
                run = functools.partial(layer.backward, ctx, [x, cont], [top], [np.ones_like(top)],
                                        [np.zeros_like(x), None], params, grads)
            if ok:
                run()
            else:
                with pytest.raises(AssertionError, match="exceeds workspace"):
                    run()
    # what the kernels allocate besides their workspace (NumPy's small buffers) does not grow
    # with the sequence: nothing is held per time step
    longer, _ = build(kind, [(4 * t, n, d), (4 * t, n)], dtype=np.float32, num_output=h)
    x4, cont4 = np.concatenate([x] * 4), np.ones((4 * t, n), np.float32)
    assert peak_allocation(longer, [x4, cont4], params) <= peak_allocation(layer, [x, cont], params) + 1024
    assert peak_allocation(layer, [x, cont], params) < t * n * h * 4  # under one top's bytes


SEQ = """
name: seq
input: {data: [5, 3, 4], cont: [5, 3], label: [15]}
layers:
  - {name: lstm1, type: LSTM, bottom: [data, cont], top: lstm1, num_output: 8,
     weight_filler: {type: uniform, min: -0.3, max: 0.3}}
  - {name: rnn1, type: RNN, bottom: [lstm1, cont], top: rnn1, num_output: 6}
  - {name: flat, type: Reshape, bottom: rnn1, top: flat, shape: [-1, 6]}
  - {name: fc, type: InnerProduct, bottom: flat, top: fc, num_output: 5}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
"""


def _train(policy):
    net = Net(loads_spec(SEQ), policy=policy)
    rng = np.random.default_rng(5)
    feed = {"data": rng.standard_normal((5, 3, 4)).astype(np.float32),
            "cont": np.array([[0, 0, 0]] + [[1, 1, 1]] * 4, np.float32),
            "label": rng.integers(0, 5, 15).astype(np.float32)}
    feed["cont"][3, 1] = 0
    loss = net.forward_backward(feed)
    return net, loss, {p: net.grad(p) for p in net.param_names}


@pytest.mark.parametrize("policy", ["liveness", "recompute", "offload", "superneurons", "gist",
                                    "superneurons+params"])
def test_every_policy_gives_baselines_bits_on_a_recurrent_net(policy):
    _, base_loss, base = _train("baseline")
    net, loss, grads = _train(policy)
    assert loss == base_loss
    assert all(np.array_equal(grads[p], base[p]) for p in base)
    assert set(base) >= {"lstm1/W_xc", "lstm1/b_c", "lstm1/W_hc", "rnn1/W_ho"}
    assert net.peak_bytes == net.plans["train"].peak_bytes
