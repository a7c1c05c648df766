"""Network files: expansion of the nets in nets/, --set and batch overrides, every kind of
error reported with file, line and layer (all of them at once), and the ${} evaluator.

The error and expansion tests run against a small registry of stand-in layer classes, so they
test the loader alone; the tests of nets/ use the real layers, and a layer type that stops
registering fails them (and test_every_layer_type_is_registered), never skips them."""

import collections
import pathlib
import textwrap

import pytest
from one_line import raises_one_line

import superneuron.layers as layers_module
import superneuron.layers.registry as registry_module
from superneuron.errors import SpecError
from superneuron.layers.base import Key, Layer
from superneuron.netfile.expr import ExprError, evaluate, interpolate, substitute
from superneuron.netfile.spec import load_spec, parse_overrides

ROOT = pathlib.Path(__file__).resolve().parent.parent
NETS = ROOT / "nets"


# -- stand-in layers -----------------------------------------------------------------------
def _fake(name, keys, bottoms=(1, 1), tops=(1, 1)):
    return type(name, (Layer,), {"type": name, "KEYS": keys, "BOTTOMS": bottoms, "TOPS": tops})


FAKES = {cls.type: cls for cls in [
    _fake("Input", {"shape": Key("shapes")}, (0, 0), (1, None)),
    _fake("Data", {"source": Key("str"), "batch_size": Key("int"), "size": Key("int", 28)}, (0, 0), (2, 2)),
    _fake("Convolution", {"num_output": Key("int"), "kernel_size": Key("pair"),
                          "stride": Key("pair", (1, 1)), "pad": Key("pair", (0, 0)),
                          "bias_term": Key("bool", True), "weight_filler": Key("filler", {"type": "msra"})}),
    _fake("ReLU", {}),
    _fake("Eltwise", {"operation": Key("str", "SUM", choices=("SUM", "PROD", "MAX"))}, (2, None)),
    _fake("SoftmaxWithLoss", {}, (2, 2)),
]}


@pytest.fixture
def fake(monkeypatch):
    """Use only the stand-in layers for this test."""
    monkeypatch.setattr(registry_module, "REGISTRY", dict(FAKES))  # where layer_class looks


