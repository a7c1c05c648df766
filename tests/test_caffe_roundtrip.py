"""sn-convert both ways: prototxt → YAML → prototxt gives a net whose plan, parameter count and
outputs are those of the original (issue 32), and a YAML net written as a prototxt reads back
the same."""

import math
import sys

import numpy as np
import pytest

from superneuron.errors import SpecError
from superneuron.graph import Graph
from superneuron.net import Net
from superneuron.netfile.caffe.prototxt import prototxt_tree
from superneuron.netfile.caffe.prototxt_out import spec_to_prototxt
from superneuron.netfile.caffe.yaml_out import tree_to_yaml
from superneuron.netfile.spec import load_spec, loads_spec, prototxt_spec
from superneuron.planning import plan

sys.path.insert(0, "tests/caffe")
import zoo  # noqa: E402


def _learnable(graph):
    return sum(math.prod(t.shape) for t in graph.tensors.values() if t.kind == "param")


def _figures(spec):
    """What must not change: learnable count, the liveness plan's peak, the outputs of one
    forward (TEST phase) and one training forward-backward on the same feed and weights."""
    graph = Graph(spec)
    peak = plan(graph, "liveness")[1].peak_bytes
    net = Net(spec, seed=3)
    rng = np.random.default_rng(0)
    feed = {}
    for name in net.input_names:
        shape = net.input_shape(name)
        feed[name] = (rng.integers(0, 2, shape) if len(shape) == 1 else rng.standard_normal(shape)).astype(np.float32)
    net.forward(feed)
    tested = dict(net.outputs)
    net.forward_backward(feed)
    grads = {p: net.grad(p) for p in net.learnable_names}
    return _learnable(graph), peak, tested, dict(net.outputs), grads


def _same(a, b):
    assert a[:2] == b[:2]
    for x, y in zip(a[2:4], b[2:4]):
        assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
    assert a[4].keys() == b[4].keys() and all(np.array_equal(a[4][k], b[4][k]) for k in a[4])


def _round_trip(text, file, data=None):
    """``(original spec, spec of prototxt → YAML → prototxt)``."""
    original = prototxt_spec(text, file, data=data)
    yaml_text = tree_to_yaml(prototxt_tree(text, file, data), source=file)
    again = prototxt_spec(spec_to_prototxt(loads_spec(yaml_text, "converted.yaml")), "again.prototxt")
    return original, again


@pytest.mark.parametrize("file, data", [
    ("tests/caffe/lenet_train_test.prototxt", "synthetic:1x28x28"),
    ("tests/caffe/cifar10_quick_train_test.prototxt", "synthetic:3x32x32"),
])
def test_train_val_files_round_trip(file, data):
    original, again = _round_trip(open(file).read(), file, data)
    _same(_figures(original), _figures(again))


@pytest.mark.parametrize("name, make", [
    ("squeezenet", lambda: zoo.squeezenet(size=48, batch=2)),
    ("mobilenet", lambda: zoo.mobilenet(size=32, batch=2)),
])
def test_model_zoo_files_round_trip(name, make):
    original, again = _round_trip(make(), f"{name}.prototxt")
    a, b = Graph(original), Graph(again)
    assert _learnable(a) == _learnable(b) > 0
    assert plan(a, "liveness")[1].peak_bytes == plan(b, "liveness")[1].peak_bytes
    assert [n.layer.type for n in a.nodes] == [n.layer.type for n in b.nodes]
    assert [n.layer.cfg for n in a.nodes] == [n.layer.cfg for n in b.nodes]


@pytest.mark.parametrize("path", ["tests/nets/tiny.yaml", "nets/lenet.yaml"])
def test_yaml_nets_as_prototxt(path):
    spec = load_spec(path)
    again = prototxt_spec(spec_to_prototxt(spec), "again.prototxt")
    _same(_figures(spec), _figures(again))


def test_a_key_caffe_cannot_say_is_refused():
    spec = loads_spec("""
name: odd
input: {data: [2, 3]}
layers:
  - {name: ip, type: InnerProduct, bottom: data, top: ip, num_output: 2}
""")
    spec.layers[-1].cfg["made_up"] = 3
    with pytest.raises(SpecError, match="'made_up' has no Caffe field"):
        spec_to_prototxt(spec)


@pytest.mark.parametrize("name", ["FCN", "SEGNET"])
def test_fork_files_round_trip(name):
    import test_caffe_fork_files as files
    original, again = _round_trip(getattr(files, name), f"{name.lower()}.prototxt")
    _same(_figures(original), _figures(again))


def test_batchnorm_left_to_its_phase_is_not_written_false():
    # Caffe: use_global_stats unset follows the phase; written false, TEST uses batch statistics
    text = spec_to_prototxt(load_spec("tests/nets/tiny.yaml"))
    assert "use_global_stats" not in text and "batch_norm_param" in text
