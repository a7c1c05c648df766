"""Caffe's NetState: ``stage``, ``not_stage``, ``min_level`` and ``max_level`` in include and
exclude rules choose a net's layers, from --stage/--level or a solver's train_state and
test_state, with layers of the same name in different stages (as the LRCN and LSTM language
model files write them)."""

import pytest

from superneuron.cli import plan as plan_cli
from superneuron.graph import Graph
from superneuron.netfile.rules import NetState, net_states, phases_of
from superneuron.netfile.spec import load_spec, loads_spec

STAGED = """
name: staged
input: {data: [2, 6], label: [2]}
layers:
  - {name: fc, type: InnerProduct, bottom: data, top: fc, num_output: 4, include: {stage: small}}
  - {name: fc, type: InnerProduct, bottom: data, top: fc, num_output: 8, include: {stage: big}}
  - {name: drop, type: Dropout, bottom: fc, top: fc, exclude: {stage: deploy}}
  - {name: deep, type: ReLU, bottom: fc, top: fc, include: {min_level: 2}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss, include: {not_stage: deploy}}
"""


def _types(spec):
    return [(ls.name, ls.type, ls.cfg.get("num_output")) for ls in spec.layers]


@pytest.mark.parametrize("stages, level, kept", [
    (("small",), 0, [("fc", "InnerProduct", 4), ("drop", "Dropout", None), ("loss", "SoftmaxWithLoss", None)]),
    (("big",), 0, [("fc", "InnerProduct", 8), ("drop", "Dropout", None), ("loss", "SoftmaxWithLoss", None)]),
    (("big", "deploy"), 3, [("fc", "InnerProduct", 8), ("deep", "ReLU", None)]),
])
def test_stages_and_levels_choose_the_layers(stages, level, kept):
    spec = loads_spec(STAGED, "staged.yaml", states=net_states(stages, level))
    assert [(n, t, o) for n, t, o in _types(spec) if n != "data"][-len(kept):] == kept
    Graph(spec)  # and it builds: the two fc layers never meet


def test_caffes_rule_semantics():
    # StateMeetsRule: every named stage present, no not_stage present, the level within bounds
    states = net_states(("a", "b"), 1)
    assert phases_of({"stage": ["a", "b"]}, None, states) == {"TRAIN", "TEST"}
    assert phases_of({"stage": ["a", "c"]}, None, states) == set()
    assert phases_of([{"stage": "c"}, {"max_level": 1}], None, states) == {"TRAIN", "TEST"}  # any rule
    assert phases_of({"phase": "TRAIN", "min_level": 2}, None, states) == set()
    assert phases_of(None, {"not_stage": "c", "phase": "TEST"}, states) == {"TRAIN"}
    per_phase = net_states(train=NetState(0, frozenset({"train"})), test=NetState(0, frozenset()))
    assert phases_of({"stage": "train"}, None, per_phase) == {"TRAIN"}


def test_solver_train_and_test_states_choose_per_phase(tmp_path, capsys):
    net = tmp_path / "net.prototxt"
    net.write_text('''name: "lm"
input: "data" input_shape { dim: 2 dim: 6 }
input: "label" input_shape { dim: 2 }
layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc" inner_product_param { num_output: 4 }
        include { stage: "freeze" } }
layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc" inner_product_param { num_output: 4 }
        include { stage: "tune" } param { lr_mult: 0 } param { lr_mult: 0 } }
layer { name: "drop" type: "Dropout" bottom: "fc" top: "fc" include { stage: "tune" not_stage: "val" } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
layer { name: "accuracy" type: "Accuracy" bottom: "fc" bottom: "label" top: "accuracy" include { stage: "val" } }
''')
    solver = tmp_path / "solver.prototxt"
    solver.write_text('net: "net.prototxt"\nbase_lr: 0.1\nlr_policy: "fixed"\nmax_iter: 2\n'
                      'train_state { stage: "tune" }\ntest_state { stage: "tune" stage: "val" }\n')
    from superneuron.netfile.caffe.solver import solver_states
    assert solver_states(str(solver)) == ((0, frozenset({"tune"})), (0, frozenset({"tune", "val"})))
    import types

    from superneuron.cli.common import net_states_from_args
    states = net_states_from_args(types.SimpleNamespace(stage=[], level=None, solver=str(solver)))
    spec = load_spec(str(net), states=states)
    chosen = [(ls.name, sorted(ls.phases), ls.lr_mult) for ls in spec.layers if ls.type != "Input"]
    assert chosen == [("fc", ["TEST", "TRAIN"], (0.0, 0.0)), ("drop", ["TRAIN"], ()),
                      ("loss", ["TEST", "TRAIN"], ()), ("accuracy", ["TEST"], ())]
    Graph(spec)
    assert plan_cli.main(["--solver", str(solver)]) == 0
    assert plan_cli.main([str(net), "--stage", "freeze"]) == 0


def test_a_stage_that_leaves_a_bottom_unmade_is_named(tmp_path, capsys):
    net = tmp_path / "staged.yaml"
    net.write_text(STAGED)
    assert plan_cli.main([str(net), "--stage", "deploy", "--level", "2"]) == 2  # no fc for the ReLU
    err = capsys.readouterr().err
    assert "bottom 'fc' is not produced" in err and "Traceback" not in err
