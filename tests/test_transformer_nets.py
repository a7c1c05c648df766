"""nets/gpt.yaml and nets/vit.yaml at tiny sizes: the MultiHeadAttention layer computes what the
same attention written with primitive layers computes; every policy gives baseline's losses
and gradients (bit for bit where the algorithms are the same, within float32 rounding where a
budget makes attention take its blocked algorithms); and the plan equals the run, witnessed
kernel by kernel (DESIGN.md invariants 1 and 2)."""

import numpy as np
import pytest
from kernel_trace import ALIGN, KernelTrace

from superneuron import load_net
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig

GPT = "nets/gpt.yaml"
TINY_GPT = dict(layers=2, d_model=8, heads=2, seq=6, vocab=11, batch=2, query_block=2)
POLICIES = ("liveness", "recompute", "offload", "superneurons", "gist", "superneurons+params")


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "words.txt"
    path.write_bytes(b"the quick brown fox jumps over the lazy dog\n" * 4)
    return path


def gpt(text_file, policy="baseline", optimizer=None, **overrides):
    return load_net(GPT, overrides=dict(TINY_GPT, source=f"text:{text_file}", **overrides),
                    policy=policy, optimizer=optimizer)


def tokens(net, seed=0):
    rng = np.random.default_rng(seed)
    data, label = net.input_names
    vocab = TINY_GPT["vocab"]
    return {data: rng.integers(0, vocab, net.input_shape(data)).astype(np.float32),
            label: rng.integers(0, vocab, net.input_shape(label)).astype(np.float32)}


def grads(net):
    return {name: net.grad(name).copy() for name in net.learnable_names}


def test_attention_layer_equals_the_primitive_layers(text_file):
    layer, primitive = gpt(text_file), gpt(text_file, attention="primitive")
    renamed = {"in_weight": "_qkv/weight", "in_bias": "_qkv/bias", "out_weight": "/weight", "out_bias": "/bias"}
    for name in layer.learnable_names:
        block, _, param = name.partition("/")
        target = block + renamed[param] if block.startswith("attn") else name
        primitive.set_param(target, layer.param(name))
    assert len(primitive.learnable_names) == len(layer.learnable_names)
    feed = tokens(layer)
    loss = layer.forward_backward(feed)
    loss_p = primitive.forward_backward(feed)
    assert abs(loss - loss_p) < 1e-6 * abs(loss) and loss > 1.0
    for name in layer.learnable_names:
        block, _, param = name.partition("/")
        target = block + renamed[param] if block.startswith("attn") else name
        g = layer.grad(name)
        np.testing.assert_allclose(primitive.grad(target), g, rtol=1e-4, atol=1e-6 * np.abs(g).max(), err_msg=name)


@pytest.mark.parametrize("attn_dropout", [0.0, 0.3])
def test_every_policy_gives_baselines_numbers(text_file, attn_dropout):
    """Three training steps under each policy: losses and weights equal baseline's bit for bit
    (with attention dropout too: every recomputation and algorithm draws the same masks)."""
    def run(policy):
        net = gpt(text_file, policy=policy, optimizer=make_optimizer(SolverConfig(type="Adam", base_lr=1e-2)),
                  attn_dropout=attn_dropout)
        losses = [net.train_step(tokens(net), k) for k in range(3)]  # one batch, learnt
        return net, losses
    assert_every_policy_gives_baselines_numbers(run, below_baseline=True)


def assert_every_policy_gives_baselines_numbers(run, below_baseline=False):
    """``run(policy) → (net, losses of three steps)``: under each of POLICIES, baseline's
    losses and weights bit for bit, and plan equals run (``below_baseline``: a smaller peak
    than baseline's too)."""
    base, base_losses = run("baseline")
    assert base_losses[2] < base_losses[0]  # it learns: the check below compares something
    for policy in POLICIES:
        net, losses = run(policy)
        assert losses == base_losses, policy
        for name in base.learnable_names:
            np.testing.assert_array_equal(net.param(name), base.param(name), err_msg=f"{policy} {name}")
        assert net.peak_bytes == net.plans["train"].peak_bytes
        if below_baseline:
            assert net.peak_bytes < base.peak_bytes, policy


