"""Plan equals run, measured from outside the Runtime.

The Runtime's Arena makes the Simulator's calls, so comparing their counters proves only that
they agree with each other. Here a witness (kernel_trace.py) records every array the run hands
to a layer's kernel, with its offset in the one block they are all views of, and from those
alone finds the highest byte used, the bytes alive at each kernel call, and whether every read
sees what was written. Those are compared with the Simulator's plan (DESIGN.md invariants 2
and 3: plan equals run; every tensor on the device is a view into the arena, the resident
region first). Under gist the Encode and Decode kernels are witnessed too: each encoded form
is read as its Encode wrote it, and each Decode gives back what its form kept."""

import pytest
from kernel_trace import ALIGN, KernelTrace
from test_encode import RELU_POOL
from test_memory_passes import CAFFE_CHAIN, CHAIN
from test_net import SMALL, feed_for

from superneuron import load_net
from superneuron.net import Net
from superneuron.netfile.spec import loads_spec
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig

TINY = "tests/nets/tiny.yaml"  # in-place BatchNorm and ReLU, Dropout, Concat, Eltwise, fan-out
TEXTS = {"chain": CHAIN,               # conv → BatchNorm → Scale → ReLU blocks: BatchNorm recomputed
         "caffe_chain": CAFFE_CHAIN,   # the same all in place, as Caffe writes it, and Dropout in place
         "relu_pool": RELU_POOL,       # conv → ReLU → max pooling twice: gist's argmaxes and sign masks
         # the same with leaky ReLUs: their signs in the tensor form, decoded before their backward
         "leaky_relu_pool": RELU_POOL.replace("type: ReLU,", "type: ReLU, negative_slope: 0.1,")}

CASES = ([(TINY, p, pl) for p in ("baseline", "liveness", "recompute", "offload", "superneurons",
                                   "liveness+params", "superneurons+params") for pl in ("dynamic", "planned")]
         + [("chain", p, "dynamic") for p in ("recompute", "superneurons")]
         + [("caffe_chain", p, "planned") for p in ("liveness", "recompute", "offload", "superneurons")]
         + [("nets/lenet.yaml", p, "dynamic") for p in ("liveness", "recompute", "offload")]
         + [("nets/resnet_cifar.yaml", p, "planned") for p in ("recompute", "superneurons")]
         + [(TINY, p, pl) for p in ("gist", "gist+params") for pl in ("dynamic", "planned")]
         + [(c, "gist", "dynamic") for c in ("chain", "relu_pool", "leaky_relu_pool")])


def traced_run(monkeypatch, case, policy, placement):
    """Build ``case`` (a net file, or a key of TEXTS) under ``policy`` and run one traced
    forward and backward; ``(net, trace)``."""
    if case in TEXTS:
        net = Net(loads_spec(TEXTS[case]), policy=policy, placement=placement)
    else:
        net = load_net(case, overrides=dict(SMALL.get(case, {})), batch=1, policy=policy, placement=placement)
    trace = KernelTrace(net, resident_params="+params" not in policy)
    with monkeypatch.context() as m:
        trace.install(m)
        net.forward_backward(feed_for(net))
    return net, trace


