"""SSD's detection nets as their real files are (tests/caffe/zoo_ssd.py writes them layer for
layer): MobileNet-SSD deploy and train and SSD300 plan with the learnable parameter counts of
the real files (every learnable blob, lr_mult 0 included, BatchNorm statistics apart: counted
by hand below from the files' numbers), the train file trains on synthetic boxes at a small
size, synthetic boxes are Caffe's annotated label blob, and every policy gives baseline's
bits on a small net of SSD's shape."""

import json
import math
import sys

import numpy as np
import pytest
from one_line import raises_one_line

from superneuron.cli import plan, train
from superneuron.data.batches import Loader
from superneuron.data.sources import open_source
from superneuron.errors import SpecError
from superneuron.graph import Graph
from superneuron.net import Net
from superneuron.netfile.spec import prototxt_spec
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig

sys.path.insert(0, "tests/caffe")
import zoo_ssd  # noqa: E402


def conv(ci, co, k, bias=True):
    return ci * co * k * k + (co if bias else 0)


def mobilenet_ssd_count(train):
    """MobileNetSSD_train.prototxt: bias-free convolutions, each with a Scale (weight and bias);
    MobileNetSSD_deploy.prototxt: the BatchNorm merged, every convolution with a bias."""
    extra = (lambda c: 2 * c) if train else (lambda c: 0)
    n, cin = conv(3, 32, 3, not train) + extra(32), 32
    for cout in (64, 128, 128, 256, 256, 512, 512, 512, 512, 512, 512, 1024, 1024):
        n += conv(1, cin, 3, not train) + extra(cin) + conv(cin, cout, 1, not train) + extra(cout)
        cin = cout
    for a, b, k in ((1024, 256, 1), (256, 512, 3), (512, 128, 1), (128, 256, 3), (256, 128, 1), (128, 256, 3),
                    (256, 64, 1), (64, 128, 3)):
        n += conv(a, b, k, not train) + extra(b)
    for c, loc, conf in ((512, 12, 63), (1024, 24, 126), (512, 24, 126), (256, 24, 126), (256, 24, 126),
                         (128, 24, 126)):
        n += conv(c, loc, 1) + conv(c, conf, 1)
    return n


def ssd300_count():
    """VGG_VOC0712_SSD_300x300's deploy.prototxt: VGG-16's convolutions, fc6 (3x3, dilation 6)
    and fc7 as convolutions, the extra layers, conv4_3_norm's 512 scales, the 3x3 heads."""
    widths = [(3, 64), (64, 64), (64, 128), (128, 128), (128, 256), (256, 256), (256, 256), (256, 512), (512, 512),
              (512, 512), (512, 512), (512, 512), (512, 512)]
    n = sum(conv(a, b, 3) for a, b in widths) + conv(512, 1024, 3) + conv(1024, 1024, 1)
    n += conv(1024, 256, 1) + conv(256, 512, 3) + sum(conv(a, 128, 1) + conv(128, 256, 3) for a in (512, 256, 256))
    n += 512
    for c, loc, conf in ((512, 16, 84), (1024, 24, 126), (512, 24, 126), (256, 24, 126), (256, 16, 84), (256, 16, 84)):
        n += conv(c, loc, 3) + conv(c, conf, 3)
    return n


@pytest.mark.parametrize("name, text, data, count, priors", [
    ("MobileNetSSD_deploy", zoo_ssd.mobilenet_ssd_deploy, None, mobilenet_ssd_count(False), 1917),
    ("MobileNetSSD_train", zoo_ssd.mobilenet_ssd_train, "synthetic", mobilenet_ssd_count(True), 1917),
    ("SSD300_deploy", zoo_ssd.ssd300_deploy, None, ssd300_count(), 8732),
    ("SSD300_train", zoo_ssd.ssd300_train, "synthetic", ssd300_count(), 8732),
])
def test_real_files_plan_with_their_exact_counts(tmp_path, capsys, name, text, data, count, priors):
    assert count in (5_783_417, 5_796_089, 26_285_486)  # SSD300: the paper's 26.3 M
    path = tmp_path / f"{name}.prototxt"
    path.write_text(text())
    graph = Graph(prototxt_spec(path.read_text(), str(path), data=data))
    assert sum(math.prod(t.shape) for t in graph.tensors.values() if t.kind == "param") == count
    assert graph.tensors["mbox_priorbox"].shape == (1, 2, priors * 4)
    first = next(n for n in graph.nodes if n.layer.type == "Permute")  # permute_param { order: 0 2 3 1 }
    n, c, h, w = graph.tensors[first.bottoms[0]].shape
    assert graph.tensors[first.tops[0]].shape == (n, h, w, c) and first.layer.order == (0, 2, 3, 1)
    assert plan.main([str(path), "--json"] + (["--data", data] if data else [])) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["learnable_params"] == count


