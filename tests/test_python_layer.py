"""Caffe's `Python` layer: a user's pycaffe module (`import caffe`, `caffe.Layer`, blobs with
data/diff/reshape) runs as it would under Caffe, with no Caffe installed; its gradient is the
finite difference of its forward; every policy gives baseline's bits on a net that uses one; it
is never recomputed; Caffe's own pyloss example is a loss as Caffe has it; and a module that
cannot be imported, or a top reshaped after set-up, is a one-line error naming the layer."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from superneuron import SpecError
from superneuron.net import Net
from superneuron.netfile.spec import loads_spec, prototxt_spec
from superneuron.scheduler.recompute import recomputable_roots

MODULE = '''
import caffe
import numpy as np


class Cube(caffe.Layer):
    """top = scale * bottom ** 3, scale from param_str."""

    def setup(self, bottom, top):
        self.scale = float(eval(self.param_str)["scale"]) if self.param_str else 1.0
        if len(bottom) != 1:
            raise Exception("Cube takes one bottom")

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.scale * bottom[0].data ** 3

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = 3 * self.scale * bottom[0].data ** 2 * top[0].diff


class Counter(caffe.Layer):
    """A data layer: each forward draws the next batch (so a second forward would differ)."""

    def setup(self, bottom, top):
        self.count = 0

    def reshape(self, bottom, top):
        top[0].reshape(2, 3, 4, 4)
        top[1].reshape(2)

    def forward(self, bottom, top):
        self.count += 1
        rng = np.random.default_rng(self.count)
        top[0].data[...] = rng.standard_normal(top[0].shape)
        top[1].data[...] = self.count % 2


class Grows(Counter):
    def forward(self, bottom, top):
        top[0].reshape(3, 3, 4, 4)
'''

NET = """
name: pynet
layers:
  - {name: data, type: Python, top: [data, label], module: sn_test_pylayers, layer: Counter}
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3, pad: 1,
     weight_filler: {type: gaussian, std: 0.3}}
  - {name: cube, type: Python, bottom: conv1, top: cube, module: sn_test_pylayers, layer: Cube,
     param_str: "{'scale': 0.5}"}
  - {name: relu, type: ReLU, bottom: cube, top: relu}
  - {name: fc, type: InnerProduct, bottom: relu, top: fc, num_output: 2}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
"""


@pytest.fixture
def pymodule(tmp_path, monkeypatch):
    (tmp_path / "sn_test_pylayers.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("sn_test_pylayers", None)
    yield tmp_path
    sys.modules.pop("sn_test_pylayers", None)


def run(policy, text=NET, iterations=2):
    net = Net(loads_spec(text), policy=policy)
    losses = [net.forward_backward({}) for _ in range(iterations)]
    return net, losses, {p: net.grad(p) for p in net.param_names}


def test_the_module_runs_under_its_own_import_caffe(pymodule):
    net, losses, _ = run("baseline")
    assert net.graph.tensors["cube"].shape == (2, 4, 4, 4)
    conv = net.blob("conv1")
    # the cube layer's output is 0.5 x^3: read it back
    assert np.allclose(net.blob("cube"), 0.5 * conv.astype(np.float64) ** 3, rtol=1e-5, atol=1e-6)
    assert losses[0] != losses[1]  # the data layer drew another batch


@pytest.mark.parametrize("policy", ["liveness", "recompute", "offload", "superneurons", "gist", "liveness+params"])
def test_every_policy_gives_baselines_bits(pymodule, policy):
    _, base_losses, base_grads = run("baseline")
    net, losses, grads = run(policy)
    assert losses == base_losses
    for p in base_grads:
        assert np.array_equal(grads[p], base_grads[p]), p


def test_a_python_layer_is_never_a_recomputation_candidate(pymodule):
    """Even where the optimal policy may recompute expensive layers (a convolution), a Python
    layer's output is kept: a second forward of it could draw another batch."""
    net = Net(loads_spec(NET), policy="liveness")
    candidates, _ = recomputable_roots(net.schedules["train"], expensive=True)
    writers = {w for ws in candidates.values() for w in ws}
    assert net.graph.node("conv1").index in writers
    assert net.graph.node("cube").index not in writers


def test_the_python_layers_gradient_is_the_finite_difference_of_its_forward(pymodule):
    text = NET.replace("layer: Counter}", "layer: Counter}\n  - {name: fix, type: Power, bottom: data, top: x}"
                       ).replace("bottom: data, top: conv1", "bottom: x, top: conv1")
    net = Net(loads_spec(text), dtype="float64")
    net.forward_backward({})
    analytic = net.grad("conv1/weight").copy()
    w = net.param("conv1/weight").copy()
    rng = np.random.default_rng(0)
    direction = rng.standard_normal(w.shape)
    eps = 1e-6
    values = []
    for sign in (1, -1):
        # the same batch each time: the data layer's counter is put back
        net.graph.node("data").layer.user.count = 0
        net.set_param("conv1/weight", w + sign * eps * direction)
        values.append(net.forward_backward({}))
    net.set_param("conv1/weight", w)
    numeric = (values[0] - values[1]) / (2 * eps)
    assert numeric == pytest.approx(float((analytic * direction).sum()), rel=1e-5)