@pytest.mark.parametrize("case, policy, placement", CASES)
def test_what_the_kernels_touched_is_what_the_plan_said(monkeypatch, case, policy, placement):
    net, trace = traced_run(monkeypatch, case, policy, placement)
    plan = net.plans["train"]
    kinds = {(c.node.layer.type, c.phase) for c in trace.calls if c.node is not None}
    assert len(trace.calls) >= len(net.graph.nodes) and ("Convolution", "backward") in kinds

    # every activation, gradient, workspace and parameter handed to a kernel is a view of one
    # block: the arena, of the size the plan asked for
    base = trace.locate()
    assert base.nbytes == net.arena_bytes == max(p.arena_bytes for p in net.plans.values())
    assert any(op.role == "workspace" for c in trace.calls for op in c.operands)
    if "+params" not in policy:  # resident region first, scheduled tensors above it
        resident_end, scheduled_start = trace.resident_extent()
        assert 0 < resident_end <= scheduled_start

    # the highest byte a kernel touched is the top of the plan's arena (up to its alignment)
    assert plan.arena_bytes - ALIGN < trace.high_water <= plan.arena_bytes

    # bytes alive at each kernel call, from first touch to last: with no copies to hide
    # anything, liveness frees each value right after its last use, so the plan's peak is
    # exactly that; baseline keeps everything, so the plan's peak is above it
    live = trace.live_peak()
    if policy in ("liveness", "recompute"):
        assert live == plan.peak_bytes
    elif policy == "baseline":
        assert live < plan.peak_bytes
    assert net.peak_bytes == plan.peak_bytes

    # no two values in one kernel's operands share bytes (but an in-place pair); every read
    # saw the bytes last written under its name (so nothing was freed early, overwritten or
    # read before its copy landed); every recompute wrote what the forward wrote and left
    # parameters and statistics alone
    assert trace.clashes() == []
    assert trace.violations == []
    assert trace.unchecked_reads == {f"{n.tops[0]}.grad" for n in net.graph.losses}


def test_recompute_is_witnessed_for_dropout_and_batchnorm(monkeypatch):
    """The recompute checks above have something to check: the chains recompute a BatchNorm
    and an in-place Dropout, and a Scale with the ReLU after it in its pass, and a BatchNorm
    with its Scale and that ReLU in its own (fuse.py)."""
    for case, kinds, fused in (("chain", {"BatchNorm", "Scale"}, {"Scale", "BatchNorm"}),
                               ("caffe_chain", {"Dropout", "Scale"}, {"Scale"})):
        net, trace = traced_run(monkeypatch, case, "recompute", "dynamic")
        recomputed = {c.node.layer.type for c in trace.calls if c.phase == "recompute"}
        assert kinds <= recomputed, (case, recomputed)
        schedule = net.schedules["train"]
        graph = schedule.graph
        assert {graph.nodes[s.node].layer.type for s in schedule.steps if s.fused is not None} == fused


def test_the_witness_sees_a_value_overwritten_before_its_last_read(monkeypatch):
    """Control: clobber one activation between its forward and the backward that reads it,
    as a liveness pass freeing it early would; the witness names the read."""
    net = load_net(TINY, policy="liveness")
    trace = KernelTrace(net)
    pool = net.graph.node("pool")
    cls = type(pool.layer)
    with monkeypatch.context() as m:
        trace.install(m)
        traced = cls.backward

        def clobber(layer, ctx, bottoms, *rest):
            if layer is pool.layer:
                bottoms[0][...] += 1
            return traced(layer, ctx, bottoms, *rest)

        m.setattr(cls, "backward", clobber)
        net.forward_backward(feed_for(net))
    assert any(v.startswith("backward(pool)#") and "'concat' is not what was written" in v
               for v in trace.violations), trace.violations


@pytest.mark.parametrize("policy", ["baseline", "liveness", "recompute", "offload", "superneurons",
                                    "superneurons+params"])
def test_each_round_of_an_iter_size_iteration_touches_what_the_plan_said(monkeypatch, policy):
    """iter_size 3: the iteration runs its steps three times, one batch each, from an empty
    arena; the kernels' operands stay within the one arena the plan sized (accumulators
    included), no two clash, every read sees what was written under its name in its round
    (a value of one round is never read in the next), and the run's peak is the plan's."""
    optimizer = make_optimizer(SolverConfig(iter_size=3))
    net = load_net(TINY, batch=1, policy=policy, optimizer=optimizer)
    trace = KernelTrace(net, resident_params="+params" not in policy)
    with monkeypatch.context() as m:
        trace.install(m)
        net.train_step([feed_for(net, seed=k) for k in range(3)], 0)
    plan = net.plans["train"]
    assert [c.phase for c in trace.calls if c.node.name == "conv1"] == ["forward", "backward"] * 3
    base = trace.locate()
    assert base.nbytes == net.arena_bytes == max(p.arena_bytes for p in net.plans.values())
    assert plan.arena_bytes - ALIGN < trace.high_water <= plan.arena_bytes
    assert net.peak_bytes == plan.peak_bytes
    assert trace.clashes() == []
    assert trace.violations == []