def test_mobilenet_ssd_train_trains_on_synthetic_boxes(tmp_path, capsys):
    path = tmp_path / "MobileNetSSD_train.prototxt"
    path.write_text(zoo_ssd.mobilenet_ssd_train())
    status = train.main([str(path), "--data", "synthetic:3x64x64", "--batch", "2", "--iters", "3",
                         "--display", "1", "--test-interval", "0"])
    out = capsys.readouterr().out
    assert status == 0 and "5,796,089 parameters" in out and "no test" in out  # no TEST loss: no pass
    losses = [float(line.split("loss ")[1].split()[0]) for line in out.splitlines() if line.startswith("iter ")]
    assert len(losses) == 3 and all(math.isfinite(v) and v > 0 for v in losses)


@pytest.mark.slow
def test_ssd300_train_trains_at_its_smallest_size(tmp_path, capsys):
    """268 x 268: conv9_2 (3x3, no pad) still has a 1x1 map; superneurons, as memory asks."""
    path = tmp_path / "SSD300_train.prototxt"
    path.write_text(zoo_ssd.ssd300_train())
    status = train.main([str(path), "--data", "synthetic:3x268x268", "--batch", "1", "--iters", "2",
                         "--display", "1", "--test-interval", "0", "--policy", "superneurons"])
    out = capsys.readouterr().out
    assert status == 0 and "26,285,486 parameters" in out and "no test" in out
    losses = _losses(out)
    assert len(losses) == 2 and all(math.isfinite(v) and v > 0 for v in losses)


def test_annotated_lmdb_is_refused_in_one_line():
    with raises_one_line(SpecError, match="layer 'data' \\(AnnotatedData\\): annotated LMDB "
                         "'/home/yaochuanqi/.*' is not read here .* --data synthetic"):
        prototxt_spec(zoo_ssd.mobilenet_ssd_train(), "MobileNetSSD_train.prototxt")


def test_synthetic_boxes_are_caffes_annotated_label_blob():
    cfg = {"source": "synthetic", "boxes": 3, "classes": 5, "size": 24, "samples": 10, "batch_size": 4}
    train_set, test_set = open_source(cfg)
    x, y = Loader(train_set, 4, seed=1).next()
    assert x.shape == (4, 3, 24, 24) and y.shape == (1, 1, 12, 8)
    rows = y.reshape(12, 8)
    np.testing.assert_array_equal(rows[:, 0], np.repeat(np.arange(4), 3))  # the image in the batch
    assert set(rows[:, 1]) <= {1, 2, 3, 4} and (rows[:, 3:7] >= 0).all() and (rows[:, 3:7] <= 1).all()
    assert (rows[:, 5] > rows[:, 3]).all() and (rows[:, 6] > rows[:, 4]).all()
    again, _ = Loader(train_set, 4, seed=1).next()
    np.testing.assert_array_equal(again, x)  # drawn from the seed, not stored
    _, y_test, valid = next(Loader(test_set, 4, shuffle=False, train=False).epoch())
    assert valid == 2 and (y_test.reshape(4, 3, 8)[valid:, :, 0] == -1).all()  # padding: image -1


# -- every policy gives baseline's bits on a net of SSD's shape ---------------------------------------
POLICIES = ("liveness", "recompute", "offload", "superneurons", "gist", "optimal")


@pytest.fixture(scope="module")
def tiny():
    spec = prototxt_spec(zoo_ssd.tiny_ssd(), "tiny_ssd.prototxt")
    rng = np.random.default_rng(0)
    label = np.array([[0, 1, 0, .1, .1, .5, .6, 0], [0, 2, 1, .4, .3, .9, .8, 0], [1, 3, 0, .2, .2, .7, .7, 0],
                      [-1, 0, 0, 0, 0, 0, 0, 0]], np.float32).reshape(1, 1, 4, 8)
    feed = {"data": rng.standard_normal((2, 3, 16, 16)).astype(np.float32), "label": label}
    base = Net(spec, policy="baseline")
    loss = base.forward_backward(feed)
    return spec, feed, base, loss


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_gives_baselines_bits(tiny, policy):
    spec, feed, base, loss = tiny
    assert np.isfinite(loss) and loss > 0
    net = Net(spec, policy=policy)
    assert net.forward_backward(feed) == loss
    for name in base.learnable_names:
        np.testing.assert_array_equal(net.grad(name), base.grad(name), err_msg=f"{policy}: {name}")
    assert net.peak_bytes == net.plans["train"].peak_bytes  # plan equals run