def test_a_tight_budget_picks_blocked_attention_and_keeps_the_numbers(text_file):
    """Under a workspace limit below the full algorithms', attention runs blocked: the same
    loss and gradients within float32 rounding, and no workspace as large as the full one's."""
    base = gpt(text_file)
    full = max(a.workspace for n in base.graph.nodes if n.layer.type == "MultiHeadAttention"
               for a in n.layer.algorithms("backward"))
    blocked = gpt(text_file, policy="liveness")
    limited = load_net(GPT, overrides=dict(TINY_GPT, source=f"text:{text_file}"), policy="liveness",
                       workspace_limit=full - 1)
    chosen = {s.algorithm for s in limited.schedules["train"].steps
              if s.node is not None and limited.graph.nodes[s.node].layer.type == "MultiHeadAttention"}
    assert "blocked" in chosen, chosen  # the backward's full algorithm does not fit the limit
    feed = tokens(base)
    loss, loss_b = blocked.forward_backward(feed), limited.forward_backward(feed)
    assert abs(loss - loss_b) < 1e-6 * abs(loss)
    for name in base.learnable_names:
        g = blocked.grad(name)
        np.testing.assert_allclose(limited.grad(name), g, rtol=1e-4, atol=1e-5 * np.abs(g).max(), err_msg=name)
    assert limited.peak_bytes == limited.plans["train"].peak_bytes


@pytest.mark.parametrize("policy", ["liveness", "superneurons"])
def test_plan_equals_run_witnessed(monkeypatch, text_file, policy):
    net = gpt(text_file, policy=policy)
    trace = KernelTrace(net)
    with monkeypatch.context() as m:
        trace.install(m)
        net.forward_backward(tokens(net))
    plan = net.plans["train"]
    kinds = {(c.node.layer.type, c.phase) for c in trace.calls if c.node is not None}
    assert ("MultiHeadAttention", "backward") in kinds
    assert trace.locate().nbytes == net.arena_bytes
    assert plan.arena_bytes - ALIGN < trace.high_water <= plan.arena_bytes
    if policy == "liveness":
        assert trace.live_peak() == plan.peak_bytes
    assert net.peak_bytes == plan.peak_bytes
    assert trace.clashes() == []
    assert trace.violations == []


def test_optimal_under_a_budget_fits_and_gives_baselines_numbers(text_file):
    """``optimal`` at 85 % of liveness's peak plans under the budget, runs to the plan, and
    computes baseline's loss and gradients (bit for bit where it kept every algorithm)."""
    base = gpt(text_file)
    budget = int(gpt(text_file, policy="liveness").plans["train"].peak_bytes * 0.85)
    net = load_net(GPT, overrides=dict(TINY_GPT, source=f"text:{text_file}"), policy="optimal",
                   memory=budget, solver_seconds=5)
    assert net.plans["train"].peak_bytes <= budget
    feed = tokens(net)
    loss, loss_base = net.forward_backward(feed), base.forward_backward(feed)
    assert net.peak_bytes == net.plans["train"].peak_bytes
    same_algorithms = "blocked" not in {s.algorithm for s in net.schedules["train"].steps}
    for name in base.learnable_names:
        if same_algorithms:
            np.testing.assert_array_equal(net.grad(name), base.grad(name), err_msg=name)
        else:
            np.testing.assert_allclose(net.grad(name), base.grad(name), rtol=1e-4, atol=1e-6, err_msg=name)
    assert loss == loss_base if same_algorithms else abs(loss - loss_base) < 1e-6


TINY_VIT = dict(layers=2, d_model=8, heads=2, patch=4, size=8, classes=10, batch=2)


def vit(policy="baseline", optimizer=None):
    return load_net("nets/vit.yaml", overrides=TINY_VIT, policy=policy, optimizer=optimizer)


def images(net, seed=0):
    rng = np.random.default_rng(seed)
    data, label = net.input_names
    return {data: rng.standard_normal(net.input_shape(data)).astype(np.float32),
            label: rng.integers(0, 10, net.input_shape(label)).astype(np.float32)}


