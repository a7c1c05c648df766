"""GELU's chunked algorithm and its gradient written over the top gradient, and the attention
backward that computes each block's probabilities once (issue 33's memory at a third of
liveness's peak): the same bits as the whole-array pass, a tiny GPT that takes the chunked
GELU under a workspace limit computes liveness's numbers bit for bit, and its plan equals
its run, witnessed kernel by kernel (DESIGN.md invariants 1 and 2)."""

import numpy as np
import pytest
from kernel_trace import ALIGN, KernelTrace
from layer_harness import backward, build, forward

from superneuron import load_net
from superneuron.layers.layernorm import GELU

GPT = "nets/gpt.yaml"
TINY_GPT = dict(layers=2, d_model=8, heads=2, seq=6, vocab=11, batch=2, query_block=2)
SMALL_CHUNK = 64  # elements: the tiny net's GELU bottoms (2 x 6 x 32) are several chunks


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_chunked_gives_the_whole_passes_bits(monkeypatch, approximate):
    monkeypatch.setattr(GELU, "CHUNK", SMALL_CHUNK)
    rng = np.random.default_rng(33)
    x = (3 * rng.standard_normal((3, 7, 11))).astype(np.float32)  # 231: not a multiple of a chunk
    dy = rng.standard_normal(x.shape).astype(np.float32)
    layer, params = build("GELU", [x.shape], dtype=np.float32, approximate=approximate)
    algos = {p: {a.name: a for a in layer.algorithms(p)} for p in ("forward", "backward")}
    assert algos["backward"]["chunked"].workspace < algos["backward"]["default"].workspace / 3
    y = forward(layer, [x], params, algo=algos["forward"]["default"])[0]
    y_c = forward(layer, [x], params, algo=algos["forward"]["chunked"])[0]
    np.testing.assert_array_equal(y_c, y)
    (dx,), _ = backward(layer, [x], [y], [dy], params, algo=algos["backward"]["default"])
    for algo in ("default", "chunked"):
        for inplace in (False, True):  # dx written over dy's memory
            (got,), _ = backward(layer, [x], [y], [dy], params, algo=algos["backward"][algo], inplace=inplace)
            np.testing.assert_array_equal(got, dx, err_msg=f"{algo} inplace={inplace}")


def gpt(text_file, policy, **kw):
    return load_net(GPT, overrides=dict(TINY_GPT, source=f"text:{text_file}"), policy=policy, **kw)


def chosen(net, layer_type):
    steps = net.schedules["train"].steps
    return {(s.kind, s.algorithm) for s in steps
            if s.node is not None and net.graph.nodes[s.node].layer.type == layer_type}


def test_gpt_with_chunked_gelu_keeps_the_bits_and_its_plan(monkeypatch, tmp_path):
    monkeypatch.setattr(GELU, "CHUNK", SMALL_CHUNK)
    text = tmp_path / "words.txt"
    text.write_bytes(b"the quick brown fox jumps over the lazy dog\n" * 4)
    live = gpt(text, "liveness")
    whole = max(a.workspace for n in live.graph.nodes if n.layer.type == "GELU"
                for a in n.layer.algorithms("backward") if a.name == "default")
    limited = gpt(text, "liveness", workspace_limit=whole - 1)
    assert ("backward", "chunked") in chosen(limited, "GELU")
    assert ("backward", "default") not in chosen(limited, "GELU")
    assert chosen(limited, "MultiHeadAttention") == chosen(live, "MultiHeadAttention")
    rng = np.random.default_rng(0)
    data, label = live.input_names
    feed = {data: rng.integers(0, TINY_GPT["vocab"], live.input_shape(data)).astype(np.float32),
            label: rng.integers(0, TINY_GPT["vocab"], live.input_shape(label)).astype(np.float32)}
    trace = KernelTrace(limited)
    with monkeypatch.context() as m:
        trace.install(m)
        loss_limited = limited.forward_backward(feed)
    assert loss_limited == live.forward_backward(feed)
    for name in live.learnable_names:
        np.testing.assert_array_equal(limited.grad(name), live.grad(name), err_msg=name)
    plan = limited.plans["train"]
    assert limited.peak_bytes == plan.peak_bytes
    assert trace.locate().nbytes == limited.arena_bytes
    assert plan.arena_bytes - ALIGN < trace.high_water <= plan.arena_bytes
    assert trace.clashes() == [] and trace.violations == []