def test_tiny_ssd_learns_its_boxes(tiny):
    spec, feed, _, _ = tiny
    nets = {p: Net(spec, policy=p, optimizer=make_optimizer(SolverConfig(base_lr=0.01)))
            for p in ("baseline", "superneurons")}
    steps = {p: [net.train_step(feed, it) for it in range(6)] for p, net in nets.items()}
    assert steps["superneurons"] == steps["baseline"]
    assert steps["baseline"][-1] < 0.8 * steps["baseline"][0]


def test_ssd_files_round_trip_through_yaml(tiny):
    from test_caffe_roundtrip import _learnable, _round_trip

    from superneuron.planning import plan as make_plan
    _, feed, _, loss = tiny
    for text in (zoo_ssd.tiny_ssd(), zoo_ssd.mobilenet_ssd_deploy(size=64)):
        original, again = _round_trip(text, "ssd.prototxt")
        graphs = [Graph(original), Graph(again)]
        assert _learnable(graphs[0]) == _learnable(graphs[1])
        assert make_plan(graphs[0], "liveness")[1].peak_bytes == make_plan(graphs[1], "liveness")[1].peak_bytes
    assert Net(_round_trip(zoo_ssd.tiny_ssd(), "t.prototxt")[1]).forward_backward(feed) == loss  # same weights: seed 0


def _losses(out):
    return [float(line.split("loss ")[1].split()[0]) for line in out.splitlines() if line.startswith("iter ")]


def test_data_with_boxes_and_an_input_net_train_alike_on_synthetic_boxes(tmp_path, capsys):
    """A YAML Data layer with ``boxes: 2`` and the Input net of the same shapes given ``--data
    synthetic`` (its label input (1, 1, batch × 2, 8) says the boxes) see the same boxes."""
    from superneuron.netfile.caffe.prototxt import prototxt_tree
    from superneuron.netfile.caffe.yaml_out import tree_to_yaml
    text = tree_to_yaml(prototxt_tree(zoo_ssd.tiny_ssd(), "tiny.prototxt"), source="tiny.prototxt")
    head, layers = text.split("layers:\n", 1)
    data_net = tmp_path / "tiny_data.yaml"
    data_net.write_text("\n".join(line for line in head.splitlines() if not line.startswith("input:"))
                        + "\nlayers:\n  - {name: data, type: Data, top: [data, label], source: synthetic, "
                        "batch_size: 2, size: 16, boxes: 2, classes: 4}\n" + layers)
    input_net = tmp_path / "tiny.prototxt"
    input_net.write_text(zoo_ssd.tiny_ssd())
    runs = []
    for args in ([str(data_net)], [str(input_net), "--data", "synthetic"]):
        assert train.main(args + ["--iters", "12", "--display", "4", "--test-interval", "0"]) == 0
        runs.append(_losses(capsys.readouterr().out))
    assert runs[0] == runs[1] and len(runs[0]) == 3 and runs[0][-1] < runs[0][0]


@pytest.mark.parametrize("policy, placement", [("liveness", "planned"), ("recompute", "dynamic"),
                                               ("superneurons", "dynamic"), ("gist", "dynamic")])
def test_what_the_kernels_touched_is_what_the_plan_said(monkeypatch, tiny, policy, placement):
    # the witness of test_plan_equals_run.py on the small SSD net, fed its boxes
    import test_plan_equals_run as witness

    from superneuron.netfile.caffe.prototxt import prototxt_tree
    from superneuron.netfile.caffe.yaml_out import tree_to_yaml
    monkeypatch.setitem(witness.TEXTS, "tiny_ssd", tree_to_yaml(prototxt_tree(zoo_ssd.tiny_ssd(), "tiny.prototxt")))
    monkeypatch.setattr(witness, "feed_for", lambda net: tiny[1])
    witness.test_what_the_kernels_touched_is_what_the_plan_said(monkeypatch, "tiny_ssd", policy, placement)
