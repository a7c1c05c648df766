"""What SegNet's, PSPNet's and ENet's files need beyond stock Caffe: the forks' BN layer (read
as BatchNorm and Scale), DenseImageData (read as an Input), SoftmaxWithLoss's class weighting
(SegNet's weight_by_label_freqs) against PyTorch, and Accuracy's per-class top (stock Caffe's)."""

import numpy as np
import pytest
import torch
from layer_harness import backward, build, forward, gradcheck
from one_line import raises_one_line

from superneuron.errors import LayerError, SpecError
from superneuron.graph import Graph
from superneuron.netfile.spec import prototxt_spec

WEIGHTS = [0.5, 2.0, 1.0, 3.0]


def _scores_and_labels(rng, n=2, c=4, h=3, w=5, ignore=4):
    x = rng.standard_normal((n, c, h, w))
    labels = rng.integers(0, c, (n, 1, h, w)).astype(np.float64)
    labels[0, 0, 0] = ignore  # a row of ignored pixels
    return x, labels


def test_class_weighted_softmax_loss_is_segnets_against_pytorch():
    rng = np.random.default_rng(0)
    x, labels = _scores_and_labels(rng)
    layer, params = build("SoftmaxWithLoss", [x.shape, labels.shape], ignore_label=4,
                          weight_by_label_freqs=True, class_weighting=WEIGHTS)
    (loss,) = forward(layer, [x, labels], params)
    # SegNet's: sum of weight[label] * -log p[label] over the labels that count, divided by
    # their (unweighted) count
    t = torch.tensor(x, requires_grad=True)
    target = torch.tensor(labels[:, 0], dtype=torch.long)
    terms = torch.nn.functional.cross_entropy(t, target, weight=torch.tensor(WEIGHTS, dtype=torch.float64),
                                              ignore_index=4, reduction="sum")
    want = terms / (target != 4).sum()
    np.testing.assert_allclose(loss, want.item(), rtol=1e-12)
    want.backward()
    (dx, _), _ = backward(layer, [x, labels], [loss], [np.array(1.0)], params)
    np.testing.assert_allclose(dx, t.grad.numpy(), rtol=1e-10, atol=1e-15)
    gradcheck(layer, [x, labels], params)


def test_class_weighting_needs_one_weight_per_class():
    with raises_one_line(LayerError, match="one class_weighting per class: 4 given for 5 classes"):
        build("SoftmaxWithLoss", [(2, 5, 3, 3), (2, 1, 3, 3)], weight_by_label_freqs=True, class_weighting=WEIGHTS)


def test_accuracy_per_class_top_is_caffes():
    rng = np.random.default_rng(1)
    x, labels = _scores_and_labels(rng, ignore=2)
    layer, params = build("Accuracy", [x.shape, labels.shape], n_tops=2, ignore_label=2)
    overall, per_class = forward(layer, [x, labels], params)
    predicted, truth = x.argmax(axis=1), labels[:, 0]
    counted = truth != 2
    assert per_class.shape == (4,)
    for k in range(4):
        mine = counted & (truth == k)
        want = (predicted[mine] == k).mean() if mine.any() else 0.0  # Caffe: 0 for a class without labels
        assert per_class[k] == pytest.approx(want)
    assert per_class[2] == 0.0 and overall == pytest.approx((predicted == truth)[counted].mean())
    # SegNet's void class (label 4 of 4 classes, no ignore_label written) is left out of both
    void = labels.copy()
    void[:, 0][truth == 2] = 4
    layer, params = build("Accuracy", [x.shape, labels.shape], n_tops=2)
    assert [float(v) for v in forward(layer, [x, void], params)[0].ravel()] == [pytest.approx(overall)]


BN_NET = '''name: "bn"
input: "data" input_shape { dim: 2 dim: 3 dim: 4 dim: 4 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 5 kernel_size: 3 } }
layer { name: "conv/bn" type: "BN" bottom: "conv" top: "conv"
        param { lr_mult: 1 decay_mult: 0 } param { lr_mult: 2 decay_mult: 0 }
        param { lr_mult: 0 decay_mult: 0 } param { lr_mult: 0 decay_mult: 0 }
        bn_param { scale_filler { type: "constant" value: 1.5 } shift_filler { type: "constant" value: 0.25 }
                   %s } }
'''


def test_the_forks_bn_is_batchnorm_and_scale_with_its_blobs_and_settings():
    spec = prototxt_spec(BN_NET % "moving_average: true decay: 0.05", "bn.prototxt")
    assert next(ls for ls in spec.layers if ls.name == "conv/bn.scale").lr_mult == (1.0, 2.0)
    graph = Graph(spec)
    norm, scale = graph.node("conv/bn"), graph.node("conv/bn.scale")
    assert (norm.layer.type, scale.layer.type) == ("BatchNorm", "Scale")
    assert norm.layer.cfg["moving_average_fraction"] == pytest.approx(0.95)
    assert not norm.layer.cfg["use_global_stats"]
    assert scale.layer.cfg["filler"]["value"] == 1.5 and scale.layer.cfg["bias_filler"]["value"] == 0.25
    learnable = [t for t in graph.tensors.values() if t.kind == "param" and t.name.startswith("conv/bn")]
    assert sorted(t.name for t in learnable) == ["conv/bn.scale/bias", "conv/bn.scale/weight"]
    assert all(t.shape == (5,) for t in learnable)  # scale and shift: 2 per channel, as the fork's
    inference = Graph(prototxt_spec(BN_NET % "bn_mode: INFERENCE", "bn.prototxt"))
    assert inference.node("conv/bn").layer.cfg["use_global_stats"]


def test_dense_image_data_is_an_input_of_the_given_shape():
    text = '''name: "d"
layer { name: "data" type: "DenseImageData" top: "data" top: "label"
        dense_image_data_param { source: "train.txt" batch_size: 2 label_divide_factor: 2 } }
layer { name: "score" type: "Convolution" bottom: "data" top: "score"
        convolution_param { num_output: 3 kernel_size: 1 stride: 2 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "score" bottom: "label" top: "loss" }
'''
    graph = Graph(prototxt_spec(text, "d.prototxt", data="synthetic:3x8x12"))
    assert graph.tensors["data"].shape == (2, 3, 8, 12) and graph.tensors["label"].shape == (2, 1, 4, 6)
    with raises_one_line(SpecError, match=r"d.prototxt:2:1: layer 'data' \(DenseImageData\): .*--data synthetic:CxHxW"):
        prototxt_spec(text, "d.prototxt")


def test_a_segnet_file_round_trips_through_yaml_with_its_fork_layers_as_ours():
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "caffe"))
    import families

    from superneuron.netfile.caffe.prototxt import prototxt_tree
    from superneuron.netfile.caffe.prototxt_out import spec_to_prototxt
    from superneuron.netfile.caffe.yaml_out import tree_to_yaml
    from superneuron.netfile.spec import loads_spec
    text = families.segnet_basic(batch=2)
    original = Graph(prototxt_spec(text, "segnet.prototxt", data="synthetic:3x24x32"))
    yaml_text = tree_to_yaml(prototxt_tree(text, "segnet.prototxt", "synthetic:3x24x32"), source="segnet.prototxt")
    again = Graph(prototxt_spec(spec_to_prototxt(loads_spec(yaml_text, "segnet.yaml")), "again.prototxt"))
    assert [n.layer.type for n in again.nodes] == [n.layer.type for n in original.nodes]
    assert [n.layer.cfg for n in again.nodes] == [n.layer.cfg for n in original.nodes]  # class weights too
