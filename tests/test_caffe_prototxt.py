"""Caffe .prototxt nets: parsed with protobuf against our caffe.proto, translated to our spec,
planned with the exact learnable parameter counts of the model-zoo files, converted to YAML
that plans to the same byte, and trained a few iterations on synthetic data."""

import json
import math
import sys

import pytest

from superneuron.cli import convert, plan, train
from superneuron.errors import SpecError
from superneuron.graph import Graph
from superneuron.netfile.spec import prototxt_spec

sys.path.insert(0, "tests/caffe")
import zoo  # noqa: E402

LENET = "tests/caffe/lenet_train_test.prototxt"
CIFAR = "tests/caffe/cifar10_quick_train_test.prototxt"


def learnable(spec):
    graph = Graph(spec)
    return sum(math.prod(t.shape) for t in graph.tensors.values() if t.kind == "param")


def conv_params(cin, cout, k, group=1, bias=True):
    return cout * (cin // group) * k * k + (cout if bias else 0)


def googlenet_count():
    """bvlc_googlenet with its two auxiliary classifiers, by the architecture's table."""
    total = conv_params(3, 64, 7) + conv_params(64, 64, 1) + conv_params(64, 192, 3)
    cin = 192
    for item in zoo.INCEPTIONS:
        if item in ("loss1", "loss2"):  # 1x1 conv 128, fc 1024 from 128x4x4, classifier 1000
            total += conv_params(cin, 128, 1) + conv_params(128 * 16, 1024, 1) + conv_params(1024, 1000, 1)
        elif isinstance(item, tuple):
            _, n1, n3r, n3, n5r, n5, npool = item
            total += (conv_params(cin, n1, 1) + conv_params(cin, n3r, 1) + conv_params(n3r, n3, 3)
                      + conv_params(cin, n5r, 1) + conv_params(n5r, n5, 5) + conv_params(cin, npool, 1))
            cin = n1 + n3 + n5 + npool
    return total + conv_params(cin, 1000, 1)


def inception_v3_count():
    """Inception-v3 without its auxiliary classifier, from the paper's module table (torchvision's
    widths): every convolution bias-free with a BatchNorm whose affine pair is, in Caffe's files,
    the following Scale layer (weight and bias: 2 per channel, as torch's affine BatchNorm)."""
    def conv_bn(cin, cout, kh, kw=None):
        return cout * cin * kh * (kh if kw is None else kw) + 2 * cout

    total = conv_bn(3, 32, 3) + conv_bn(32, 32, 3) + conv_bn(32, 64, 3) + conv_bn(64, 80, 1) + conv_bn(80, 192, 3)
    cin = 192
    for proj in (32, 64, 64):  # A: 1x1 64 | 1x1 48, 5x5 64 | 1x1 64, 3x3 96, 3x3 96 | pool, 1x1 proj
        total += (conv_bn(cin, 64, 1) + conv_bn(cin, 48, 1) + conv_bn(48, 64, 5) + conv_bn(cin, 64, 1)
                  + conv_bn(64, 96, 3) + conv_bn(96, 96, 3) + conv_bn(cin, proj, 1))
        cin = 64 + 64 + 96 + proj
    total += conv_bn(cin, 384, 3) + conv_bn(cin, 64, 1) + conv_bn(64, 96, 3) + conv_bn(96, 96, 3)  # B
    cin += 384 + 96
    for c7 in (128, 160, 160, 192):  # C: factorised 7x7s
        total += (conv_bn(cin, 192, 1) + conv_bn(cin, c7, 1) + conv_bn(c7, c7, 1, 7) + conv_bn(c7, 192, 7, 1)
                  + conv_bn(cin, c7, 1) + 2 * conv_bn(c7, c7, 7, 1) + conv_bn(c7, c7, 1, 7)
                  + conv_bn(c7, 192, 1, 7) + conv_bn(cin, 192, 1))
    total += (conv_bn(cin, 192, 1) + conv_bn(192, 320, 3) + conv_bn(cin, 192, 1) + conv_bn(192, 192, 1, 7)
              + conv_bn(192, 192, 7, 1) + conv_bn(192, 192, 3))  # D
    cin += 320 + 192
    for _ in range(2):  # E: 1x1 320 | 1x1 384 → 1x3, 3x1 | 1x1 448, 3x3 384 → 1x3, 3x1 | pool, 1x1 192
        total += (conv_bn(cin, 320, 1) + conv_bn(cin, 384, 1) + 2 * conv_bn(384, 384, 1, 3)
                  + 2 * conv_bn(384, 384, 3, 1) + conv_bn(cin, 448, 1) + conv_bn(448, 384, 3) + conv_bn(cin, 192, 1))
        cin = 320 + 768 + 768 + 192
    return total + cin * 1000 + 1000


# published counts: ResNet-50 with Kaiming He's conv1 bias (101 and 152 have none, as the real
# ResNet-101-deploy.prototxt and ResNet-152-deploy.prototxt write: torchvision's counts), VGG-16,
# SqueezeNet 1.1, DenseNet-121, MobileNet v1 (Keras' trainable count), Caffe's AlexNet/CaffeNet with groups
ZOO = [
    ("resnet50", lambda: zoo.resnet(50), dict(loss=True), 25_557_096),
    ("resnet101", lambda: zoo.resnet(101), dict(loss=True), 44_549_160),
    ("resnet152", lambda: zoo.resnet(152), dict(loss=True), 60_192_808),
    ("resnext50_32x4d", lambda: zoo.resnet(50, groups=32, group_width=4), dict(loss=True), 25_028_904),
    ("vgg16_v1_layers", zoo.vgg16, dict(loss=True), 138_357_544),
    ("squeezenet1.1", zoo.squeezenet, dict(loss=True), 1_235_496),
    ("densenet121", zoo.densenet121, dict(loss=True), 7_978_856),
    ("mobilenet_v1", zoo.mobilenet, dict(loss=True), 4_231_976),
    ("caffenet", lambda: zoo.alexnet(caffenet=True), dict(data="synthetic"), 60_965_224),
    ("alexnet", zoo.alexnet, dict(data="synthetic"), 60_965_224),
    ("googlenet", zoo.googlenet, dict(data="synthetic"), googlenet_count()),
    # torchvision's inception_v3 is 27,161,264 with its auxiliary classifier: 1x1 768→128 with
    # BN (98,560), 5x5 128→768 with BN (2,459,136), fc 768→1000 (769,000), 3,326,696 in all
    ("inception_v3", zoo.inception_v3, dict(loss=True), 23_834_568),
]


def test_inception_v3_table_count_is_the_published_one():
    assert inception_v3_count() == 27_161_264 - 3_326_696 == 23_834_568


@pytest.mark.parametrize("name,make,kw,count", ZOO, ids=[z[0] for z in ZOO])
def test_model_zoo_nets_have_their_published_parameter_counts(name, make, kw, count):
    assert learnable(prototxt_spec(make(), f"{name}.prototxt", **kw)) == count


def test_bvlc_examples_have_their_counts():
    lenet = prototxt_spec(open(LENET).read(), LENET, data="synthetic:1x28x28")
    # conv1 20x1x5x5, conv2 50x20x5x5, ip1 500x800, ip2 10x500, with biases
    assert learnable(lenet) == conv_params(1, 20, 5) + conv_params(20, 50, 5) + 800 * 500 + 500 + 5010
    cifar = prototxt_spec(open(CIFAR).read(), CIFAR, data="synthetic:3x32x32")
    assert learnable(cifar) == (conv_params(3, 32, 5) + conv_params(32, 32, 5) + conv_params(32, 64, 5)
                                + 64 * 4 * 4 * 64 + 64 + 650)


def test_train_val_phases_param_blocks_and_aux_losses():
    spec = prototxt_spec(zoo.googlenet(), "googlenet.prototxt", data="synthetic")
    by_name = {}
    for ls in spec.layers:
        by_name.setdefault(ls.name, []).append(ls)
    assert [ls.phases for ls in by_name["data"]] == [{"TRAIN"}, {"TEST"}]
    assert by_name["data"][0].cfg["size"] == 224 and by_name["data"][0].cfg["channels"] == 3
    assert by_name["data"][0].cfg["classes"] == 1000  # from loss1/classifier's num_output
    losses = {ls.name: ls.loss_weight for ls in spec.layers if ls.type == "SoftmaxWithLoss"}
    assert losses == {"loss1/loss": 0.3, "loss2/loss": 0.3, "loss3/loss3": 1.0}
    assert all(ls.phases == {"TEST"} for ls in spec.layers if ls.type == "Accuracy")
    conv1 = by_name["conv1/7x7_s2"][0]
    assert conv1.lr_mult == (1.0, 2.0) and conv1.decay_mult == (1.0, 0.0)
    assert conv1.cfg["weight_filler"] == {"type": "gaussian", "std": 0.1, "mean": 0.0}


def test_v1_layers_take_blobs_lr_and_weight_decay():
    text = ('input: "data" input_dim: 2 input_dim: 3 input_dim: 8 input_dim: 8\n'
            'layers { name: "c" type: CONVOLUTION bottom: "data" top: "c" blobs_lr: 1 blobs_lr: 2 '
            'weight_decay: 1 weight_decay: 0 convolution_param { num_output: 4 kernel_size: 3 } }\n'
            'layers { name: "p" type: POOLING bottom: "c" top: "p" pooling_param { pool: AVE kernel_size: 2 } }\n')
    spec = prototxt_spec(text, "v1.prototxt")
    conv = spec.layers[1]
    assert (conv.type, conv.lr_mult, conv.decay_mult) == ("Convolution", (1.0, 2.0), (1.0, 0.0))
    assert spec.layers[2].type == "Pooling" and spec.layers[2].cfg["pool"] == "AVE"


@pytest.mark.parametrize("inputs", [
    'input: "data" input_dim: 2 input_dim: 3 input_dim: 9 input_dim: 9\n',
    'input: "data" input_shape { dim: 2 dim: 3 dim: 9 dim: 9 }\n',
    'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 9 dim: 9 } } }\n',
])
def test_every_way_of_giving_the_input_shape(inputs):
    text = inputs + ('layer { name: "p" type: "Pooling" bottom: "data" top: "p" '
                     'pooling_param { kernel_size: 2 stride: 2 } }\n')
    graph = Graph(prototxt_spec(text, "in.prototxt"))
    assert graph.tensors["data"].shape == (2, 3, 9, 9)
    assert graph.tensors["p"].shape == (2, 3, 5, 5)  # Caffe rounds up: ceil((9 - 2) / 2) + 1


@pytest.mark.parametrize("written,side", [("", 5), ("ceil_mode: false", 4), ("ceil_mode: true", 5),
                                          ("round_mode: FLOOR", 4), ("round_mode: CEIL", 5)])
def test_pooling_rounding_in_bvlc_and_fork_spellings(written, side):
    text = ('input: "data" input_shape { dim: 1 dim: 1 dim: 9 dim: 9 }\n'
            f'layer {{ name: "p" type: "Pooling" bottom: "data" top: "p" '
            f'pooling_param {{ kernel_size: 2 stride: 2 {written} }} }}\n')
    assert Graph(prototxt_spec(text, "pool.prototxt")).tensors["p"].shape == (1, 1, side, side)


def test_every_unknown_field_in_one_error_with_its_place():
    text = ('input: "data" input_dim: 1 input_dim: 1 input_dim: 8 input_dim: 8\n'
            'layer {\n  name: "c1"\n  type: "Convolution"\n  bottom: "data"\n  top: "c1"\n'
            '  convolution_param {\n    num_ouput: 4\n    kernel_size: 3\n    shiny: true\n  }\n}\n'
            'layer { name: "r" type: "ReLU" bottom: "c1" top: "c1" sparkle: 2 }\n')
    with pytest.raises(SpecError) as e:
        prototxt_spec(text, "bad.prototxt")
    assert e.value.problems == [
        "bad.prototxt:8:5: layer 'c1' (Convolution): unknown field 'num_ouput' in convolution_param; "
        "did you mean 'num_output'?",
        "bad.prototxt:10:5: layer 'c1' (Convolution): unknown field 'shiny' in convolution_param",
        "bad.prototxt:13:55: layer 'r' (ReLU): unknown field 'sparkle' in layer",
    ]


def test_bad_values_name_their_place_and_layer():
    text = ('input: "data" input_dim: 1 input_dim: 1 input_dim: 8 input_dim: 8\n'
            'layer { name: "p" type: "Pooling" bottom: "data" top: "p"\n'
            '  pooling_param { pool: MEDIAN kernel_size: 2 } }\n')
    with pytest.raises(SpecError, match=r"^bad.prototxt:3:25: layer 'p' \(Pooling\): .*MEDIAN"):
        prototxt_spec(text, "bad.prototxt")
    # a problem our own checks find points into the prototxt too
    text = text.replace("MEDIAN", "MAX").replace("kernel_size: 2", "kernel_size: 2 kernel_h: 3")
    with pytest.raises(SpecError, match=r"bad.prototxt:\d+:\d+: layer 'p' \(Pooling\): .*kernel"):
        Graph(prototxt_spec(text, "bad.prototxt"))
    text = text.replace('type: "Pooling"', 'type: "Pooling2"')
    with pytest.raises(SpecError, match=r"bad.prototxt:2:\d+: layer 'p' \(Pooling2\): unknown layer type"):
        prototxt_spec(text, "bad.prototxt")


def test_sn_plan_reports_a_bad_prototxt_in_one_line(tmp_path, capsys):
    path = tmp_path / "bad.prototxt"
    path.write_text('layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 } } nope: 1 }\n')
    assert plan.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "unknown field 'nope'" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert plan.main([LENET]) == 2  # its Data layers read LMDBs: the error says what to do
    assert "--data synthetic" in capsys.readouterr().err


def test_sn_convert_then_sn_plan_gives_the_same_plan(tmp_path, capsys):
    yaml_path = tmp_path / "cifar10_quick.yaml"
    assert convert.main([CIFAR, "--data", "synthetic:3x32x32", "-o", str(yaml_path)]) == 0
    capsys.readouterr()
    outputs = []
    for args in ([CIFAR, "--data", "synthetic:3x32x32"], [str(yaml_path)]):
        for extra in (["--json"], ["--layers", "--policy", "superneurons"]):
            assert plan.main(args + extra) == 0
            outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[2] and outputs[1] == outputs[3]
    assert json.loads(outputs[0])["learnable_params"] == 145_578


def test_sn_convert_add_loss_makes_a_deploy_file_trainable(tmp_path, capsys):
    src = tmp_path / "squeezenet.prototxt"
    src.write_text(zoo.squeezenet(size=48, batch=2))
    out = tmp_path / "squeezenet.yaml"
    assert convert.main([str(src), "--add-loss", "-o", str(out)]) == 0
    text = out.read_text()
    assert "type: SoftmaxWithLoss" in text and "type: Softmax," not in text
    assert train.main([str(out), "--iters", "2", "--test-interval", "0", "--display", "1"]) == 0
    assert "done: trained SqueezeNet_v1.1 for 2 iterations" in capsys.readouterr().out


def test_lenet_train_test_trains_on_synthetic_data(capsys):
    status = train.main([LENET, "--data", "synthetic:1x28x28", "--batch", "4", "--iters", "3",
                         "--display", "1", "--test-interval", "0"])
    out = capsys.readouterr().out
    assert status == 0 and "431,080 parameters" in out and "sample 1x28x28" in out
    losses = [float(line.split("loss ")[1].split()[0]) for line in out.splitlines() if line.startswith("iter ")]
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)


@pytest.mark.slow
def test_inception_v3_trains_a_few_iterations_at_a_small_size(tmp_path, capsys):
    """Its smallest input (75x75: 1x1 after mixed_7a), BatchNorm on batch statistics as in a
    train file, with a loss added by sn-convert."""
    src = tmp_path / "inception_v3.prototxt"
    src.write_text(zoo.inception_v3(size=75, batch=2, global_stats=False))
    out = tmp_path / "inception_v3.yaml"
    assert convert.main([str(src), "--add-loss", "-o", str(out)]) == 0
    assert train.main([str(out), "--iters", "2", "--test-interval", "0", "--display", "1"]) == 0
    text = capsys.readouterr().out
    assert "23,834,568 parameters" in text and "done: trained Inception-v3 for 2 iterations" in text
    losses = [float(line.split("loss ")[1].split()[0]) for line in text.splitlines() if line.startswith("iter ")]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)
