"""The habits of Caffe's files that a Caffe user brings (issue 32): fillers that read every
FillerParameter field, a typeless filler, a Data layer with one top, and the like."""

import numpy as np
import pytest

from superneuron.layers.fillers import bilinear, fill, parse_filler


def test_filler_ignores_fields_it_does_not_use():
    # bvlc_googlenet: weight_filler { type: "xavier" std: 0.1 }; Caffe's xavier reads no std
    assert parse_filler({"type": "xavier", "std": 0.1}) == parse_filler("xavier")
    assert parse_filler({"type": "constant", "value": 2, "std": 3, "mean": 1}) == {"type": "constant", "value": 2.0}


def test_filler_without_type_is_constant():
    # MobileNet's Scale layers: filler { value: 1 }
    assert parse_filler({"value": 1}) == {"type": "constant", "value": 1.0}
    assert (fill(np.random.default_rng(0), (3,), parse_filler({"value": 1}), 1, 1, np.float32) == 1).all()


def test_filler_refuses_a_field_caffe_does_not_have():
    with pytest.raises(ValueError, match="no option 'sdt'; did you mean 'std'"):
        parse_filler({"type": "gaussian", "sdt": 1})
    with pytest.raises(ValueError, match="variance_norm"):
        parse_filler({"type": "xavier", "variance_norm": "FAN_SIDEWAYS"})


@pytest.mark.parametrize("norm, fan", [("FAN_IN", 40), ("FAN_OUT", 90), ("AVERAGE", 65)])
def test_xavier_variance_norm_picks_the_fan(norm, fan):
    # Caffe: xavier is U(-sqrt(3/n), sqrt(3/n)) with n the fan variance_norm names
    values = fill(np.random.default_rng(0), (200_000,), parse_filler({"type": "xavier", "variance_norm": norm}),
                  40, 90, np.float64)
    bound = np.sqrt(3.0 / fan)
    assert values.max() <= bound and values.max() > 0.99 * bound
    assert abs(values.var() - 1.0 / fan) < 0.02 / fan


def test_bilinear_filler_is_caffes_upsampling_kernel():
    # Caffe's BilinearFiller for kernel 4 (stride 2): the ramp 0.25, 0.75, 0.75, 0.25
    k = bilinear((2, 1, 4, 4))
    ramp = np.array([0.25, 0.75, 0.75, 0.25])
    np.testing.assert_allclose(k[1, 0], np.outer(ramp, ramp))
    # kernel 2: f = 1, c = 0 → 1, 0 (stride 1: a copy)
    np.testing.assert_allclose(bilinear((1, 1, 2, 2))[0, 0], [[1, 0], [0, 0]])


CHAIN = """
name: chain
input: {data: [2, 3, 6, 6], label: [2]}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3, pad: 1}
  - {name: bn1, type: BatchNorm, bottom: conv1, top: conv1}
  - {name: sc1, type: Scale, bottom: conv1, top: conv1, bias_term: true}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: fc, type: InnerProduct, bottom: conv1, top: fc, num_output: 5}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
"""


def _net(text, tmp_path, name="net.yaml", **kw):
    from superneuron.net import load_net
    path = tmp_path / name
    path.write_text(text)
    return load_net(str(path), **kw)


def test_blob_of_an_in_place_chain_is_its_last_value(tmp_path):
    # pycaffe: net.blobs['conv1'] after conv1 → BatchNorm → Scale → ReLU in place is the ReLU's output
    net = _net(CHAIN, tmp_path)
    x = np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype(np.float32)
    net.forward({"data": x, "label": np.zeros(2, np.float32)})
    normed = net.blob("conv1@bn1")  # BatchNorm's output, which Scale and ReLU then overwrite
    gamma, beta = net.param("sc1/weight"), net.param("sc1/bias")
    scaled = normed * gamma[None, :, None, None] + beta[None, :, None, None]
    assert scaled.min() < 0  # so the ReLU changes something
    np.testing.assert_allclose(net.blob("conv1"), np.maximum(scaled, 0), rtol=1e-6, atol=1e-6)


def test_data_layer_with_one_top(tmp_path):
    # Caffe allows a Data layer of 1 top (images without labels: a segmentation net's masks)
    net = _net("""
name: one_top
layers:
  - {name: data, type: Data, top: data, source: synthetic, batch_size: 2, channels: 3, size: 8}
  - {name: mask, type: Data, top: mask, source: synthetic, batch_size: 2, channels: 1, size: 8}
  - {name: conv, type: Convolution, bottom: data, top: conv, num_output: 1, kernel_size: 1}
  - {name: loss, type: EuclideanLoss, bottom: [conv, mask], top: loss}
""", tmp_path)
    assert net.input_names == ["data", "mask"]
    assert net.input_shape("data") == (2, 3, 8, 8) and net.input_shape("mask") == (2, 1, 8, 8)
    x, m = np.ones((2, 3, 8, 8), np.float32), np.zeros((2, 1, 8, 8), np.float32)
    net.forward({"data": x, "mask": m})
    conv = net.blob("conv")
    assert np.isclose(net.outputs["loss"], (conv ** 2).sum() / 4, rtol=1e-5)


@pytest.mark.parametrize("name, message", [
    ("ROIPooling", "layer type 'ROIPooling' (from the Faster R-CNN fork) is not supported"),
    ("DetectionEvaluate", "(from the SSD fork) is not supported"),
    ("DepthwiseConvolution", "write Convolution with group equal to its channels"),
    ("WindowData", "layer type 'WindowData' (stock Caffe) is not implemented here"),
])
def test_fork_layers_are_named_not_misspelt(name, message):
    from superneuron.layers import layer_class
    with pytest.raises(KeyError) as e:
        layer_class(name)
    assert message in e.value.args[0] and "did you mean" not in e.value.args[0]


