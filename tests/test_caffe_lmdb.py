"""Caffe's Data layer on LMDB: raw and encoded Datums (BGR, as Caffe stores them), Caffe's
transform ((x - mean) * scale, crop centred in TEST and random in TRAIN, mirror, mean_file),
the TEST layer's own source, sn-make-lmdb, read-ahead that changes nothing, LEVELDB refused,
and LeNet from lenet_train_test.prototxt + lenet_solver.prototxt learning the digits from an
LMDB as well as our YAML LeNet does."""

import json

import numpy as np
import pytest
from PIL import Image

from superneuron.cli import train
from superneuron.cli.make_lmdb import main as make_lmdb
from superneuron.data.batches import Loader
from superneuron.data.builtin import digits_arrays
from superneuron.data.dataset import split_by_class
from superneuron.data.lmdb_data import decode, index
from superneuron.data.readahead import ReadAhead
from superneuron.data.sources import open_source
from superneuron.errors import SpecError
from superneuron.netfile.caffe import caffe_pb2
from superneuron.netfile.spec import prototxt_spec


def make(tmp_path, x, y, x_test=None, y_test=None):
    npz = tmp_path / "d.npz"
    extra = {} if x_test is None else {"x_test": x_test, "y_test": y_test}
    np.savez(npz, x=x, y=y, **extra)
    assert make_lmdb([str(npz), str(tmp_path / "train_lmdb")]) == 0
    if x_test is not None:
        assert make_lmdb([str(npz), str(tmp_path / "test_lmdb"), "--split", "test"]) == 0
    return str(tmp_path / "train_lmdb")


def data_net(train_src, test_src, transform, batch=4):
    layers = []
    for phase, src in (("TRAIN", train_src), ("TEST", test_src)):
        layers.append(f'layer {{ name: "data" type: "Data" top: "data" top: "label" include {{ phase: {phase} }} '
                      f'transform_param {{ {transform} }} data_param {{ source: "{src}" batch_size: {batch} '
                      f'backend: LMDB }} }}')
    layers.append('layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
                  'inner_product_param { num_output: 3 } }')
    layers.append('layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }')
    return "\n".join(layers) + "\n"


def test_raw_records_hold_caffes_bgr_and_folders_encode_the_same_pixels(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (6, 3, 5, 7), dtype=np.uint8)
    y = np.array([0, 1, 2, 0, 1, 2])
    src = make(tmp_path, x, y)
    keys, labels, shape = index(src)
    assert shape == (3, 5, 7) and labels.tolist() == y.tolist() and len(keys) == 6
    import lmdb
    with lmdb.open(src, readonly=True, lock=False) as env, env.begin() as txn:
        pixels, label = decode(txn.get(keys[4]))
    np.testing.assert_array_equal(pixels, x[4, ::-1])  # RGB written as Caffe's BGR
    assert label == 1
    # the same images as PNG files in class folders, encoded and raw
    for i in range(6):
        folder = tmp_path / "photos" / f"class{y[i]}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(x[i].transpose(1, 2, 0)).save(folder / f"{i}.png")
    for flag in ([], ["--encoded"]):
        dest = tmp_path / f"folder_lmdb{len(flag)}"
        assert make_lmdb([str(tmp_path / "photos"), str(dest)] + flag) == 0
        cfg = {"source": str(dest), "batch_size": 2, "shuffle": False}
        train_set, _ = open_source(cfg)
        order = np.argsort(y, kind="stable")  # class folders in order, files sorted within
        np.testing.assert_array_equal(train_set.batch(np.arange(6)), x[order, ::-1].astype(np.float32))


