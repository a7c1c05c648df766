"""Real model-zoo files of the families beyond classification (tests/caffe/families.py writes
them layer for layer): each plans with the exact learnable parameter count of the real file and
trains a few iterations on synthetic data of its shape at a small size (per-pixel labels with
ignored pixels; token sequences with continuation markers), every policy giving baseline's bits.

The reference counts were computed from the real files' text in a throwaway script (every
learnable blob, lr_mult 0 included, BatchNorm statistics apart), not from this project's code."""

import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "caffe"))

import families  # noqa: E402
from one_line import raises_one_line  # noqa: E402

from superneuron.errors import SpecError  # noqa: E402
from superneuron.graph import Graph  # noqa: E402
from superneuron.net import Net  # noqa: E402
from superneuron.netfile.rules import net_states  # noqa: E402
from superneuron.netfile.spec import prototxt_spec  # noqa: E402
from superneuron.train.optim import make_optimizer  # noqa: E402
from superneuron.train.solver_config import SolverConfig  # noqa: E402

h5py = pytest.importorskip("h5py")

# voc-fcn8s/train.prototxt (shelhamer/fcn.berkeleyvision.org): VGG-16's 13 convolutions, fc6 as
# a 7x7 convolution, fc7, score_fr, score_pool4, score_pool3, and the three Deconvolution layers
# (21x21 full kernels, lr_mult 0, no bias)
FCN8S_COUNT = 134_489_759
# examples/coco_caption/lstm_language_model.prototxt (BVLC/caffe): Embed 8801x1000 without bias,
# LSTM W_xc 4000x1000, b_c 4000, W_hc 4000x1000, predict 1000x8801 + 8801
LSTM_LM_COUNT = 25_614_801
# examples/coco_caption/lrcn.prototxt (BVLC/caffe) in its solver's train_state (stages
# freeze-convnet, factored, 2-layer): CaffeNet 60,965,224 (frozen copies included), Embed
# 8,801,000, lstm1 8,004,000, lstm2 with fc8 as its static input 12,004,000, predict 8,809,801
LRCN_COUNT = 98_584_025
LRCN_STAGES = ("freeze-convnet", "factored", "2-layer")


def learnable(graph):
    return sum(math.prod(t.shape) for t in graph.tensors.values() if t.kind == "param")


def sentences(steps, streams, vocab, seed=0):
    """Caffe's coco_caption batches: continuation markers (0 where a caption starts), the input
    words, and the targets (the next word; -1, ignored, after a caption's end)."""
    rng = np.random.default_rng(seed)
    cont = np.ones((steps, streams), np.float32)
    cont[0] = 0
    cont[rng.random((steps, streams)) < 0.2] = 0  # new captions start within the window
    words = rng.integers(1, vocab, (steps, streams)).astype(np.float32)
    target = np.roll(words, -1, axis=0)
    target[np.roll(cont, -1, axis=0) == 0] = -1  # the word before a new caption predicts nothing
    return {"cont_sentence": cont, "input_sentence": words, "target_sentence": target}


def write_sentences(folder, steps, streams, vocab, files=2):
    for split in ("train", "val"):
        os.makedirs(folder / split, exist_ok=True)
        paths = []
        for i in range(files):
            path = folder / split / f"chunk{i}.h5"
            with h5py.File(path, "w") as f:
                for name, value in sentences(steps, streams, vocab, seed=i).items():
                    f[name] = value
            paths.append(str(path))
        (folder / split / "hdf5_chunk_list.txt").write_text("\n".join(paths) + "\n")


def train(spec, feeds, policy, lr=0.05):
    net = Net(spec, optimizer=make_optimizer(SolverConfig(base_lr=lr, momentum=0.9)), policy=policy)
    return [net.train_step(feed, it) for it, feed in enumerate(feeds)]


def check_policies(spec, feeds, policies=("liveness", "superneurons"), lr=0.05):
    base = train(spec, feeds, "baseline", lr)
    assert np.isfinite(base).all()
    for policy in policies:
        assert train(spec, feeds, policy, lr) == base, policy
    return base


