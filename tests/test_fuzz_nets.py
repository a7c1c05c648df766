"""Fuzz: generated network files and ``${}`` expressions. Every mutation of the repository's nets
(hostile values in any key, keys missing or unknown, dangling bottoms, cycles, duplicates, deep
nesting, repeats and templates that explode, YAML aliases, bytes that are not text, cut files)
must end, within its time, in a clean error (status 2, one line per problem) or a correct plan;
every generated expression in a value or an ExprError. See fuzz_helpers for the judge."""

import copy
import os

import pytest
import yaml
from fuzz_helpers import HOSTILE, assert_clean, guard, rng, run_main

from superneuron.cli.plan import main as plan_main
from superneuron.cli.train import main as train_main
from superneuron.netfile.expr import ExprError, evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASES = ["tests/nets/tiny.yaml", "tests/nets/shape.yaml", "tests/nets/neuron.yaml", "tests/nets/train_val.yaml",
         "tests/nets/digits_bn.yaml", "nets/lenet.yaml", "nets/alexnet.yaml", "nets/resnet_cifar.yaml"]
KEYS = ["num_output", "kernel_size", "pad", "stride", "bottom", "top", "name", "type", "shape", "group",
        "axis", "slice_point", "dropout_ratio", "weight_filler", "bias_filler", "loss_weight", "lr_mult",
        "include", "param", "batch_size", "size", "crop", "samples", "classes", "channels", "source",
        "kernel_h", "pad_w", "dilation", "global_pooling", "pool", "operation", "coeff", "top_k",
        "local_size", "negative_slope", "num_axes", "moving_average_fraction", "mean", "std", "scale"]
TYPES = ["Convolution", "Pooling", "InnerProduct", "ReLU", "BatchNorm", "Scale", "Dropout", "LRN", "Eltwise",
         "Concat", "Split", "Slice", "Flatten", "Reshape", "Silence", "ArgMax", "Softmax", "SoftmaxWithLoss",
         "Accuracy", "EuclideanLoss", "Data", "Input", "Deconvolution", "PReLU", "Power", "Convolutoin", ""]


def _load(base):
    with open(os.path.join(ROOT, base)) as f:
        return yaml.safe_load(f)


def _dump(doc):
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=4096, allow_unicode=True)


def _layers(doc):
    """The plain layer mappings of a file (not repeats or template uses)."""
    return [item for item in doc.get("layers", []) if isinstance(item, dict) and "type" in item]


# -- mutations: each takes (doc, r), changes doc or returns the text, and says what it did ---------
def set_key(doc, r):
    layer = r.choice(_layers(doc))
    key, value = r.choice(KEYS + list(layer)), copy.deepcopy(r.choice(HOSTILE))
    layer[key] = value
    return f"{layer.get('name')}.{key}={str(value)[:30]}"


def drop_key(doc, r):
    layer = r.choice(_layers(doc))
    key = r.choice(list(layer))
    del layer[key]
    return f"{layer.get('name')} without {key}"


def retype(doc, r):
    layer = r.choice(_layers(doc))
    layer["type"] = r.choice(TYPES)
    return f"{layer.get('name')} as {layer['type']}"


def set_param(doc, r):
    params = doc.setdefault("params", {})
    if not isinstance(params, dict):
        return "params not a mapping"
    key = r.choice(list(params) + ["extra"])
    params[key] = copy.deepcopy(r.choice(HOSTILE))
    return f"params.{key}={str(params[key])[:30]}"


def set_input(doc, r):
    shape = r.choice([[10**12, 3, 8, 8], [2**31 - 1] * 4, [0, 3, 8, 8], [], "x", [[1, 2]], [-4, 3, 8, 8],
                      [4, 3, 2**31 - 1, 2**31 - 1], [1, 1, 65536, 65536], [4, 3.5, 8, 8], [1] * 40])
    if "input" in doc and isinstance(doc["input"], dict) and doc["input"]:
        doc["input"][next(iter(doc["input"]))] = shape
    else:
        doc["input"] = {"data": shape}
    return f"input {str(shape)[:30]}"


def rewire(doc, r):
    layers = _layers(doc)
    layer = r.choice(layers)
    how = r.choice(["dangling", "cycle", "duplicate", "self"])
    if how == "dangling":
        layer["bottom"] = "nowhere"
    elif how == "cycle":
        layers[0]["bottom"] = layers[-1].get("top", "x")
    elif how == "duplicate":
        doc["layers"].insert(r.randrange(len(doc["layers"]) + 1), copy.deepcopy(layer))
    else:
        layer["bottom"] = layer.get("top", "x")
    return f"{how} {layer.get('name')}"