def test_caffe_transform_mean_scale_crop_mirror_and_the_test_source(tmp_path):
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 256, (8, 3, 6, 6), dtype=np.uint8), rng.integers(0, 3, 8)
    xt, yt = rng.integers(0, 256, (4, 3, 6, 6), dtype=np.uint8), np.array([0, 1, 2, 1])
    src = make(tmp_path, x, y, xt, yt)
    text = data_net(src, str(tmp_path / "test_lmdb"),
                    "crop_size: 4 mirror: true scale: 0.5 mean_value: 10 mean_value: 20 mean_value: 30")
    spec = prototxt_spec(text, "t.prototxt")
    cfg = spec.layers[0].cfg
    assert cfg["test_source"] == str(tmp_path / "test_lmdb") and cfg["shuffle"] is False
    train_set, test_set = open_source(cfg)
    assert len(train_set) == 8 and len(test_set) == 4 and test_set.sample_shape == (3, 4, 4)
    mean = np.array([10, 20, 30], np.float32).reshape(3, 1, 1)
    expect = (xt[:, ::-1].astype(np.float32) - mean) * np.float32(0.5)
    np.testing.assert_allclose(test_set.batch(np.arange(4)), expect[:, :, 1:5, 1:5], rtol=1e-6)  # centred
    got = train_set.batch(np.arange(8), np.random.default_rng(3), train=True)
    full = (x[:, ::-1].astype(np.float32) - mean) * np.float32(0.5)
    for i in range(8):  # some 4x4 window, maybe mirrored
        windows = [w for oy in range(3) for ox in range(3) for w in (full[i, :, oy:oy + 4, ox:ox + 4],)]
        windows += [w[:, :, ::-1] for w in windows]
        assert any(np.allclose(got[i], w, rtol=1e-6) for w in windows)


def test_mean_file_is_subtracted_per_pixel_before_the_crop(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (3, 1, 4, 4), dtype=np.uint8)
    src = make(tmp_path, x, np.array([0, 1, 2]))
    mean = rng.random((1, 1, 4, 4)).astype(np.float32) * 100
    blob = caffe_pb2.BlobProto(num=1, channels=1, height=4, width=4)
    blob.data.extend(mean.ravel().tolist())
    (tmp_path / "mean.binaryproto").write_bytes(blob.SerializeToString())
    spec = prototxt_spec(data_net(src, src, f'crop_size: 2 mean_file: "{tmp_path}/mean.binaryproto"'), "m.prototxt")
    _, test = open_source(dict(spec.layers[1].cfg, test_source=src))
    np.testing.assert_allclose(test.batch(np.arange(3)), (x.astype(np.float32) - mean)[:, :, 1:3, 1:3], rtol=1e-6)


def test_leveldb_is_a_one_line_error_at_its_backend():
    text = data_net("a", "b", "scale: 1").replace("backend: LMDB", "backend: LEVELDB")
    with pytest.raises(SpecError) as e:
        prototxt_spec(text, "l.prototxt")
    assert all("backend LEVELDB is not read here (LMDB only" in p for p in e.value.problems)
    assert [p.split(": layer")[0] for p in e.value.problems] == ["l.prototxt:1:153", "l.prototxt:2:152"]
    assert all("layer 'data' (Data)" in p for p in e.value.problems)


def test_read_ahead_gives_the_same_batches_and_positions(tmp_path):
    rng = np.random.default_rng(4)
    src = make(tmp_path, rng.integers(0, 256, (10, 1, 3, 3), dtype=np.uint8), rng.integers(0, 3, 10))
    cfg = {"source": src, "batch_size": 3, "crop": 2, "mirror": True}
    dataset = open_source(cfg)[0]
    plain, ahead = Loader(dataset, 3, seed=5), ReadAhead(Loader(dataset, 3, seed=5))
    for step in range(7):
        assert plain.state() == ahead.state()
        (a, la), (b, lb) = plain.next(), ahead.next()
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)
        if step == 3:  # back to an earlier position, as a resume does
            saved = plain.state()
            plain.next()
            ahead.next()
            plain.restore(saved)
            ahead.restore(saved)
    ahead.close()