# -- FCN-8s ------------------------------------------------------------------------------------------
VOC_LAYERS = '''"""A stand-in for FCN's voc_layers.py: SBDDSegDataLayer's interface (param_str a dict's
repr, two tops, reshape then forward), synthetic images and per-pixel labels, 255 ignored."""
import caffe
import numpy as np

SIZE = {size}


class SBDDSegDataLayer(caffe.Layer):
    def setup(self, bottom, top):
        params = eval(self.param_str)
        if len(top) != 2:
            raise Exception("Need to define two tops: data and label.")
        self.mean = np.array(params["mean"])
        self.rng = np.random.default_rng(params["seed"])

    def reshape(self, bottom, top):
        image = self.rng.uniform(0, 255, (SIZE, SIZE, 3)) - self.mean
        self.data = image.transpose((2, 0, 1))
        label = (image[..., 0] > 0).astype(np.float32) + (image[..., 1] > 60)
        label[:, :2] = 255  # unlabelled border pixels
        self.label = label[np.newaxis, ...]
        top[0].reshape(1, *self.data.shape)
        top[1].reshape(1, *self.label.shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.data
        top[1].data[...] = self.label

    def backward(self, top, propagate_down, bottom):
        pass
'''


def test_fcn8s_plans_with_the_real_files_count_at_500():
    graph = Graph(prototxt_spec(families.fcn8s("input", 500, 1), "voc-fcn8s.prototxt"))
    assert learnable(graph) == FCN8S_COUNT
    assert graph.tensors["score"].shape == (1, 21, 500, 500)
    assert graph.tensors["upscore2"].shape[2:] == (34, 34)  # pad 100: 500 → fc6 16x16 → 34


def test_fcn8s_trains_with_its_python_data_layer_and_ignored_pixels(tmp_path, monkeypatch):
    (tmp_path / "voc_layers.py").write_text(VOC_LAYERS.format(size=24))
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = prototxt_spec(families.fcn8s("python", narrow=16), "voc-fcn8s.prototxt")
    graph = Graph(spec)
    assert graph.tensors["score"].shape == (1, 21, 24, 24) == graph.tensors["data"].shape[:1] + (21, 24, 24)
    # the data come from the Python layer itself: the same images each run, so every policy's
    # losses (normalize: false, the border ignored) are baseline's; a small rate, as FCN's
    # solver has for its loss summed over the pixels
    losses = check_policies(spec, [{}] * 4, policies=("superneurons",), lr=1e-7)
    assert losses[-1] < losses[0]


# -- the LSTM language model -------------------------------------------------------------------------
def test_lstm_language_model_plans_with_the_real_files_count(tmp_path):
    write_sentences(tmp_path, 20, 100, 8801, files=1)
    # the file as written: its TEST Accuracy (axis 1, the default) cannot read (20, 100) labels
    # for (20, 100, 8801) scores; Caffe's test net fails the same check
    with raises_one_line(SpecError, match=r"lstm_language_model.prototxt:\d+:\d+: layer 'accuracy' "
                                          r"\(Accuracy\): labels \(20,100\) hold 2000 values"):
        Graph(prototxt_spec(families.lstm_language_model(str(tmp_path)), "lstm_language_model.prototxt"))
    text = families.lstm_language_model(str(tmp_path), accuracy_block="accuracy_param")
    graph = Graph(prototxt_spec(text, "lstm_language_model.prototxt"))
    assert learnable(graph) == LSTM_LM_COUNT
    assert graph.tensors["predict"].shape == (20, 100, 8801)


@pytest.mark.parametrize("stages", [(), ("embed-drop", "lstm-drop")])
def test_lstm_language_model_trains_on_sentences_from_hdf5(tmp_path, stages):
    steps, streams, vocab = 6, 3, 40
    write_sentences(tmp_path, steps, streams, vocab)
    text = families.lstm_language_model(str(tmp_path), steps=steps, vocab=vocab, hidden=16,
                                        accuracy_block="accuracy_param")
    spec = prototxt_spec(text, "lstm_language_model.prototxt", states=net_states(stages, 0) if stages else None)
    graph = Graph(spec)
    assert {n.layer.type for n in graph.nodes} >= {"HDF5Data", "Embed", "LSTM", "InnerProduct"}
    assert ("Dropout" in {n.layer.type for n in graph.nodes}) == bool(stages)
    reader = graph.node("data").layer.batches()
    feeds = [reader.next() for _ in range(4)]
    assert (feeds[0]["target_sentence"] == -1).any()  # some targets ignored
    losses = check_policies(spec, feeds)
    if not stages:
        assert losses[-1] < losses[0]