def explode(doc, r):
    """Repeats and templates that would make far too many layers, or use themselves."""
    relu = {"name": "r${i}", "type": "ReLU", "bottom": "data", "top": "r${i}"}
    how = r.choice(["huge", "nested", "empty", "recursive", "chain", "errors"])
    if how == "huge":
        doc["layers"].append({"repeat": r.choice([10**9, "${10**9}", 10**30, -5, 2.5, "x"]), "as": "i",
                              "layers": [relu]})
    elif how == "nested":
        doc["layers"].append({"repeat": 1000, "as": "j", "layers": [{"repeat": 1000, "as": "i", "layers": [
            dict(relu, name="r${j}_${i}", top="r${j}_${i}")]}]})
    elif how == "empty":
        doc["layers"].append({"repeat": 10**6, "layers": [{"repeat": 10**6, "layers": []}]})
    elif how == "recursive":
        doc["templates"] = {"t": [{"use": "t"}]}
        doc["layers"].append({"use": "t"})
    elif how == "chain":
        doc["templates"] = {f"t{k}": [{"use": f"t{k + 1}"}] for k in range(60)}
        doc["layers"].append({"use": "t0"})
    else:  # 2000 layers, each with a dangling bottom: the first 100 and a count
        doc["layers"].append({"repeat": 2000, "as": "i", "layers": [dict(relu, bottom="nope${i}")]})
    return how


def reshape_root(doc, r):
    how = r.choice(["list", "scalar", "no layers", "layers scalar", "unknown key", "empty"])
    if how == "list":
        return "list", "- 1\n- 2\n"
    if how == "scalar":
        return how, "42\n"
    if how == "empty":
        return how, ""
    if how == "no layers":
        doc.pop("layers", None)
    elif how == "layers scalar":
        doc["layers"] = "conv"
    else:
        doc["layerz"] = []
    return how


def corrupt_text(doc, r):
    """Bytes a text editor or a bad download would leave: a cut, stray bytes, deep brackets."""
    text = _dump(doc).encode()
    how = r.choice(["cut", "bytes", "brackets", "tabs", "alias bomb", "recursive anchor", "long line"])
    if how == "cut":
        text = text[:r.randrange(len(text))]
    elif how == "bytes":
        at = r.randrange(len(text))
        text = text[:at] + r.choice([b"\0", b"\xff\xfe", b"\x01", b"\x1b[31m", b"\xc3", "\u2028".encode()]) + text[at:]
    elif how == "brackets":
        n = r.choice([100, 1000, 20000])
        text += b"\nextra: " + b"[" * n + b"1" + b"]" * n + b"\n"
    elif how == "tabs":
        text = text.replace(b"  ", b"\t", 3)
    elif how == "alias bomb":
        bomb = b"params:\n  a: &a [x, x, x, x, x, x, x, x, x]\n" + b"".join(
            b"  %c: &%c [%s]\n" % (c + 1, c + 1, b", ".join([b"*%c" % c] * 9)) for c in range(ord("a"), ord("i")))
        text = bomb + b"".join(line + b"\n" for line in text.splitlines() if not line.startswith(b"params"))
    elif how == "recursive anchor":
        text += b"\nextra: &r [1, *r]\n"
    else:
        text += b"\nextra: '" + b"y" * 1_000_000 + b"'\n"
    return how, text


MUTATIONS = [set_key, set_key, set_key, drop_key, retype, set_param, set_input, rewire, explode, reshape_root,
             corrupt_text]


def _net_cases(count=260, bases=BASES, family="nets"):
    r = rng(family)
    cases = []
    for k in range(count):
        base = r.choice(bases)
        doc = _load(base)
        mutation = r.choice(MUTATIONS)
        said = mutation(doc, r)
        text = said[1] if isinstance(said, tuple) else _dump(doc)
        what = said[0] if isinstance(said, tuple) else said
        cases.append(pytest.param(text, id=f"{k}-{os.path.basename(base)}-{mutation.__name__}-{what}"[:90]))
    return cases


@pytest.mark.parametrize("text", _net_cases())
def test_mutated_net_is_planned_or_refused_cleanly(text, tmp_path):
    path = tmp_path / "net.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert_clean(run_main(plan_main, [path, "--batch", "2"]), ok=(0, 3))