@pytest.mark.slow
def test_lenet_prototxt_and_solver_learn_the_digits_from_an_lmdb_as_our_yaml_lenet(tmp_path, capsys):
    x, y = digits_arrays(28)
    tr, te = split_by_class(y, 0.2, 0)
    u = np.round(x * 255).astype(np.uint8).reshape(len(x), 1, 28, 28)
    npz = tmp_path / "digits.npz"
    np.savez(npz, x=u[tr], y=y[tr], x_test=u[te], y_test=y[te])
    for split in ("train", "test"):
        assert make_lmdb([str(npz), str(tmp_path / f"mnist_{split}_lmdb"), "--split", split]) == 0
    net = open("tests/caffe/lenet_train_test.prototxt").read().replace("examples/mnist/", f"{tmp_path}/")
    (tmp_path / "lenet_train_test.prototxt").write_text(net)
    solver = open("tests/caffe/lenet_solver.prototxt").read().replace("max_iter: 10000", "max_iter: 80")
    solver = solver.replace("examples/mnist/", f"{tmp_path}/")  # its snapshot_prefix too
    (tmp_path / "lenet_solver.prototxt").write_text(solver)
    results = []
    for args in (["--solver", str(tmp_path / "lenet_solver.prototxt")],
                 ["nets/lenet.yaml", "--set", "size=28", "--set", "crop=0",
                  "--solver", str(tmp_path / "lenet_solver.prototxt")]):
        log = tmp_path / "log.jsonl"
        log.unlink(missing_ok=True)
        assert train.main(args + ["--batch", "16", "--test-interval", "0", "--log", str(log)]) == 0
        tests = [r for r in map(json.loads, log.read_text().splitlines()) if "test_accuracy" in r]
        assert tests[-1]["test_samples"] == len(te)
        results.append(tests[-1]["test_accuracy"])
    lmdb_acc, yaml_acc = results
    # Caffe's LeNet (no ReLU after its convolutions) learns at least as fast as ours from the same
    # digits: 100 % against 90.5 % after 120 iterations when this was written
    assert yaml_acc >= 0.8 and lmdb_acc >= yaml_acc - 0.02, results


def test_image_data_reads_a_list_resized_grey_or_bgr(tmp_path):
    rng = np.random.default_rng(6)
    images = [rng.integers(0, 256, (5 + i, 7, 3), dtype=np.uint8) for i in range(4)]  # differing sizes
    lines = []
    for i, im in enumerate(images):
        Image.fromarray(im).save(tmp_path / f"im{i}.png")
        lines.append(f"im{i}.png {i % 2}")
    (tmp_path / "train.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "test.txt").write_text("\n".join(lines[:2]) + "\n")
    for color in (True, False):
        text = "".join(
            f'layer {{ name: "data" type: "ImageData" top: "data" top: "label" include {{ phase: {phase} }} '
            f'transform_param {{ scale: 0.5 mean_value: 3 }} image_data_param {{ source: "{tmp_path}/{lst}" '
            f'root_folder: "{tmp_path}/" batch_size: 2 new_height: 4 new_width: 6 '
            f'is_color: {str(color).lower()} }} }}\n'
            for phase, lst in (("TRAIN", "train.txt"), ("TEST", "test.txt")))
        cfg = prototxt_spec(text + 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
                            'inner_product_param { num_output: 2 } }\n', "i.prototxt").layers[0].cfg
        train_set, test_set = open_source(cfg)
        assert len(train_set) == 4 and len(test_set) == 2 and train_set.labels.tolist() == [0, 1, 0, 1]
        got = train_set.batch(np.arange(4))
        for i, im in enumerate(images):
            pil = Image.fromarray(im).convert("RGB" if color else "L").resize((6, 4), Image.BILINEAR)
            x = np.asarray(pil, np.float32)
            x = x[:, :, ::-1].transpose(2, 0, 1) if color else x[None]
            np.testing.assert_allclose(got[i], (x - 3) * 0.5, rtol=1e-6)