@pytest.mark.parametrize("case, signs", [
    ("relu_pool", {("forward", "relu1#sign"), ("backward", "relu1#sign"), ("backward", "relu2#sign")}),
    ("leaky_relu_pool", {("encode", "conv1@relu1#sign"), ("decode", "conv1@relu1#sign"),
                         ("decode", "conv2@relu2#sign")}),
])
def test_the_witness_sees_every_encode_and_decode(monkeypatch, case, signs):
    """Under gist, the witness records the pool and ReLU forwards that write their own forms
    (argmax, signs) and the backwards that read them, the tensor forms' Encodes and each
    Decode, with the forms' bytes in the arena like any operand."""
    net, trace = traced_run(monkeypatch, case, "gist", "dynamic")
    done = {(c.phase, op.name) for c in trace.calls for op in c.operands if op.role == "encoded"}
    assert {("forward", "pool1#argmax"), ("backward", "pool1#argmax")} | signs <= done
    assert trace.locate().nbytes == net.arena_bytes  # the forms are views of the arena too
    assert trace.violations == [] and trace.clashes() == []
    assert trace.high_water <= net.plans["train"].arena_bytes


@pytest.mark.parametrize("case, form, phase", [("leaky_relu_pool", "conv1@relu1#sign", "decode"),
                                               ("relu_pool", "pool1#argmax", "backward"),
                                               ("relu_pool", "relu1#sign", "backward")])
def test_the_witness_sees_an_encoded_form_overwritten_before_it_is_read(monkeypatch, case, form, phase):
    """Control: clobber one encoded form between its Encode and its reader (a Decode, or the
    pool or ReLU backward that reads its own form), as a liveness pass freeing it early and
    another tensor taking its bytes would; the witness names the read."""
    from superneuron.layers import codecs
    net = Net(loads_spec(TEXTS[case]), policy="gist")
    trace = KernelTrace(net)
    with monkeypatch.context() as m:
        trace.install(m)
        if phase == "decode":
            traced = codecs.decode

            def clobber(ctx, codec, encoded, x):
                if trace._decoded_name(encoded) == form.split("#")[0]:
                    encoded[...] = ~encoded
                return traced(ctx, codec, encoded, x)

            m.setattr(codecs, "decode", clobber)
        else:
            owner = net.graph.node(form.split("#")[0]).layer  # the layer whose backward reads it
            layer_type = type(owner)
            traced = layer_type.backward

            def clobber(layer, ctx, *rest):
                if ctx.encoded is not None and layer is owner:
                    ctx.encoded[...] += 1
                return traced(layer, ctx, *rest)

            m.setattr(layer_type, "backward", clobber)
        net.forward_backward(feed_for(net))
    assert any(v.startswith(f"{phase}(") and f"'{form}' is not what was written" in v
               for v in trace.violations), trace.violations


def test_the_witness_sees_a_decode_that_gives_back_other_signs(monkeypatch):
    """Control: a sign decoder that gets one value's sign wrong; the witness names the Decode."""
    from superneuron.layers import codecs
    net = Net(loads_spec(TEXTS["leaky_relu_pool"]), policy="gist")
    trace = KernelTrace(net)
    decode = codecs.decode

    def wrong(ctx, codec, encoded, x):
        decode(ctx, codec, encoded, x)
        x.reshape(-1)[0] = 1.0 - x.reshape(-1)[0]

    with monkeypatch.context() as m:
        m.setattr(codecs, "decode", wrong)  # the kernel the witness wraps
        trace.install(m)
        net.forward_backward(feed_for(net))
    assert any(v.startswith("decode(") and "'conv1@relu1' decoded is not what 'conv1@relu1#sign' kept" in v
               for v in trace.violations), trace.violations
