"""Prototxt files in the forms the segmentation and detection nets of the model zoo write
(FCN's Crop and bilinear Deconvolution, SegNet's pooling masks and Upsample, PSPNet's Interp,
SSD's Normalize): read, planned with their exact learnable parameter count, and trained."""

import math

import numpy as np

from superneuron.graph import Graph
from superneuron.net import Net
from superneuron.netfile.spec import prototxt_spec

FCN = '''name: "fcn_head"
input: "data" input_shape { dim: 1 dim: 3 dim: 32 dim: 32 }
input: "label" input_shape { dim: 1 dim: 1 dim: 32 dim: 32 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 8 kernel_size: 3 pad: 1 stride: 2 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "score" type: "Convolution" bottom: "conv1" top: "score"
        convolution_param { num_output: 5 kernel_size: 1 } }
layer { name: "upscore" type: "Deconvolution" bottom: "score" top: "upscore" param { lr_mult: 0 }
        convolution_param { num_output: 5 bias_term: false kernel_size: 4 stride: 2 group: 5
                            weight_filler { type: "bilinear" } } }
layer { name: "crop" type: "Crop" bottom: "upscore" bottom: "data" top: "crop" crop_param { axis: 2 offset: 1 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "crop" bottom: "label" top: "loss"
        loss_param { ignore_label: 255 normalize: false } }
'''

SEGNET = '''name: "segnet_head"
input: "data" input_shape { dim: 2 dim: 3 dim: 16 dim: 16 }
input: "label" input_shape { dim: 2 dim: 1 dim: 16 dim: 16 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" top: "pool1_mask"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "upsample1" type: "Upsample" bottom: "pool1" bottom: "pool1_mask" top: "up1" upsample_param { scale: 2 } }
layer { name: "norm" type: "Normalize" bottom: "up1" top: "norm"
        norm_param { across_spatial: false channel_shared: false scale_filler { type: "constant" value: 20 } } }
layer { name: "interp" type: "Interp" bottom: "norm" top: "interp" interp_param { height: 16 width: 16 } }
layer { name: "score" type: "Convolution" bottom: "interp" top: "score"
        convolution_param { num_output: 3 kernel_size: 1 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "score" bottom: "label" top: "loss"
        loss_param { ignore_label: 255 normalization: VALID } }
'''


def _learnable(graph):
    return sum(math.prod(t.shape) for t in graph.tensors.values() if t.kind == "param")


def test_fcn_crop_and_bilinear_deconvolution():
    spec = prototxt_spec(FCN, "fcn.prototxt")
    graph = Graph(spec)
    # conv1 3*8*9 + 8, score 8*5 + 5, upscore (grouped, lr_mult 0 but learnable) 5*1*4*4
    assert _learnable(graph) == 3 * 8 * 9 + 8 + 8 * 5 + 5 + 5 * 16
    assert graph.tensors["crop"].shape == (1, 5, 32, 32)
    net = Net(spec)
    k = net.param("upscore/weight")
    ramp = np.array([0.25, 0.75, 0.75, 0.25], dtype=np.float32)
    np.testing.assert_array_equal(k[2, 0], np.outer(ramp, ramp))  # Caffe's bilinear filler


def test_segnet_upsample_normalize_interp_train_with_ignored_pixels():
    spec = prototxt_spec(SEGNET, "segnet.prototxt")
    graph = Graph(spec)
    assert _learnable(graph) == 3 * 4 * 9 + 4 + 4 + 4 * 3 + 3  # conv1, Normalize's scale, score
    from superneuron.train.optim import make_optimizer
    from superneuron.train.solver_config import SolverConfig
    net = Net(spec, optimizer=make_optimizer(SolverConfig(base_lr=0.1)), policy="superneurons")
    assert (net.param("norm/scale") == 20).all()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    y = (x[:, :1] > 0).astype(np.float32) + (x[:, 1:2] > 1)
    y[:, :, :4] = 255  # a band of ignored pixels
    losses = [net.train_step({"data": x, "label": y}, it) for it in range(8)]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