# -- LRCN --------------------------------------------------------------------------------------------
def test_lrcn_plans_with_the_real_files_count_in_its_solvers_stages(tmp_path):
    write_sentences(tmp_path, 20, 100, 8801, files=1)
    text = families.lrcn(str(tmp_path))
    spec = prototxt_spec(text, "lrcn.prototxt", data="synthetic", states=net_states(LRCN_STAGES, 0))
    graph = Graph(spec)
    assert learnable(graph) == LRCN_COUNT
    assert graph.tensors["predict"].shape == (20, 100, 8801)
    assert graph.node("lstm2").bottoms[-1] == "fc8"  # factored: the image enters the second LSTM
    unfactored = Graph(prototxt_spec(text, "lrcn.prototxt", data="synthetic", states=net_states(["unfactored"], 0)))
    # one LSTM with fc8 as its static input (12,004,000) in place of the two (20,008,000)
    assert learnable(unfactored) == LRCN_COUNT - 8_004_000


def test_lrcn_trains_with_its_stages(tmp_path):
    steps, streams, vocab, crop = 4, 2, 30, 67  # 67: CaffeNet's pool5 is 1x1
    write_sentences(tmp_path, steps, streams, vocab)
    text = families.lrcn(str(tmp_path), steps=steps, streams=streams, crop=crop, vocab=vocab, hidden=12, narrow=8)
    spec = prototxt_spec(text, "lrcn.prototxt", data="synthetic", states=net_states(["factored", "2-layer"], 0))
    graph = Graph(spec)
    reader = graph.node("data.2").layer.batches()  # Caffe's second layer named "data"
    rng = np.random.default_rng(0)
    feeds = []
    for _ in range(2):
        feed = reader.next()
        feed["data"] = rng.standard_normal((streams, 3, crop, crop)).astype(np.float32)
        feed["label"] = np.zeros(streams, np.float32)
        feeds.append(feed)
    check_policies(spec, feeds, policies=("superneurons",))


# -- SegNet --------------------------------------------------------------------------------------------
# Models/segnet_basic_train.prototxt (alexgkendall/SegNet-Tutorial): conv1 3x64x7x7 + 64, conv2..4
# and conv_decode4..1 64x64x7x7 + 64 each, 8 BN layers of 64 scales and 64 shifts, conv_classifier
# 64x11 + 11
SEGNET_BASIC_COUNT = 1_416_587


# Models/segnet_train.prototxt: VGG-16's 13 convolutions with biases and BN, the decoder's 13
# (BN on all but conv1_1_D, 64 → 11)
SEGNET_COUNT = 29_449_355


def test_segnet_plans_with_the_real_files_count_at_camvids_size():
    graph = Graph(prototxt_spec(families.segnet(), "segnet_train.prototxt", data="synthetic:3x360x480"))
    assert learnable(graph) == SEGNET_COUNT
    assert graph.tensors["pool5_D"].shape == (4, 512, 23, 30)  # upsample_h: 23, upsample_w: 30
    assert graph.tensors["conv1_1_D"].shape == (4, 11, 360, 480)


def test_segnet_trains_small():
    spec = prototxt_spec(families.segnet(batch=2, height=24, width=32, narrow=8), "segnet_train.prototxt",
                         data="synthetic:3x24x32")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 24, 32)).astype(np.float32)
    label = rng.integers(0, 12, (2, 1, 24, 32)).astype(np.float32)  # 11: void, ignored
    losses = check_policies(spec, [{"data": x, "label": label}] * 3, policies=("superneurons",), lr=0.01)
    assert losses[-1] < losses[0]


def test_segnet_basic_plans_with_the_real_files_count_at_camvids_size():
    spec = prototxt_spec(families.segnet_basic(), "segnet_basic_train.prototxt", data="synthetic:3x360x480")
    graph = Graph(spec)
    assert learnable(graph) == SEGNET_BASIC_COUNT
    assert graph.tensors["upsample4"].shape == (4, 64, 45, 60)  # pad_out_h: 23 rows up to 45
    assert graph.tensors["conv_classifier"].shape == (4, 11, 360, 480)


def test_segnet_basic_trains_with_class_weights_and_ignored_pixels():
    spec = prototxt_spec(families.segnet_basic(batch=2), "segnet_basic_train.prototxt", data="synthetic:3x24x32")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 24, 32)).astype(np.float32)
    label = (x[:, :1] > 0).astype(np.float32) * 3 + (x[:, 1:2] > 0.5)
    label[:, :, :, :4] = 11  # CamVid's void class, ignored
    losses = check_policies(spec, [{"data": x, "label": label}] * 4, lr=0.01)
    assert losses[-1] < losses[0]