@pytest.mark.parametrize("text", _net_cases(24, [b for b in BASES if b.startswith("tests/")], "train"))
def test_mutated_net_trains_or_is_refused_cleanly(text, tmp_path, monkeypatch):
    """Mutations of the small nets through sn-train: one iteration, or a clean error."""
    monkeypatch.setenv("SN_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "net.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert_clean(run_main(train_main, [path, "--batch", "2", "--iters", "1", "--data", "synthetic"]))


SETS = ["depth=999999998", "depth=21", "depth=-1", "depth=1e23", "depth=[[[[]]]]", "depth=", "=5", "depth",
        "size=100000", "size=0", "classes=1000000000", "batch=10000000", "batch=0", "depth='${9**4096**4096}'",
        "blocks=[3, 8, 10000000, 3]", "blocks=[]", "blocks=[1e400]", "nope=1", "depth=" + "9" * 5000,
        "depth=[" + ", ".join(["&a [1, 1, 1, 1, 1, 1, 1, 1]"] + ["*a"] * 8) + "]", "depth=!!binary aGVsbG8=",
        "depth=2001-01-01", "depth=.nan", "depth=0x10"]


def test_twenty_thousand_graph_errors_are_summarised(tmp_path):
    """Issue 17: 20 000 dangling bottoms printed the 20 000 lines (and took minutes to find a
    near name for each); the first 100 and a count, at once."""
    path = tmp_path / "net.yaml"
    path.write_text("input: {data: [1, 1, 2, 2]}\nlayers:\n  - {repeat: 20000, as: i, layers: [{name: 'l${i}', "
                    "type: ReLU, bottom: 'nope${i}', top: 't${i}'}]}\n")
    outcome = run_main(plan_main, [path])
    assert_clean(outcome)
    lines = outcome.err.splitlines()
    assert outcome.rc == 2 and len(lines) == 102 and "bottom 'nope0' is not produced" in lines[1]
    assert lines[-1].startswith("... and 19900 more problems")


@pytest.mark.parametrize("item", SETS)
@pytest.mark.parametrize("net", ["nets/resnet.yaml", "nets/resnet_cifar.yaml"])
def test_hostile_set_is_planned_or_refused_cleanly(net, item):
    assert_clean(run_main(plan_main, [os.path.join(ROOT, net), "--batch", "1", "--set", item]), ok=(0, 3))


# -- expressions ---------------------------------------------------------------------------
ENV = {"d": 50, "s": "res", "blocks": [3, 4, 6, 3], "flag": True, "w": 2.5, "big": list(range(1000))}
ATOMS = ["0", "1", "-1", "7", "2.5", "10**12", "2**31", "9**4096", "'a'", "''", "[]", "[1, 2]", "d", "s", "blocks",
         "flag", "w", "big", "None", "true", "{1: 2}", "(1, 2)", "1e308"]
BINARY = ["+", "-", "*", "/", "//", "%", "**", "<", "==", "in", "and", "or"]
CALLS = ["min", "max", "int", "float", "str", "len", "range", "sum", "abs", "error"]


def _expr(r, depth):
    if depth <= 0 or r.random() < 0.25:
        return r.choice(ATOMS)
    kind = r.random()
    if kind < 0.45:
        return f"({_expr(r, depth - 1)} {r.choice(BINARY)} {_expr(r, depth - 1)})"
    if kind < 0.65:
        args = ", ".join(_expr(r, depth - 1) for _ in range(r.randint(1, 2)))
        return f"{r.choice(CALLS)}({args})"
    if kind < 0.75:
        return f"[{_expr(r, depth - 1)}, {_expr(r, depth - 1)}]"
    if kind < 0.85:
        return f"{_expr(r, depth - 1)}[{_expr(r, depth - 1)}]"
    if kind < 0.92:
        return f"({_expr(r, depth - 1)} if {_expr(r, depth - 1)} else {_expr(r, depth - 1)})"
    return f"-{_expr(r, depth - 1)}"


HOSTILE_EXPRS = ["'a' * 10**12", "('a' * 10**6) * 10**6", "[0] * 10**6 * 10**6", "[[0] * 10**6] * 10**6",
                 "sum([[0]] * 10**6, [])", "sum([[0] * 1000] * 1000, [])", "'%*d' % (2**31, 1)", "'%2147483647d' % 1",
                 "'%.2147483647f' % 1.0", "9 ** 4096 ** 4096", "(9 ** 4096) ** 4096", "2 ** 4097", "10 ** 10 ** 10",
                 "(10 ** 1000) * (10 ** 1000)", "int('9' * 4000) ** 2", "range(10 ** 18)", "range(-10**30, 10**30)",
                 "str(big) * 1000", "[big, big, big, big] * 1000", "str([[big] * 100] * 100)",
                 "+".join(["1"] * 100000), "(" * 150 + "1" + ")" * 150, "-" * 3000 + "1", "not " * 2000 + "1",
                 "[" * 90 + "]" * 90, "1e308 * 1e308", "2.0 ** 10 ** 400", "float(10 ** 400)", "1 // 0", "1 % 0",
                 "[][0]", "{}[1]", "'%s' % (big,)", "'%(a)s' % {'a': big}", "min([])", "max(range(0))",
                 "abs('x')", "len(5)", "range(1, 2, 0)", "str(10 ** 1200)", "(-8) ** 0.5", "'a' < 1"]


def _expr_cases(count=160):
    r = rng("expr")
    return HOSTILE_EXPRS + [_expr(r, r.randint(1, 6)) for _ in range(count)]


@pytest.mark.parametrize("src", _expr_cases(), ids=lambda s: s[:50])
def test_expression_gives_a_value_or_an_expr_error(src):
    error = None
    with guard(10):
        try:
            evaluate(src, dict(ENV))
        except ExprError:
            pass
        except Exception as e:  # noqa: BLE001 - what must not happen
            error = e
    assert error is None, f"{type(error).__name__}: {error}"
