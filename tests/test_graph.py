"""Graph building: versions of in-place tops, Splits at fan-out, gradients, and the errors a
network file can have, each naming the file, line and layer."""

import textwrap

import numpy as np
import pytest
from one_line import one_line

from superneuron.errors import SpecError
from superneuron.graph import Graph
from superneuron.netfile.spec import load_spec


def graph_of(tmp_path, text, name="net.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return Graph(load_spec(str(path)))


def errors_of(tmp_path, text):
    """The error text of ``text`` (all its problems, one per line)."""
    with pytest.raises(SpecError) as e:
        graph_of(tmp_path, text)
    return str(e.value)


HEAD = """\
name: t
input: {data: [2, 3, 8, 8], label: [2]}
layers:
"""


def test_in_place_versions_share_memory_and_gradients(tmp_path):
    g = graph_of(tmp_path, HEAD + """\
      - {name: conv, type: Convolution, bottom: data, top: conv, num_output: 4, kernel_size: 3}
      - {name: relu, type: ReLU, bottom: conv, top: conv}
      - {name: fc, type: InnerProduct, bottom: conv, top: fc, num_output: 5}
      - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
    """)
    relu = g.node("relu")
    assert relu.bottoms == ["conv"] and relu.tops == ["conv@relu"]
    assert g.root("conv@relu") == "conv"
    assert g.tensors["conv.grad"].alias == "conv@relu.grad"
    assert g.node("fc").bottoms == ["conv@relu"]
    conv = g.node("conv")
    assert conv.bottom_grads == [None] and conv.backward and set(conv.param_grads) == {"weight", "bias"}
    assert "data.grad" not in g.tensors and "label.grad" not in g.tensors


def test_fan_out_gets_a_split_whose_tops_alias_the_tensor(tmp_path):
    g = graph_of(tmp_path, HEAD + """\
      - {name: conv, type: Convolution, bottom: data, top: conv, num_output: 3, kernel_size: 1}
      - {name: sum, type: Eltwise, bottom: [conv, data], top: sum}
      - {name: fc, type: InnerProduct, bottom: sum, top: fc, num_output: 5}
      - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
      - {name: acc, type: Accuracy, bottom: [fc, label], top: acc}
    """)
    names = [n.name for n in g.nodes]
    assert names.index("data#split") < names.index("conv") and names.index("fc#split") < names.index("loss")
    split = g.node("fc#split")
    assert [g.root(t) for t in split.tops] == ["fc", "fc"]
    assert g.node("loss").bottoms[0] == "fc#0" and g.node("acc").bottoms[0] == "fc#1"
    # only the loss contributes a gradient; Accuracy has none
    assert split.top_grads == ["fc#0.grad", None] and split.backward
    assert not g.node("acc").backward
    # data needs no gradient, but the Eltwise still differentiates with respect to conv
    assert g.node("sum").bottom_grads == ["conv.grad", None]


@pytest.mark.parametrize("layers, message, line", [
    ("""\
      - {name: fc, type: InnerProduct, bottom: dat, top: fc, num_output: 5}
    """, "layer 'fc' (InnerProduct): bottom 'dat' is not produced by any layer or input; did you mean 'data'?", 4),
    ("""\
      - {name: a, type: InnerProduct, bottom: data, top: x, num_output: 5}
      - {name: b, type: InnerProduct, bottom: data, top: x, num_output: 5}
    """, "layer 'b' (InnerProduct): top 'x' is already written by layer 'a' (line 4)", 5),
    ("""\
      - {name: a, type: InnerProduct, bottom: y, top: x, num_output: 5}
      - {name: b, type: InnerProduct, bottom: x, top: y, num_output: 5}
    """, "layer 'a' (InnerProduct): cycle: a → b → a", 4),
    ("""\
      - {name: c1, type: Convolution, bottom: data, top: c1, num_output: 4, kernel_size: 1}
      - {name: c2, type: Convolution, bottom: data, top: c2, num_output: 6, kernel_size: 1}
      - {name: sum, type: Eltwise, bottom: [c1, c2], top: sum}
    """, "layer 'sum' (Eltwise): bottoms (2,4,8,8) and (2,6,8,8) differ", 6),
    ("""\
      - {name: a, type: InnerProduct, bottom: data, top: "fc#0", num_output: 5}
    """, "layer 'a' (InnerProduct): top 'fc#0': names may not contain '@' or '#'", 4),
    ("""\
      - {name: a, type: InnerProduct, bottom: data, top: pool1.grad, num_output: 5}
    """, "top 'pool1.grad': names ending in '.grad' or starting with 'ws:' are superneuron's own", 4),
    ("""\
      - {name: a, type: InnerProduct, bottom: data, top: a, num_output: 5}
      - {name: b, type: ReLU, bottom: a, top: a/weight}
    """, "layer 'b' (ReLU): top 'a/weight' has the name of a parameter", 5),
    ("""\
      - {name: c1, type: Convolution, bottom: data, top: c1, num_output: 4, kernel_size: 9}
    """, "layer 'c1' (Convolution):", 4),
])
def test_graph_errors_name_file_line_and_layer(tmp_path, layers, message, line):
    text = one_line(errors_of(tmp_path, HEAD + layers))
    assert f"net.yaml:{line}:" in text and message in text, text


def test_all_problems_are_reported_together(tmp_path):
    text = errors_of(tmp_path, HEAD + """\
      - {name: a, type: InnerProduct, bottom: nope, top: a, num_output: 5}
      - {name: b, type: InnerProduct, bottom: data, top: b, num_output: 5}
      - {name: c, type: InnerProduct, bottom: alsonope, top: c, num_output: 5}
    """)
    assert len(text.splitlines()) == 2 and "'nope'" in text and "'alsonope'" in text


def test_shapes_of_every_net(tmp_path):
    """Every network in nets/ builds, with its classic output sizes."""
    cases = {"nets/lenet.yaml": ("ip2", (64, 10)), "nets/alexnet.yaml": ("pool5", (32, 256, 6, 6)),
             "nets/vgg16.yaml": ("pool5", (32, 512, 7, 7)), "nets/googlenet.yaml": (None, None),
             "nets/resnet.yaml": ("pool5", (32, 2048, 1, 1)), "nets/resnet_cifar.yaml": (None, None)}
    for path, (top, shape) in cases.items():
        g = Graph(load_spec(path))
        if top is not None:
            assert g.tensors[top].shape == shape, (path, g.tensors[top].shape)
        assert g.losses and all(n.backward for n in g.nodes if n.layer.type == "Split"
                                if any(n.top_grads)), path


def test_resnet_depths_have_the_classic_parameter_counts():
    """Parameter counts of the ImageNet ResNets (He et al.; torchvision agrees), counting
    BatchNorm's scale and shift as Scale's weight and bias."""
    expected = {18: 11_689_512, 34: 21_797_672, 50: 25_557_032, 101: 44_549_160}
    for depth, count in expected.items():
        g = Graph(load_spec("nets/resnet.yaml", overrides={"depth": depth}, batch=1))
        n = sum(int(np.prod(t.shape)) for t in g.tensors.values() if t.kind == "param")
        assert n == count, (depth, n)


def test_caffe_in_place_chain_keeps_one_value(tmp_path):
    """conv → BatchNorm → Scale → ReLU all on one blob, as every Caffe ResNet writes it: the
    BatchNorm writes over the convolution's output (whose backward needs only its bottom), the
    Scale may not write over x_hat (its own backward and BatchNorm's read it), so x_hat is kept
    as an ordinary tensor, and the ReLU writes over the Scale's output: two storage roots."""
    g = graph_of(tmp_path, HEAD + """\
      - {name: c1, type: Convolution, bottom: data, top: c1, num_output: 4, kernel_size: 1}
      - {name: bn, type: BatchNorm, bottom: c1, top: c1}
      - {name: sc, type: Scale, bottom: c1, top: c1, bias_term: true}
      - {name: relu, type: ReLU, bottom: c1, top: c1}
      - {name: fc, type: InnerProduct, bottom: c1, top: fc, num_output: 5}
      - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
    """)
    bn, sc, relu = g.node("bn"), g.node("sc"), g.node("relu")
    assert bn.inplace and relu.inplace and not sc.inplace
    assert sc.kept == "keeps 'c1@bn', read by the backward of 'sc', 'bn'"
    assert [g.root(t) for t in ("c1", "c1@bn", "c1@sc", "c1@relu")] == ["c1", "c1", "c1@sc", "c1@sc"]
    roots = {g.root(t.name) for t in g.tensors.values() if t.kind == "data" and t.name.startswith("c1")}
    assert roots == {"c1", "c1@sc"}
    # gradients: BatchNorm and ReLU write their bottom gradient over their top's; Scale cannot
    assert g.root("c1.grad") == "c1@bn.grad" and g.root("c1@sc.grad") == "c1@relu.grad"
    assert g.root("c1@bn.grad") == "c1@bn.grad"


def test_in_place_relu_on_batchnorm_output_keeps_x_hat(tmp_path):
    """Caffe accepts a ReLU in place on a BatchNorm's output; BatchNorm's backward reads x_hat,
    so the ReLU gets memory of its own."""
    g = graph_of(tmp_path, HEAD + """\
      - {name: c1, type: Convolution, bottom: data, top: c1, num_output: 4, kernel_size: 1}
      - {name: bn, type: BatchNorm, bottom: c1, top: c1}
      - {name: relu, type: ReLU, bottom: c1, top: c1}
      - {name: fc, type: InnerProduct, bottom: c1, top: fc, num_output: 5}
      - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
    """)
    assert g.node("bn").inplace and not g.node("relu").inplace
    assert g.node("relu").kept == "keeps 'c1@bn', read by the backward of 'bn'"
    assert g.root("c1@relu") == "c1@relu"
