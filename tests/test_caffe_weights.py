"""Caffe .caffemodel weights: read by layer name (copied, skipped, refused with both shapes,
BatchNorm's three blobs as its statistics, legacy 4-D blobs), written so that they read back
bit for bit, and the round trip snapshot → .caffemodel → --weights giving identical outputs."""

import glob
import os

import numpy as np
import pytest

from superneuron.cli import convert, train
from superneuron.errors import SNError
from superneuron.net import load_net
from superneuron.netfile.caffe import caffe_pb2
from superneuron.netfile.caffe.weights import load_weights, read_caffemodel

NET = "tests/nets/digits_bn.yaml"


def blob(array, legacy=False):
    b = caffe_pb2.BlobProto()
    a = np.asarray(array, np.float32)
    if legacy:  # Caffe's old files: num, channels, height, width
        b.num, b.channels, b.height, b.width = (1,) * (4 - a.ndim) + a.shape
    else:
        b.shape.dim.extend(a.shape)
    b.data.extend(a.ravel().tolist())
    return b


def test_a_file_built_with_protobuf_from_known_arrays(tmp_path):
    rng = np.random.default_rng(0)
    known = {"conv1": [rng.standard_normal((16, 1, 3, 3))],
             "bn1": [rng.standard_normal(16), rng.random(16) + 0.5, [7.0]],
             "scale2": [rng.standard_normal(16), rng.standard_normal(16)],  # the layer has 32 channels
             "fc": [rng.standard_normal((10, 32)), rng.standard_normal(10)],
             "ghost": [rng.standard_normal(3)]}
    net_param = caffe_pb2.NetParameter(name="digits_bn")
    for name, arrays in known.items():
        if name == "fc":  # as V1 files write an InnerProduct: 4-D legacy blobs
            lp = net_param.layers.add(name=name, type=caffe_pb2.V1LayerParameter.INNER_PRODUCT)
            lp.blobs.extend(blob(a, legacy=True) for a in arrays)
        else:
            lp = net_param.layer.add(name=name, type="X")
            lp.blobs.extend(blob(a) for a in arrays)
    path = tmp_path / "known.caffemodel"
    path.write_bytes(net_param.SerializeToString())

    net = load_net(NET)
    before = {p: net.param(p) for p in net.param_names}
    report = load_weights(net, path)
    assert report["copied"] == ["conv1", "bn1", "fc"]
    assert report["skipped"] == ["scale1", "conv2", "bn2"]
    assert report["refused"] == [("scale2", "blob 0 has shape (16,) in the file, (32,) here")]
    assert report["unused"] == ["ghost"]
    for name, param in (("conv1", "conv1/weight"), ("fc", "fc/weight"), ("fc", "fc/bias")):
        index = 0 if param.endswith("weight") else 1
        np.testing.assert_array_equal(net.param(param), np.asarray(known[name][index], np.float32))
    # BatchNorm's blobs are Caffe's running sums and their scale factor, kept as they are
    for k, p in enumerate(("bn1/mean", "bn1/variance", "bn1/scale_factor")):
        np.testing.assert_array_equal(net.param(p), np.asarray(known["bn1"][k], np.float32))
    for p in ("scale2/weight", "conv2/weight", "bn2/mean"):  # refused and skipped keep their values
        np.testing.assert_array_equal(net.param(p), before[p])


def test_not_a_caffemodel_is_one_line(tmp_path):
    path = tmp_path / "bad.caffemodel"
    path.write_bytes(b"\xff\xff\xff\xff garbage")
    with pytest.raises(SNError, match=r"bad.caffemodel: not a Caffe .caffemodel"):
        read_caffemodel(path)


def test_snapshot_to_caffemodel_to_weights_gives_identical_outputs(tmp_path, capsys):
    snaps = tmp_path / "snaps"
    assert train.main([NET, "--iters", "3", "--batch", "8", "--test-interval", "0", "--snapshot", str(snaps),
                       "--snapshot-format", "caffemodel"]) == 0
    out = capsys.readouterr().out
    (npz,) = glob.glob(str(snaps / "*.npz"))
    written = npz[:-4] + ".caffemodel"
    assert f"weights: {written}" in out and os.path.isfile(written)
    converted = tmp_path / "converted.caffemodel"
    assert convert.main([npz, "--net", NET, "-o", str(converted)]) == 0
    assert converted.read_bytes() == open(written, "rb").read()  # the same weights, the same bytes

    trained = load_net(NET)
    with np.load(npz, allow_pickle=False) as z:
        for key in z.files:
            if key.startswith("param:"):
                trained.set_param(key[6:], z[key])
    fresh = load_net(NET, seed=123)
    assert load_weights(fresh, converted)["copied"] == ["conv1", "bn1", "scale1", "conv2", "bn2", "scale2", "fc"]
    rng = np.random.default_rng(1)
    feed = {"data": rng.random(trained.input_shape("data"), dtype=np.float32),
            "label": rng.integers(0, 10, trained.input_shape("label")).astype(np.float32)}
    a, b = trained.forward(feed), fresh.forward(feed)
    assert a == b and np.array_equal(trained.blob("fc"), fresh.blob("fc"))


def test_sn_train_weights_reports_each_layer(tmp_path, capsys):
    net_param = caffe_pb2.NetParameter()
    net_param.layer.add(name="conv1", type="Convolution").blobs.append(blob(np.zeros((16, 1, 5, 5))))
    path = tmp_path / "w.caffemodel"
    path.write_bytes(net_param.SerializeToString())
    assert train.main([NET, "--iters", "1", "--batch", "4", "--test-interval", "0", "--weights", str(path)]) == 0
    out = capsys.readouterr().out
    assert "copied 0 layers, skipped 6 (not in the file), refused 1, unused 0" in out
    assert "weights: refused conv1: blob 0 has shape (16, 1, 5, 5) in the file, (16, 1, 3, 3) here" in out