def write(tmp_path, text, name="net.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def problems(tmp_path, text, name="net.yaml", **kw):
    """The problems reported for ``text`` (the test fails if it loads)."""
    path = write(tmp_path, text, name)
    with pytest.raises(SpecError) as info:
        load_spec(path, **kw)
    return info.value.problems


def line_of(path, needle):
    """1-based line number of the first line of the file containing ``needle``."""
    return [i + 1 for i, line in enumerate(path.read_text().splitlines()) if needle in line][0]


def pos_of(path, needle):
    """``line:col`` (1-based) where ``needle`` first occurs in the file."""
    line = line_of(path, needle)
    return f"{line}:{path.read_text().splitlines()[line - 1].index(needle) + 1}"


def one(found, *parts):
    """The single problem containing all ``parts``."""
    hits = [p for p in found if all(part in p.split(".yaml:")[-1] for part in parts)]
    assert len(hits) == 1, (parts, found)
    return hits[0]


HEAD = """
    name: t
    params: {depth: 2, width: 4}
    input: {data: [8, 3, 8, 8], label: [8]}
"""


# -- expansion -----------------------------------------------------------------------------
def test_templates_repeat_prev_and_types(fake, tmp_path):
    path = write(tmp_path, HEAD + """
    templates:
      block:
        - {name: '${name}_conv', type: Convolution, bottom: '${bottom}', top: '${name}_conv',
           num_output: '${out}', kernel_size: 3, pad: 1}
        - {name: '${name}_relu', type: ReLU, bottom: '${prev}', top: '${prev}'}
      double:
        - {use: block, with: {name: '${name}a', bottom: '${bottom}', out: '${out}'}}
        - {use: block, with: {name: '${name}b', bottom: '${prev}', out: '${out * 2}'}}
    layers:
      - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: '${width}',
         kernel_size: [3, 5]}
      - {repeat: '${depth}', as: i, use: block, with: {name: 'b${i}', bottom: '${prev}', out: '${width}'}}
      - {repeat: 2, as: j, layers: [{name: 'r${j}', type: ReLU, bottom: '${prev}', top: 'r${j}'}]}
      - {use: double, with: {name: d, bottom: '${prev}', out: 3}}
      - {repeat: 0, use: nonexistent_but_never_used}
      - {name: loss, type: SoftmaxWithLoss, bottom: ['${prev}', label], top: loss, loss_weight: 2, lr_mult: 3}
    """)
    spec = load_spec(path)
    names = [ls.name for ls in spec.layers]
    assert names == ["input", "conv1", "b0_conv", "b0_relu", "b1_conv", "b1_relu", "r0", "r1",
                     "da_conv", "da_relu", "db_conv", "db_relu", "loss"]
    by = {ls.name: ls for ls in spec.layers}
    assert by["input"].type == "Input" and by["input"].tops == ["data", "label"]
    assert by["input"].cfg == {"shape": ((8, 3, 8, 8), (8,))}
    assert by["conv1"].cfg["kernel_size"] == (3, 5) and by["conv1"].cfg["stride"] == (1, 1)
    assert by["conv1"].cfg["num_output"] == 4  # '${width}' kept its int type
    # prev chains through repeats and templates
    assert by["b0_conv"].bottoms == ["conv1"] and by["b1_conv"].bottoms == ["b0_conv"]
    assert by["b1_relu"].bottoms == by["b1_relu"].tops == ["b1_conv"]
    assert by["r0"].bottoms == ["b1_conv"] and by["r1"].bottoms == ["r0"]
    assert by["da_conv"].bottoms == ["r1"] and by["db_conv"].bottoms == ["da_conv"]
    assert by["db_conv"].cfg["num_output"] == 6
    assert by["loss"].bottoms == ["db_conv", "label"]
    assert by["loss"].loss_weight == 2.0 and by["loss"].lr_mult == (3.0,)
    # positions: a template layer points at its definition
    assert by["b0_conv"].line == by["b1_conv"].line == line_of(path, "${name}_conv'")
    assert by["conv1"].line == line_of(path, "name: conv1") and by["conv1"].file == str(path)
    assert spec.params == {"depth": 2, "width": 4} and spec.name == "t"


def test_params_in_order_and_overrides(fake, tmp_path):
    path = write(tmp_path, """
    name: 'net${depth}'
    params: {depth: 3, blocks: '${[depth] * 2}', tag: 'x${depth}'}
    input: {data: [2, 3]}
    layers:
      - {repeat: '${sum(blocks)}', as: i,
         layers: [{name: 'r${i}', type: ReLU, bottom: '${prev}', top: 'r${i}'}]}
    """)
    spec = load_spec(path)
    assert spec.params == {"depth": 3, "blocks": [3, 3], "tag": "x3"} and len(spec.layers) == 7
    spec = load_spec(path, parse_overrides(["depth=5"]))
    assert spec.name == "net5" and spec.params["blocks"] == [5, 5] and len(spec.layers) == 11
    spec = load_spec(path, parse_overrides(["blocks=[1,2,3]", "depth=4"]))
    assert spec.params["blocks"] == [1, 2, 3] and len(spec.layers) == 7


def test_parse_overrides():
    assert parse_overrides(["depth=152", "blocks=[6,32,788,6]", "lr=0.1", "ok=true", "s=abc"]) == {
        "depth": 152, "blocks": [6, 32, 788, 6], "lr": 0.1, "ok": True, "s": "abc"}
    with pytest.raises(SpecError) as info:
        parse_overrides(["depth", "=3", "x=[1,", "good=1", "2a=1"])
    assert len(info.value.problems) == 4
    assert "'depth'" in info.value.problems[0] and "NAME=VALUE" in info.value.problems[0]


def test_unknown_override(fake, tmp_path):
    found = problems(tmp_path, HEAD + "    layers: []\n", overrides={"deph": 3})
    assert "--set deph" in one(found, "deph") and "did you mean 'depth'?" in one(found, "deph")


def test_batch_override(fake, tmp_path):
    path = write(tmp_path, HEAD + "    layers: []\n")
    spec = load_spec(path, batch=3)
    assert spec.layers[0].cfg["shape"] == ((3, 3, 8, 8), (3,))
    path = write(tmp_path, """
    params: {batch: 16}
    layers:
      - {name: data, type: Data, top: [data, label], source: digits, batch_size: '${batch}'}
      - {name: r, type: ReLU, bottom: data, top: r, lr_mult: '${[batch]}'}
    """, "data.yaml")
    assert load_spec(path).layers[0].cfg["batch_size"] == 16
    spec = load_spec(path, batch=5)
    assert spec.layers[0].cfg["batch_size"] == 5 and spec.params["batch"] == 5
    assert spec.layers[1].lr_mult == (5.0,)  # the batch param itself was overridden
    with raises_one_line(SpecError):
        load_spec(path, batch=0)


# -- errors --------------------------------------------------------------------------------
def test_bad_yaml(fake, tmp_path):
    found = problems(tmp_path, HEAD + "    layers:\n      - {name: b, top: [x, y}\n", name="broken.yaml")
    path = tmp_path / "broken.yaml"
    line, col = map(int, pos_of(path, "y}").split(":"))
    assert len(found) == 1 and found[0].startswith(f"{path}:{line}:{col + 1}: invalid YAML: ")
    assert "expected ',' or ']'" in found[0]
    found = problems(tmp_path, HEAD + "    layers: []\n    layers: []\n")
    assert "duplicate key 'layers'" in found[0]


def test_missing_file(tmp_path):
    with raises_one_line(SpecError, match="cannot read"):
        load_spec(tmp_path / "nope.yaml")


def test_unknown_type_and_key_with_hints(fake, tmp_path):
    text = HEAD + """
    layers:
      - {name: conv1, type: Convolutoin, bottom: data, top: conv1}
      - {name: conv2, type: Convolution, bottom: data, top: conv2, num_output: 4,
         kernal_size: 3}
    """
    found = problems(tmp_path, text)
    path = tmp_path / "net.yaml"
    p = one(found, "conv1")
    assert p.startswith(f"{path}:{line_of(path, 'Convolutoin')}:")
    assert "layer 'conv1' (Convolutoin): unknown layer type 'Convolutoin'; did you mean 'Convolution'?" in p
    p = one(found, "kernal_size")
    # the key's own line, the column of the key, and STYLE.md's wording
    assert p.startswith(f"{path}:{pos_of(path, 'kernal_size')}: layer 'conv2' (Convolution): ")
    assert p.endswith("unknown key 'kernal_size'; did you mean 'kernel_size'?")
    assert len(found) == 2  # the misspelt required key is not reported a second time as missing


def test_bad_values_and_missing_keys(fake, tmp_path):
    text = HEAD + """
    layers:
      - {name: c1, type: Convolution, bottom: data, top: c1, num_output: x, kernel_size: 3}
      - {name: c2, type: Convolution, bottom: data, top: c2, kernel_size: [1, 2, 3]}
      - {name: c3, type: Convolution, bottom: data, top: c3, num_output: 2, kernel_size: 1,
         weight_filler: gauss}
      - {name: e1, type: Eltwise, bottom: [c1, c2], top: e1, operation: ADD}
      - {type: ReLU, bottom: c3, top: x}
      - {name: noty, bottom: c3, top: y}
      - {name: nobottom, type: ReLU, top: z}
      - {name: notop, type: ReLU, bottom: c3}
      - {name: r, type: ReLU, bottom: c3, top: r, lr_mult: fast, loss_weight: [1, 2]}
      - {name: r2, type: ReLU, bottom: [c3, 3], top: r2}
    """
    found = problems(tmp_path, text)
    path = tmp_path / "net.yaml"
    assert one(found, "'c1'").startswith(f"{path}:{line_of(path, 'name: c1')}:")
    assert "layer 'c1' (Convolution): 'num_output': expected an integer, got 'x'" in one(found, "'c1'")
    assert "'kernel_size': expected an integer or [h, w], got [1, 2, 3]" in one(found, "'c2'", "kernel")
    assert "missing required key 'num_output'" in one(found, "'c2'", "missing")
    assert "unknown filler 'gauss'" in one(found, "'c3' (")
    assert "'operation': expected one of SUM, PROD, MAX, got 'ADD'" in one(found, "'e1'")
    assert one(found, "a layer of type ReLU has no 'name'").startswith(f"{path}:{line_of(path, 'top: x')}:")
    assert "layer 'noty'" in one(found, "missing 'type'")
    assert "layer 'nobottom' (ReLU): missing 'bottom'" in one(found, "nobottom")
    assert "layer 'notop' (ReLU): missing 'top'" in one(found, "notop")
    assert "'lr_mult': expected a number or a list of numbers" in one(found, "'r' (ReLU)", "lr_mult")
    assert "'loss_weight': expected one number" in one(found, "'r' (ReLU)", "loss_weight")
    assert "'bottom': expected a name or a list of names" in one(found, "'r2'")
    assert len(found) == 12


def test_arity_and_duplicates(fake, tmp_path):
    text = HEAD + """
    layers:
      - {name: a, type: ReLU, bottom: [data, data], top: a}
      - {name: b, type: Eltwise, bottom: data, top: b}
      - {name: a, type: ReLU, bottom: data, top: [c, d]}
      - {name: i2, type: Input, bottom: data, top: e, shape: [1]}
    """
    found = problems(tmp_path, text)
    path = tmp_path / "net.yaml"
    assert "layer 'a' (ReLU): expects 1 bottom, got 2" in one(found, "expects 1 bottom")
    assert "layer 'b' (Eltwise): expects at least 2 bottoms, got 1" in one(found, "'b'")
    dup = one(found, "duplicate")
    assert dup.startswith(f"{path}:{line_of(path, 'top: [c, d]')}:")
    assert f"duplicate layer name 'a' (first used at line {line_of(path, 'name: a')})" in dup
    assert "expects 1 top, got 2" in one(found, "top, got")
    assert "layer 'i2' (Input): expects 0 bottoms, got 1" in one(found, "'i2'")
    assert len(found) == 5


def test_structure_errors(fake, tmp_path):
    found = problems(tmp_path, """
    params: {depth: 2}
    layrs: []
    """)
    assert "unknown top-level key 'layrs'; did you mean 'layers'?" in one(found, "layrs")
    assert "no 'layers:'" in one(found, "no 'layers")
    found = problems(tmp_path, "layers:\n  - {name: r, type: ReLU, bottom: x, top: y}\n")
    assert "no input" in one(found, "no input")
    found = problems(tmp_path, "- just a list\n")
    assert "expected a mapping" in found[0]


def test_repeat_and_template_errors(fake, tmp_path):
    text = HEAD + """
    templates:
      loop1: [{use: loop2}]
      loop2: [{use: loop1}]
      conv:
        - {name: '${name}', type: Convolution, bottom: '${prev}', top: '${name}', num_output: 2,
           kernel_size: '${k}', strid: 1}
    layers:
      - {repeat: -1, use: conv}
      - {repeat: 1.5, use: conv}
      - {repeat: 2, as: '1x', use: conv}
      - {use: cnv, with: {name: a}}
      - {use: loop1}
      - {repeat: 2, as: i, use: conv, with: {name: 'c${i}', k: '${i + 1}'}, extra: 1}
      - {use: conv, with: {name: c9}}
    """
    found = problems(tmp_path, text)
    path = tmp_path / "net.yaml"
    assert "repeat: expected a non-negative integer, got -1" in one(found, "got -1")
    assert "repeat: expected a non-negative integer, got 1.5" in one(found, "got 1.5")
    assert "'as': expected a plain name" in one(found, "'as'")
    assert "unknown template 'cnv'; did you mean 'conv'?" in one(found, "cnv")
    assert "template 'loop1' uses itself (loop1 → loop2 → loop1)" in one(found, "uses itself")
    assert "unknown key 'extra' in 'repeat:'" in one(found, "extra")
    # an error inside a template: the template's line, the layer, and where it was used
    use_line = line_of(path, "as: i, use: conv")
    for i in (0, 1):
        p = one(found, f"layer 'c{i}'", "strid")
        assert p.startswith(f"{path}:{line_of(path, 'strid: 1')}:")
        assert p.endswith("unknown key 'strid'; did you mean 'stride'? "
                          f"(in template 'conv' used at line {use_line})")
    p = one(found, "'c9'", "'k'")
    assert "'kernel_size': undefined name 'k' in '${k}'" in p
    assert p.startswith(f"{path}:{line_of(path, 'kernel_size:')}:")
    assert f"used at line {line_of(path, 'name: c9')}" in p


def test_expression_errors_point_at_the_value(fake, tmp_path):
    text = HEAD + """
    layers:
      - {name: c1, type: Convolution, bottom: data, top: c1, num_output: '${widht * 2}', kernel_size: 1}
      - {name: 'c${depth}', type: Convolution, bottom: c1, top: c2, num_output: 1,
         kernel_size: '${__import__("os")}'}
      - {name: c3, type: Convolution, bottom: c1, top: c3, num_output: '${width.real}', kernel_size: 1}
      - {name: c4, type: Convolution, bottom: c1, top: c4, num_output: '${1 +}', kernel_size: 1}
      - {name: c5, type: Convolution, bottom: c1, top: c5, num_output: '${width // 0}', kernel_size: 1}
      - {name: c6, type: Convolution, bottom: '${nope}', top: c6, num_output: 1, kernel_size: 1}
    """
    found = problems(tmp_path, text)
    path = tmp_path / "net.yaml"
    p = one(found, "'c1'")
    assert p.startswith(f"{path}:{line_of(path, 'widht')}:")
    assert "layer 'c1' (Convolution): 'num_output': undefined name 'widht' in '${widht * 2}'" in p
    p = one(found, "'c2'")
    assert p.startswith(f"{path}:{line_of(path, '__import__')}:")
    assert "call of '__import__' is not allowed" in p
    assert "attribute access is not allowed in '${width.real}'" in one(found, "'c3'")
    assert "invalid expression '${1 +}'" in one(found, "'c4'")
    assert "by zero" in one(found, "'c5'")
    assert "'bottom': undefined name 'nope'" in one(found, "'c6'")  # and no arity complaint
    assert len(found) == 6


def test_param_errors_stop_before_layers(fake, tmp_path):
    found = problems(tmp_path, """
    params: {a: 1, b: '${a + c}', d: '${[1, 2][5]}'}
    input: {data: [1]}
    layers:
      - {name: r, type: ReLU, bottom: data, top: r, bogus: 1}
    """)
    assert "parameter 'b': undefined name 'c' in '${a + c}'" in one(found, "'b'")
    assert "parameter 'd'" in one(found, "'d'") and "IndexError" in one(found, "'d'")
    assert len(found) == 2  # layers are not looked at while the params are wrong
    found = problems(tmp_path, HEAD + "    layers: []\n", overrides={"depth": "${nope}"})
    assert "parameter 'depth' (from --set): undefined name 'nope'" in found[0]


def test_many_errors_reported_at_once(fake, tmp_path):
    lines = [f"      - {{name: r{i}, type: ReLU, bottom: data, top: r{i}, bad{i}: 1}}" for i in range(7)]
    found = problems(tmp_path, HEAD + "    layers:\n" + "\n".join(lines) + "\n")
    path = tmp_path / "net.yaml"
    assert len(found) == 7
    for i in range(7):
        assert one(found, f"'bad{i}'").startswith(f"{path}:{line_of(path, f'bad{i}')}:")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(info.value).count("\n") == 6  # one line per problem


def test_repeated_errors_are_capped(fake, tmp_path):
    found = problems(tmp_path, HEAD + """
    layers:
      - {repeat: 500, as: i, layers: [{name: 'r${i}', type: ReLU, bottom: data, top: 'r${i}', oops: 1}]}
    """)
    assert len(found) == 101 and found[-1].startswith("... and 400 more problems")


# -- the ${} evaluator ---------------------------------------------------------------------
def test_evaluate_keeps_types():
    env = {"d": 50, "w": 2.5, "blocks": [3, 4, 6, 3], "s": "res", "flag": True}
    assert evaluate("d + 1", env) == 51 and isinstance(evaluate("d // 3", env), int)
    assert evaluate("w * 2", env) == 5.0 and evaluate("d / 4", env) == 12.5
    assert evaluate("2 ** 10 % 1000", env) == 24
    assert evaluate("blocks[2] + sum(blocks)", env) == 22
    assert evaluate("blocks[1:3]", env) == [4, 6]
    assert evaluate("{18: [2, 2], 50: [3, 4]}[d]", env) == [3, 4]
    assert evaluate("'a' if d > 18 and not flag or d in [50, 101] else 'b'", env) == "a"
    assert evaluate("1 < d <= 50 != 51", env) is True
    # 7 + 2 + 3 + 3 + 4 + 2
    assert evaluate("min(d, 7) + max(1, 2) + abs(-3) + len(s) + int('4') + int(float('2.5'))", env) == 21
    assert evaluate("range(3)", env) == [0, 1, 2]
    assert evaluate("s + str(d)", env) == "res50"
    assert evaluate("d == 50 or undefined_is_never_evaluated", env) is True


@pytest.mark.parametrize("src, message", [
    ("x + 1", "undefined name 'x' in '${x + 1}'"),
    ("s.upper()", "attribute access is not allowed"),
    ("(lambda: 1)()", "is not allowed"),
    ("[i for i in range(3)]", "a comprehension is not allowed"),
    ("open('f')", "call of 'open' is not allowed"),
    ("__import__('os')", "call of '__import__' is not allowed"),
    ("min(*[1, 2])", "positional arguments only"),
    ("max(1, key=abs)", "positional arguments only"),
    ("1 << 2", "'<<' is not allowed"),
    ("2 ** 100000", "over the limit of 4 096 bits (MAX_INT_BITS)"),
    ("range(10 ** 9)", "over the limit of 1 000 000 items (MAX_EXPR_SIZE)"),
    ("'a' * 10 ** 9", "(MAX_EXPR_SIZE)"),
    ("{1, 2}", "a set is not allowed"),
    ("1 is 1", "'is' is not allowed"),
    ("(y := 2)", "':=' is not allowed"),
    ("[1][3]", "IndexError"),
    ("1 +", "invalid expression"),
    ("len", "function 'len' must be called"),
])
def test_evaluate_rejects(src, message):
    with pytest.raises(ExprError) as info:
        evaluate(src, {"s": "abc"})
    assert message in str(info.value) and "${" in str(info.value)


def test_interpolate_and_substitute():
    env = {"i": 3, "n": [1, 2], "name": "res"}
    assert interpolate("${i}", env) == 3
    assert interpolate("${n}", env) == [1, 2]
    assert interpolate("${(1, 2)}", env) == [1, 2]      # tuples come out as YAML lists
    assert interpolate("${i > 2}", env) is True
    assert interpolate("b${i}_${i * 2}", env) == "b3_6"  # inside text: str()
    assert interpolate("${name}${'a' if i == 0 else 'b' + str(i)}", env) == "resb3"
    assert interpolate("${ {'k': '}'}['k'] }", env) == "}"  # braces in dicts and strings
    assert interpolate("no expressions", env) == "no expressions"
    assert substitute({"a": ["${i}", {"b": "x${i}"}], "c": 1.5}, env) == {"a": [3, {"b": "x3"}], "c": 1.5}
    with pytest.raises(ExprError, match="unclosed"):
        interpolate("${i", env)


# -- the networks in nets/ -----------------------------------------------------------------
# Every layer type the project provides (DESIGN.md's contract list, Caffe's model-zoo and shape
# layers, and the Split the graph inserts at fan-out). A class whose module stops importing or
# whose @register is lost fails here by name, and the nets' tests below fail with it.
LAYER_TYPES = {"Input", "Data", "Convolution", "Deconvolution", "Pooling", "InnerProduct", "ReLU",
               "Dropout", "BatchNorm", "Scale", "LRN", "Eltwise", "Concat", "Split", "Slice", "Flatten",
               "Reshape", "Silence", "ArgMax", "Softmax", "SoftmaxWithLoss", "Accuracy", "EuclideanLoss",
               "SigmoidCrossEntropyLoss", "Sigmoid", "TanH", "ELU", "PReLU", "Power", "AbsVal", "BNLL"}


def test_every_layer_type_is_registered():
    missing = sorted(LAYER_TYPES - set(layers_module.REGISTRY))
    assert not missing, f"layer types not registered: {', '.join(missing)}"
    for name in LAYER_TYPES:
        assert layers_module.layer_class(name).type == name


def test_every_net_file_uses_registered_types():
    """Each file in nets/ and tests/nets/ names only registered types (its own check, so a
    missing type is named here even if the loader's error changes)."""
    import yaml
    files = sorted(NETS.glob("*.yaml")) + sorted((ROOT / "tests" / "nets").glob("*.yaml"))
    assert len(files) >= 10, files
    for path in files:
        doc = yaml.safe_load(path.read_text())
        layers = doc["layers"] if isinstance(doc, dict) else []
        for layer in layers:
            if isinstance(layer, dict) and "type" in layer and "${" not in str(layer["type"]):
                assert layer["type"] in layers_module.REGISTRY, (path.name, layer["type"])


def counts(spec):
    return collections.Counter(ls.type for ls in spec.layers)


@pytest.mark.parametrize("depth, convs, blocks, bottleneck", [
    (18, 1 + 2 * 8 + 3, [2, 2, 2, 2], False),       # 3 projections: stages 3-5 change shape
    (34, 1 + 2 * 16 + 3, [3, 4, 6, 3], False),
    (50, 1 + 3 * 16 + 4, [3, 4, 6, 3], True),        # = 53: a projection on every stage
    (101, 1 + 3 * 33 + 4, [3, 4, 23, 3], True),
    (152, 1 + 3 * 50 + 4, [3, 8, 36, 3], True),
    (200, 1 + 3 * 66 + 4, [3, 8, 52, 3], True),      # 3n+2: stage 3 = 198/3 - 14 = 52
])
def test_resnet_depths(depth, convs, blocks, bottleneck):
    spec = load_spec(NETS / "resnet.yaml", {"depth": depth})
    c = counts(spec)
    assert spec.params["blocks"] == blocks and spec.name == f"resnet{depth}"
    assert c["Convolution"] == convs and c["BatchNorm"] == c["Scale"] == convs
    assert c["Eltwise"] == sum(blocks) and c["InnerProduct"] == 1 and c["SoftmaxWithLoss"] == 1
    assert c["Pooling"] == 2
    names = {ls.name: ls for ls in spec.layers}
    assert ("res2a_branch1" in names) == bottleneck and "res3a_branch1" in names
    assert names["res3a_branch1"].cfg["stride"] == (2, 2)
    assert names["fc"].cfg["num_output"] == 1000
    assert spec.layers[0].cfg["shape"] == ((32, 3, 224, 224), (32,))
    for ls in spec.layers:
        if ls.type in ("BatchNorm", "Scale", "ReLU"):  # Caffe's layout: all on one blob
            assert ls.tops == ls.bottoms
        if ls.type == "Eltwise":
            assert len(ls.bottoms) == 2


def test_resnet_blocks_override_and_bad_depth():
    spec = load_spec(NETS / "resnet.yaml", parse_overrides(["blocks=[6,32,788,6]"]), batch=2)
    assert spec.name == "resnet2498" and counts(spec)["Convolution"] == 1 + 3 * 832 + 4
    assert spec.layers[0].cfg["shape"] == ((2, 3, 224, 224), (2,))
    with raises_one_line(SpecError, match="depth must be 18, 34, or 3n"):
        load_spec(NETS / "resnet.yaml", {"depth": 51})


@pytest.mark.parametrize("depth", [20, 56, 110])
def test_resnet_cifar(depth):
    n = (depth - 2) // 6
    spec = load_spec(NETS / "resnet_cifar.yaml", {"depth": depth})
    c = counts(spec)
    assert c["Convolution"] == 6 * n + 1 + 2 and c["Eltwise"] == 3 * n and c["InnerProduct"] == 1
    assert spec.layers[0].cfg["shape"] == ((128, 3, 32, 32), (128,))
    with raises_one_line(SpecError, match="6n\\+2"):
        load_spec(NETS / "resnet_cifar.yaml", {"depth": 21})


@pytest.mark.parametrize("net, expect", [
    ("lenet", {"Data": 1, "Convolution": 2, "Pooling": 2, "InnerProduct": 2, "ReLU": 3,
               "SoftmaxWithLoss": 1, "Accuracy": 1}),
    ("alexnet", {"Input": 1, "Convolution": 5, "LRN": 2, "Pooling": 3, "InnerProduct": 3,
                 "Dropout": 2, "ReLU": 7, "SoftmaxWithLoss": 1}),
    ("vgg16", {"Input": 1, "Convolution": 13, "Pooling": 5, "InnerProduct": 3, "ReLU": 15}),
    # 3 stem convolutions and 6 per Inception block
    ("googlenet", {"Input": 1, "Convolution": 3 + 6 * 9, "Concat": 9, "LRN": 2, "InnerProduct": 1}),
])
def test_other_nets(net, expect):
    spec = load_spec(NETS / f"{net}.yaml")
    c = counts(spec)
    assert {k: c[k] for k in expect} == expect
    assert spec.name == net


def test_lenet_batch():
    spec = load_spec(NETS / "lenet.yaml", batch=16)
    data = spec.layers[0]
    assert data.type == "Data" and data.cfg["batch_size"] == 16 and data.cfg["source"] == "digits"
    assert data.cfg["size"] == 32 and data.cfg["crop"] == 28 and data.tops == ["data", "label"]


def test_tiny_fixture():
    spec = load_spec(ROOT / "tests" / "nets" / "tiny.yaml")
    assert [ls.type for ls in spec.layers][:2] == ["Input", "Convolution"]


@pytest.mark.parametrize("net, overrides", [
    ("lenet", {}), ("alexnet", {}), ("vgg16", {}), ("googlenet", {}),
    ("resnet", {"depth": 18}), ("resnet", {"depth": 152}), ("resnet_cifar", {"depth": 20}),
    ("../tests/nets/tiny", {}),
])
def test_nets_build_a_graph(net, overrides):
    """Shapes, in-place requests and arities of every net pass the graph's checks."""
    from superneuron.graph import Graph
    spec = load_spec(NETS / f"{net}.yaml", overrides, batch=2)
    graph = Graph(spec)
    last = {n.name: n for n in graph.nodes}
    fc = [n for n in graph.nodes if n.layer.type == "InnerProduct"][-1]
    assert graph.tensors[fc.tops[0]].shape == (2, spec.params["classes"])
    assert last["loss"].loss_weight == 1.0