# -- PSPNet --------------------------------------------------------------------------------------------
# evaluation/prototxt/pspnet50_ADE20K_473.prototxt (hszhao/PSPNet): the three-conv stem, ResNet-50's
# bottlenecks (no biases), the pyramid's four 1x1 2048→512, conv5_4 3x3 4096→512, every BN's
# scale and shift (the statistics apart), conv6 512x150 + 150
PSPNET50_COUNT = 46_782_550


def test_pspnet50_plans_with_the_real_files_count_at_473():
    graph = Graph(prototxt_spec(families.pspnet50(), "pspnet50_ADE20K_473.prototxt"))
    assert learnable(graph) == PSPNET50_COUNT
    assert graph.tensors["conv5_3"].shape == (1, 2048, 60, 60)  # HoleConvolution's dilation keeps 1/8
    assert graph.tensors["conv5_3_concat"].shape == (1, 4096, 60, 60)
    assert graph.tensors["conv6_interp"].shape == (1, 150, 473, 473)
    assert graph.node("conv4_2_3x3").layer.cfg["dilation"] == (2, 2)


def test_pspnet50_trains_with_per_pixel_labels():
    spec = prototxt_spec(families.pspnet50(41, 6, narrow=16, loss=True), "pspnet50.prototxt")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 41, 41)).astype(np.float32)
    label = rng.integers(0, 150, (1, 1, 41, 41)).astype(np.float32)
    label[..., :5] = 255
    losses = check_policies(spec, [{"data": x, "label": label}] * 3, policies=("superneurons",), lr=0.01)
    assert losses[-1] < losses[0]


# -- ENet ----------------------------------------------------------------------------------------------
# prototxts/enet_train_encoder_decoder.prototxt (TimoSaemann/ENet): conv0_1, the bottlenecks' convs
# (asymmetric 5x1 + 1x5 in 2.3, 2.7, 3.3, 3.7; 2x2 Deconvolutions going up), the side branches'
# 1x1s, every BN's scale and shift, the encoder's PReLU slopes (one per channel), deconv6_0_0
ENET_COUNT = 372_551

SPATIAL_DROPOUT = '''"""A stand-in for ENet's spatial_dropout.py: SpatialDropoutLayer drops whole channels with
probability p in the TRAIN phase, the kept ones scaled by 1 / (1 - p). Its mask is drawn once
(a fixed seed), so that a recomputed forward gives the same values."""
import caffe
import numpy as np


class SpatialDropoutLayer(caffe.Layer):
    def setup(self, bottom, top):
        params = eval(self.param_str)
        self.p, self.train = float(params["p"]), params["phase"] == "TRAIN"

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)
        n, c = bottom[0].data.shape[:2]
        keep = np.random.default_rng(7).random((n, c, 1, 1)) >= self.p
        self.mask = keep / (1.0 - self.p) if self.train else np.ones((n, c, 1, 1))

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data * self.mask

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff * self.mask
'''


@pytest.fixture
def spatial_dropout(tmp_path, monkeypatch):
    (tmp_path / "spatial_dropout.py").write_text(SPATIAL_DROPOUT)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_enet_plans_with_the_real_files_count_at_its_size(spatial_dropout):
    graph = Graph(prototxt_spec(families.enet(), "enet_train_encoder_decoder.prototxt", data="synthetic"))
    assert learnable(graph) == ENET_COUNT
    assert graph.tensors["data"].shape == (3, 3, 512, 1024)  # new_height x new_width, as the file writes
    assert graph.tensors["deconv6_0_0"].shape == (3, 19, 512, 1024)
    assert graph.tensors["conv2_3_1_a"].shape == (3, 32, 62, 130)  # 5x1 with pad 1: 64x128 → 62x130


def test_enet_trains_with_its_python_spatial_dropout(spatial_dropout):
    spec = prototxt_spec(families.enet(batch=2), "enet.prototxt", data="synthetic:3x32x32")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    label = rng.integers(0, 19, (2, 1, 32, 32)).astype(np.float32)
    label[..., :3] = 255
    losses = check_policies(spec, [{"data": x, "label": label}] * 5, policies=("superneurons",), lr=0.1)
    assert losses[-1] < losses[0]
