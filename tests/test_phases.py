"""Caffe's train_val habits: include/exclude phases, one name for a TRAIN and a TEST Data
layer, per-blob ``param:`` blocks (lr_mult 0 freezes a blob)."""

import numpy as np
import pytest
from one_line import one_line, raises_one_line

from superneuron.errors import SpecError
from superneuron.graph import Graph
from superneuron.net import Net
from superneuron.netfile.spec import load_spec, loads_spec
from superneuron.scheduler.lower import lower
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig

TRAIN_VAL = "tests/nets/train_val.yaml"


def layer_names(schedule, kind):
    return [schedule.graph.nodes[s.node].name for s in schedule.steps if s.kind == kind]


def test_phases_decide_which_layers_run_in_training_and_testing():
    spec = load_spec(TRAIN_VAL)
    phases = {(ls.name, ls.type): ls.phases for ls in spec.layers}
    assert [ls.phases for ls in spec.layers if ls.name == "data"] == [{"TRAIN"}, {"TEST"}]
    assert phases["accuracy", "Accuracy"] == {"TEST"} and phases["drop1", "Dropout"] == {"TRAIN"}
    assert phases["fc", "InnerProduct"] == {"TRAIN", "TEST"}
    g = Graph(spec)
    assert [n.name for n in g.nodes if n.layer.type == "Data"] == ["data"]  # the TRAIN one
    assert not g.node("accuracy").backward
    train, test = lower(g), lower(g, train=False)
    assert "accuracy" not in layer_names(train, "forward") and "drop1" in layer_names(train, "forward")
    assert "accuracy" in layer_names(test, "forward") and "drop1" not in layer_names(test, "forward")
    assert "accuracy" not in layer_names(train, "backward")


def test_lr_mult_zero_freezes_a_blob_and_param_blocks_set_the_mults():
    spec = load_spec(TRAIN_VAL)
    g = Graph(spec)
    specs = g.node("fc").param_specs
    assert (specs["weight"].lr_mult, specs["bias"].lr_mult, specs["bias"].decay_mult) == (1.0, 2.0, 0.0)
    net = Net(spec, optimizer=make_optimizer(SolverConfig(base_lr=0.1, momentum=0.9)))
    before = {n: net.param(n) for n in net.learnable_names}
    rng = np.random.default_rng(0)
    feed = {"data": rng.standard_normal(net.input_shape("data")).astype(np.float32),
            "label": rng.integers(0, 10, net.input_shape("label")).astype(np.float32)}
    for it in range(2):
        loss = net.train_step(feed, it)
    assert np.isfinite(loss) and "accuracy" not in net.outputs
    for name in ("conv1/weight", "conv1/bias"):
        np.testing.assert_array_equal(net.param(name), before[name])
    assert not np.array_equal(net.param("fc/weight"), before["fc/weight"])
    outputs = net.forward(feed)  # the test phase: its Accuracy runs, the Dropout does not
    assert 0.0 <= outputs["accuracy"] <= 1.0 and "drop1" not in outputs


HEAD = "input: {data: [2, 3], label: [2]}\nlayers:\n"


@pytest.mark.parametrize("layers, message", [
    ("- {name: a, type: InnerProduct, bottom: data, top: a, num_output: 2}\n"
     "- {name: a, type: InnerProduct, bottom: data, top: b, num_output: 2, include: {phase: TRAIN}}\n",
     "duplicate layer name 'a' (first used at line 3)"),
    ("- {name: a, type: ReLU, bottom: data, top: a, include: {phase: VAL}}\n",
     "'include': phase must be TRAIN or TEST, got 'VAL'"),
    ("- {name: a, type: ReLU, bottom: data, top: a, include: {stage: [deploy, 3]}}\n",
     "'include': stage must be a name or a list of names"),
    ("- {name: a, type: ReLU, bottom: data, top: a, include: {stages: deploy}}\n",
     "'include': expected rules such as {phase: TRAIN} or {stage: deploy}"),
    ("- {name: a, type: ReLU, bottom: data, top: a, include: {phase: TEST}, exclude: {phase: TEST}}\n",
     "runs in no phase"),
    ("- {name: a, type: InnerProduct, bottom: data, top: a, num_output: 2, param: [{lr_mul: 1}]}\n",
     "'param': expected a list of {lr_mult: x, decay_mult: y}"),
    ("- {name: a, type: InnerProduct, bottom: data, top: a, num_output: 2, param: [{name: w}]}\n",
     "shared parameters (param name) are not supported"),
    ("- {name: a, type: InnerProduct, bottom: data, top: a, num_output: 2, param: [{lr_mult: 1}], "
     "lr_mult: [1]}\n", "write either 'param:' blocks or 'lr_mult'/'decay_mult', not both"),
])
def test_phase_and_param_errors_name_the_line_and_layer(layers, message):
    with raises_one_line(SpecError) as e:
        loads_spec(HEAD + layers, "net.yaml")
    text = one_line(str(e.value))
    assert message in text and text.startswith("net.yaml:"), text


def test_the_test_forward_of_a_train_val_net_reads_the_feed():
    """The TEST Data layer gives way to the TRAIN one, whose step then runs in both phases: a
    test forward reads what it is fed, not what an earlier step left in the arena (it once ran
    on whatever memory held, and two forwards of one feed differed)."""
    net = Net(load_spec(TRAIN_VAL), seed=1)
    rng = np.random.default_rng(0)
    feed = {}
    for name in net.input_names:
        shape = net.input_shape(name)
        feed[name] = (rng.integers(0, 2, shape) if len(shape) == 1 else rng.standard_normal(shape)).astype(np.float32)
    net.forward_backward({k: v * 3 for k, v in feed.items()})  # leaves other values in the arena
    first = dict(net.forward(feed, train=False))
    np.testing.assert_array_equal(net.blob(net.input_names[0]), feed[net.input_names[0]])
    net.forward({k: np.zeros_like(v) for k, v in feed.items()}, train=False)
    assert net.forward(feed, train=False) == first
