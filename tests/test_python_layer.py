"""Caffe's Python layers: a user's module with ``import caffe`` and a ``caffe.Layer`` subclass
(Caffe's own pyloss example), driven through setup, reshape, forward and backward with its
param_str and phase, and a module that cannot be imported told in one line."""

import os

import numpy as np
import pytest
from one_line import one_line

from superneuron.errors import SpecError
from superneuron.net import Net
from superneuron.spec import prototxt_spec

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_layers")

NET = '''name: "pyloss"
input: "data" input_shape { dim: 4 dim: 3 }
input: "target" input_shape { dim: 4 dim: 2 }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 2 } }
layer { name: "scaled" type: "Python" bottom: "ip" top: "scaled"
        python_param { module: "scaled" layer: "Scaled" param_str: "3" } }
layer { name: "loss" type: "%s" bottom: "scaled" bottom: "target" top: "loss" %s }
'''


@pytest.fixture
def layers_path(monkeypatch):
    monkeypatch.syspath_prepend(HERE)


def _run(text, feed):
    net = Net(prototxt_spec(text, "net.prototxt"), seed=1)
    loss = net.forward_backward(feed)
    return net, loss


def test_caffes_pyloss_example_computes_euclidean_loss(layers_path):
    rng = np.random.default_rng(0)
    feed = {"data": rng.standard_normal((4, 3)).astype(np.float32),
            "target": rng.standard_normal((4, 2)).astype(np.float32)}
    ours, want = _run(NET % ("EuclideanLoss", ""), feed)
    theirs, got = _run(NET % ("Python", 'python_param { module: "pyloss" layer: "EuclideanLossLayer" } '
                              "loss_weight: 1"), feed)
    assert np.isclose(got, want, rtol=1e-6)
    for name in ours.learnable_names:
        np.testing.assert_allclose(theirs.grad(name), ours.grad(name), rtol=1e-5)
    assert np.abs(ours.grad("ip/weight")).max() > 0


def test_param_str_and_phase_reach_the_layer(layers_path):
    text = NET % ("EuclideanLoss", "")
    net = Net(prototxt_spec(text, "net.prototxt"), seed=1)
    x = np.ones((4, 3), np.float32)
    feed = {"data": x, "target": np.zeros((4, 2), np.float32)}
    net.forward(feed, train=True)
    trained = net.blob("scaled")
    net.forward(feed, train=False)
    np.testing.assert_allclose(trained, 3 * net.blob("scaled"), rtol=1e-6)


@pytest.mark.parametrize("param, message", [
    ('module: "nowhere_module" layer: "X"', "python_param module 'nowhere_module' cannot be imported: "
                                            "ModuleNotFoundError"),
    ('module: "scaled" layer: "Missing"', "python_param module 'scaled' has no class 'Missing'"),
    ('module: "scaled" layer: "Broken"', "Broken.reshape raised ValueError: no shape for you"),
])
def test_errors_are_one_line_naming_the_layer(layers_path, param, message):
    text = NET.replace('module: "scaled" layer: "Scaled" param_str: "3"', param) % ("EuclideanLoss", "")
    with pytest.raises(SpecError) as e:
        Net(prototxt_spec(text, "net.prototxt"))
    line = one_line(str(e.value))
    assert message in line and "layer 'scaled' (Python)" in line


def test_a_loss_reads_its_weight_from_the_top_diff(layers_path):
    text = NET.replace('''layer { name: "loss" type: "%s" bottom: "scaled" bottom: "target" top: "loss" %s }''',
                       '''layer { name: "loss" type: "Python" bottom: "ip" top: "loss" loss_weight: 0.25
        python_param { module: "scaled" layer: "HalfSquareLoss" } }
layer { name: "silence" type: "Silence" bottom: "scaled" bottom: "target" }''')
    net = Net(prototxt_spec(text, "net.prototxt"), seed=1)
    x = np.random.default_rng(2).standard_normal((4, 3)).astype(np.float32)
    loss = net.forward_backward({"data": x, "target": np.zeros((4, 2), np.float32)})
    ip = net.blob("ip")
    assert np.isclose(loss, 0.25 * 0.5 * (ip.astype(np.float64) ** 2).sum(), rtol=1e-5)
    np.testing.assert_allclose(net.grad("ip/bias"), 0.25 * ip.sum(0), rtol=1e-5)  # the weight reached it


@pytest.mark.parametrize("policy", ["liveness", "superneurons", "gist"])
def test_policies_give_baselines_bits_around_python_layers(layers_path, policy):
    text = NET % ("Python", 'python_param { module: "pyloss" layer: "EuclideanLossLayer" } loss_weight: 1')
    rng = np.random.default_rng(3)
    feed = {"data": rng.standard_normal((4, 3)).astype(np.float32),
            "target": rng.standard_normal((4, 2)).astype(np.float32)}
    base, other = (Net(prototxt_spec(text, "net.prototxt"), seed=1, policy=p) for p in ("baseline", policy))
    assert other.forward_backward(feed) == base.forward_backward(feed)
    for name in base.learnable_names:
        np.testing.assert_array_equal(other.grad(name), base.grad(name))