@pytest.mark.parametrize("name, suggestion", [("Convolutoin", "Convolution"), ("relu", "ReLU"),
                                              ("Poolling", "Pooling"), ("LRN2", "LRN")])
def test_misspellings_still_get_a_suggestion(name, suggestion):
    from superneuron.layers import layer_class
    with pytest.raises(KeyError, match=f"did you mean '{suggestion}'"):
        layer_class(name)


@pytest.mark.parametrize("name", ["RNNCell", "Attention2D", "GroupNormalization"])
def test_no_far_fetched_suggestion(name):
    from superneuron.layers import layer_class
    with pytest.raises(KeyError) as e:
        layer_class(name)
    assert "did you mean" not in e.value.args[0] and "known types:" in e.value.args[0]


TINY = "tests/nets/tiny.yaml"


def test_snapshot_prefix_writes_caffes_pair_and_resume_reads_it(tmp_path, capsys):
    # Caffe: snapshot: N with snapshot_prefix P writes P_iter_N.caffemodel and P_iter_N.solverstate
    from superneuron.cli.train import main
    from superneuron.netfile.caffe.weights import read_caffemodel
    prefix = tmp_path / "snaps" / "tiny"
    solver = tmp_path / "solver.yaml"
    solver.write_text(f"base_lr: 0.05\nmax_iter: 4\nsnapshot: 2\nsnapshot_prefix: {prefix}\n")
    assert main([TINY, "--solver", str(solver), "--test-interval", "0"]) == 0
    names = sorted(p.name for p in (tmp_path / "snaps").iterdir())
    assert names == ["tiny_iter_2.caffemodel", "tiny_iter_2.solverstate",
                     "tiny_iter_4.caffemodel", "tiny_iter_4.solverstate"]
    layers = read_caffemodel(str(prefix) + "_iter_4.caffemodel")
    assert layers["conv1"][0] == "Convolution" and layers["conv1"][1][0].shape == (4, 3, 3, 3)
    capsys.readouterr()
    assert main([TINY, "--solver", str(solver), "--iters", "6", "--test-interval", "0",
                 "--resume", str(prefix) + "_iter_4.solverstate"]) == 0
    assert "at iteration 4" in capsys.readouterr().out
    assert (tmp_path / "snaps" / "tiny_iter_6.caffemodel").exists()


def test_net_on_the_command_line_wins_over_the_solvers(tmp_path, capsys):
    # caffe train --solver S --model NET: the solver's net: need not exist here
    from superneuron.cli.train import main
    solver = tmp_path / "solver.prototxt"
    solver.write_text('net: "examples/nowhere/train_val.prototxt"\nbase_lr: 0.05\nlr_policy: "fixed"\n'
                      'max_iter: 2\n')
    assert main([TINY, "--solver", str(solver), "--test-interval", "0"]) == 0
    assert "trained tiny for 2 iterations" in capsys.readouterr().out


def test_synthetic_data_takes_the_classes_the_net_scores(tmp_path, capsys):
    # a net that predicts 7 classes from a Data layer that says nothing of classes (default 10)
    from superneuron.cli.train import main
    net = tmp_path / "seven.yaml"
    net.write_text("""
name: seven
layers:
  - {name: data, type: Data, top: [data, label], source: synthetic, batch_size: 4, size: 6, channels: 2}
  - {name: ip, type: InnerProduct, bottom: data, top: ip, num_output: 7}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}
""")
    assert main([str(net), "--iters", "2", "--test-interval", "0"]) == 0
    assert "trained seven for 2 iterations" in capsys.readouterr().out


def test_synthetic_data_classes_from_a_loss_fed_through_pooling(tmp_path, capsys):
    # NIN/SqueezeNet's head: the classes are a Convolution's, read through a global Pooling
    from superneuron.cli.train import main
    net = tmp_path / "nin.prototxt"
    net.write_text("""name: "nin"
layer { name: "data" type: "Data" top: "data" top: "label" transform_param { crop_size: 8 }
        data_param { source: "nowhere_lmdb" batch_size: 2 backend: LMDB } }
layer { name: "cccp" type: "Convolution" bottom: "data" top: "cccp" convolution_param { num_output: 5 kernel_size: 1 } }
layer { name: "pool" type: "Pooling" bottom: "cccp" top: "pool" pooling_param { pool: AVE global_pooling: true } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "pool" bottom: "label" top: "loss" }
""")
    assert main([str(net), "--data", "synthetic", "--iters", "2", "--test-interval", "0"]) == 0
    assert "trained nin for 2 iterations" in capsys.readouterr().out


def test_digits_are_replicated_over_the_channels_the_net_expects(tmp_path, capsys):
    from superneuron.data.sources import open_source, source_config
    grey, _ = open_source(source_config("digits", {"size": 8}))
    colour, _ = open_source(source_config("digits", {"size": 8, "channels": 3}))
    assert grey.sample_shape == (1, 8, 8) and colour.sample_shape == (3, 8, 8)
    from superneuron.cli.train import main
    assert main([TINY, "--data", "digits", "--set", "classes=10", "--iters", "2", "--test-interval", "0"]) == 0
    assert "sample 3x8x8" in capsys.readouterr().out