def test_vit_every_policy_gives_baselines_numbers_and_plan_equals_run(monkeypatch):
    """The ViT (patches by a strided Convolution, a class token by Parameter and Concat, the
    class token's state taken by Slice) under each policy: baseline's losses and weights bit
    for bit over three steps, and under superneurons the plan witnessed kernel by kernel."""
    def run(policy):
        net = vit(policy, optimizer=make_optimizer(SolverConfig(type="Adam", base_lr=1e-2)))
        return net, [net.train_step(images(net), k) for k in range(3)]
    assert_every_policy_gives_baselines_numbers(run)
    net = vit("superneurons")
    trace = KernelTrace(net)
    with monkeypatch.context() as m:
        trace.install(m)
        net.forward_backward(images(net))
    plan = net.plans["train"]
    assert trace.locate().nbytes == net.arena_bytes  # one block: the arena
    assert plan.arena_bytes - ALIGN < trace.high_water <= plan.arena_bytes
    assert net.peak_bytes == plan.peak_bytes
    assert trace.clashes() == [] and trace.violations == []


def test_sn_train_gpt_on_a_text_file_learns(tmp_path, capsys):
    """sn-train nets/gpt.yaml --data text:FILE end to end (the byte windows, their next-byte
    labels, the classes on the scores' axis 2): on a repetitive text the test loss falls below
    the bytes' unigram entropy, which a model that ignores context cannot do."""
    from superneuron.cli.train import main
    from superneuron.data.text import unigram_entropy
    text = b"abcdefgh" * 64  # each byte predicts the next exactly; unigram entropy ln 8
    path = tmp_path / "abc.txt"
    path.write_bytes(text)
    log, solver = tmp_path / "run.jsonl", tmp_path / "solver.yaml"
    solver.write_text("{type: Adam, base_lr: 0.01, momentum2: 0.99, weight_decay: 0, max_iter: 40, "
                      "display: 40, test_interval: 40}\n")
    args = ["nets/gpt.yaml", "--data", f"text:{path}", "--solver", str(solver), "--log", str(log)]
    for item in ("layers=1", "d_model=16", "heads=2", "seq=16", "batch=4"):
        args += ["--set", item]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"data: text:{path} (" in out and "sample 16" in out
    import json
    tests = [json.loads(line) for line in open(log) if "test_loss" in line]
    assert tests and tests[-1]["test_loss"] < 0.5 * unigram_entropy(np.frombuffer(text, np.uint8))


def test_a_tied_head_is_the_embedding_table_with_both_gradients(text_file):
    """``tied: true``: the head's logits are ln_f times the token table (a Parameter that Embed
    and the head both read): the loss of the untied net whose tok and head weights are that
    table (head bias 0), and the table's gradient the sum of their two; every policy gives
    baseline's bits on it."""
    tied, untied = gpt(text_file, tied=True), gpt(text_file)
    vocab, d = TINY_GPT["vocab"], TINY_GPT["d_model"]
    assert set(untied.learnable_names) - set(tied.learnable_names) == {"tok/weight", "head/weight", "head/bias"}
    assert set(tied.learnable_names) - set(untied.learnable_names) == {"wte/weight"}
    assert tied.param("wte/weight").shape == (vocab, d)
    for name in tied.learnable_names:
        if name != "wte/weight":
            untied.set_param(name, tied.param(name))
    untied.set_param("tok/weight", tied.param("wte/weight"))
    untied.set_param("head/weight", tied.param("wte/weight"))
    untied.set_param("head/bias", np.zeros(vocab, np.float32))
    feed = tokens(tied)
    loss, loss_u = tied.forward_backward(feed), untied.forward_backward(feed)
    assert abs(loss - loss_u) < 1e-6 * loss
    both = untied.grad("tok/weight") + untied.grad("head/weight")
    np.testing.assert_allclose(tied.grad("wte/weight"), both, rtol=1e-4, atol=1e-6 * np.abs(both).max())
    for policy in ("liveness", "superneurons"):
        other = gpt(text_file, policy=policy, tied=True)
        assert other.forward_backward(feed) == loss
        np.testing.assert_array_equal(other.grad("wte/weight"), tied.grad("wte/weight"))