def test_a_module_that_cannot_be_imported_is_one_line_naming_it(tmp_path):
    net = tmp_path / "net.yaml"
    net.write_text(NET.replace("sn_test_pylayers, layer: Cube", "no_such_module_here, layer: Cube"))
    (tmp_path / "sn_test_pylayers.py").write_text(MODULE)
    out = subprocess.run([sys.executable, "-m", "superneuron.cli.plan", str(net)], capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert "layer 'cube' (Python)" in lines[0] and "no_such_module_here" in lines[0]


def test_the_module_is_found_beside_the_net_file(tmp_path):
    (tmp_path / "sn_test_pylayers.py").write_text(MODULE)
    (tmp_path / "net.yaml").write_text(NET)
    out = subprocess.run([sys.executable, "-m", "superneuron.cli.plan", str(tmp_path / "net.yaml"), "--json"],
                         capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["opaque_layers"] == ["data", "cube"]
    text = subprocess.run([sys.executable, "-m", "superneuron.cli.plan", str(tmp_path / "net.yaml")],
                          capture_output=True, text=True, cwd="/").stdout
    assert "Python layers 'data', 'cube': their bottoms and tops kept for their backward, never recomputed" in text


def test_a_top_reshaped_after_setup_is_an_error_naming_the_layer(pymodule):
    net = Net(loads_spec(NET.replace("layer: Counter", "layer: Grows")))
    with pytest.raises(Exception) as caught:
        net.forward_backward({})
    assert "Python layer 'data'" in str(caught.value)
    assert "(2, 3, 4, 4) to (3, 3, 4, 4)" in str(caught.value)


def test_a_missing_class_is_a_spec_error(pymodule):
    with pytest.raises(SpecError, match="has no class 'Nope'"):
        Net(loads_spec(NET.replace("layer: Cube", "layer: Nope")))


def test_prototxt_python_param_is_read(pymodule, tmp_path):
    proto = tmp_path / "net.prototxt"
    proto.write_text(textwrap.dedent('''
        name: "p"
        layer { name: "data" type: "Python" top: "data" top: "label"
                python_param { module: "sn_test_pylayers" layer: "Counter" } }
        layer { name: "cube" type: "Python" bottom: "data" top: "cube"
                python_param { module: "sn_test_pylayers" layer: "Cube" param_str: "{'scale': 2}" } }
        layer { name: "fc" type: "InnerProduct" bottom: "cube" top: "fc" inner_product_param { num_output: 2 } }
        layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
    '''))
    from superneuron import load_net
    net = load_net(str(proto), phase="TRAIN")
    net.forward_backward({})
    assert net.graph.node("cube").layer.user.scale == 2.0


def test_sn_train_on_a_net_that_makes_its_own_data_says_how_to_train_it(tmp_path):
    (tmp_path / "sn_test_pylayers.py").write_text(MODULE)
    (tmp_path / "net.yaml").write_text(NET)
    out = subprocess.run([sys.executable, "-m", "superneuron.cli.train", "net.yaml", "--iters", "2"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "makes its own data (layer 'data')" in out.stderr and "Net.train_step" in out.stderr


LAYERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_layers")
PYLOSS_NET = '''name: "pyloss"
input: "data" input_shape { dim: 4 dim: 3 }
input: "target" input_shape { dim: 4 dim: 2 }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 2 } }
layer { name: "scaled" type: "Python" bottom: "ip" top: "scaled"
        python_param { module: "scaled" layer: "Scaled" param_str: "3" } }
layer { name: "loss" type: "%s" bottom: "scaled" bottom: "target" top: "loss" %s }
'''


@pytest.fixture
def layers_path(monkeypatch):
    monkeypatch.syspath_prepend(LAYERS)


@pytest.mark.parametrize("policy", ["baseline", "liveness", "superneurons"])
def test_caffes_pyloss_example_is_euclidean_loss(layers_path, policy):
    """Caffe's examples/pycaffe/layers/pyloss.py, weighted by ``loss_weight: 1``: the loss and
    every gradient of our EuclideanLoss, under each policy."""
    rng = np.random.default_rng(0)
    feed = {"data": rng.standard_normal((4, 3)).astype(np.float32),
            "target": rng.standard_normal((4, 2)).astype(np.float32)}
    ours = Net(prototxt_spec(PYLOSS_NET % ("EuclideanLoss", ""), "net.prototxt"), seed=1)
    theirs = Net(prototxt_spec(PYLOSS_NET % ("Python", 'python_param { module: "pyloss" '
                                             'layer: "EuclideanLossLayer" } loss_weight: 1'),
                               "net.prototxt"), seed=1, policy=policy)
    assert np.isclose(theirs.forward_backward(feed), ours.forward_backward(feed), rtol=1e-6)
    for name in ours.learnable_names:
        np.testing.assert_allclose(theirs.grad(name), ours.grad(name), rtol=1e-5)
    assert np.abs(ours.grad("ip/weight")).max() > 0


def test_a_python_loss_reads_its_weight_from_the_top_diff(layers_path):
    text = PYLOSS_NET.replace('''layer { name: "loss" type: "%s" bottom: "scaled" bottom: "target" top: "loss" %s }''',
                              '''layer { name: "loss" type: "Python" bottom: "ip" top: "loss" loss_weight: 0.25
        python_param { module: "scaled" layer: "HalfSquareLoss" } }
layer { name: "silence" type: "Silence" bottom: "scaled" bottom: "target" }''')
    net = Net(prototxt_spec(text, "net.prototxt"), seed=1)
    x = np.random.default_rng(2).standard_normal((4, 3)).astype(np.float32)
    loss = net.forward_backward({"data": x, "target": np.zeros((4, 2), np.float32)})
    ip = net.blob("ip")
    assert np.isclose(loss, 0.25 * 0.5 * (ip.astype(np.float64) ** 2).sum(), rtol=1e-5)
    np.testing.assert_allclose(net.grad("ip/bias"), 0.25 * ip.sum(0), rtol=1e-5)  # the weight reached it
