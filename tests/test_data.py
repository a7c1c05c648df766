"""Data sources, loaders and the Input/Data layers: tiny files made in tmp_path for every source,
batches checked against values computed here, and every user error checked to name its file."""

import json
import os
import pickle

import numpy as np
from one_line import raises_one_line
from PIL import Image

from superneuron.data import sources as data
from superneuron.data.batches import Loader
from superneuron.errors import LayerError, SNError
from tests.layer_harness import build, forward


def write_npz(tmp_path, name="d.npz", **arrays):
    path = tmp_path / name
    np.savez(path, **arrays)
    return str(path)


def indexed_npz(tmp_path, n=10, c=2, h=6, w=5):
    """x[i, ch, r, col] = 1000 i + 100 ch + 10 r + col (so every value says where it came from),
    y[i] = i; the same arrays as the test split."""
    i, ch, r, col = np.meshgrid(np.arange(n), np.arange(c), np.arange(h), np.arange(w), indexing="ij")
    x = (1000 * i + 100 * ch + 10 * r + col).astype(np.float32)
    y = np.arange(n)
    return write_npz(tmp_path, x=x, y=y, x_test=x, y_test=y), x


def cfg(source, **kw):
    return dict(data.DEFAULTS, source=str(source), **kw)


def ids(loader, count):
    """Sample ids (the labels of an indexed set) of the next ``count`` training batches."""
    return [loader.next()[1].astype(int).tolist() for _ in range(count)]


# ---------------------------------------------------------------- sources


def test_npz_shapes_ranges_and_explicit_test_split(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (12, 7, 9), dtype=np.uint8)  # 3-D: one channel added
    xt = rng.integers(0, 256, (5, 7, 9), dtype=np.uint8)
    path = write_npz(tmp_path, x=x, y=np.arange(12) % 3, x_test=xt, y_test=np.array([0, 1, 2, 3, 1]))
    assert data.describe(cfg(path)) == ((1, 7, 9), 4)
    train, test = data.open_source(path)
    assert (len(train), len(test), train.num_classes, train.sample_shape) == (12, 5, 4, (1, 7, 9))
    xb, yb = Loader(train, 4, shuffle=False).next()
    assert xb.dtype == np.float32 and yb.dtype == np.float32 and xb.shape == (4, 1, 7, 9)
    np.testing.assert_allclose(xb[:, 0], x[:4] / 255.0, rtol=1e-6)  # uint8 → [0, 1]
    np.testing.assert_array_equal(yb, [0, 1, 2, 0])
    xb, yb, n = next(Loader(test, 8, train=False).epoch())
    np.testing.assert_allclose(xb[:5, 0], xt / 255.0, rtol=1e-6)


def test_npz_float_values_kept_and_split_by_fraction(tmp_path):
    x = np.random.default_rng(1).standard_normal((40, 3, 4, 4)).astype(np.float32) * 5
    y = np.repeat(np.arange(4), 10)
    path = write_npz(tmp_path, x=x, y=y.astype(np.float64))  # integral floats are fine as labels
    train, test = data.open_source(cfg(path, test_fraction=0.2))
    assert (len(train), len(test)) == (32, 8)
    assert np.all(np.bincount(test.labels) == 2)  # stratified: round(0.2 × 10) per class
    xb, yb, n = next(Loader(test, 8, train=False).epoch())
    # each test sample is one of the stored ones, values unchanged (floats are not rescaled)
    expect = x[y == yb[0]]
    assert any(np.array_equal(xb[0], e) for e in expect)


def test_digits_split_sizes_ranges_and_seed():
    train, test = data.open_source(cfg("digits", size=16))
    counts = np.bincount(np.concatenate([train.labels, test.labels]))
    assert len(train) + len(test) == 1797 == counts.sum()
    assert len(test) == sum(int(0.2 * c + 0.5) for c in counts)
    assert train.sample_shape == (1, 16, 16) and data.describe(cfg("digits", size=16)) == ((1, 16, 16), 10)
    assert data.describe(cfg("digits")) == ((1, 8, 8), 10)
    xb, yb, _ = next(Loader(test, len(test), train=False).epoch())
    assert xb.min() >= 0.0 and xb.max() <= 1.0 and xb.max() > 0.9
    t1 = data.open_source(cfg("digits", size=16, seed=1))[1]
    same = data.open_source(cfg("digits", size=16))[1]
    first = [next(Loader(t, 50, train=False).epoch())[0] for t in (t1, test)]
    assert not np.array_equal(*first)  # another seed, another split
    np.testing.assert_array_equal(same.labels, test.labels)


def test_synthetic_is_seeded_shaped_and_learnable():
    c = cfg("synthetic", size=8, channels=2, classes=5, samples=600, seed=3)
    assert data.describe(c) == ((2, 8, 8), 5)
    assert data.describe(cfg("synthetic")) == ((3, 32, 32), 10)
    train, test = data.open_source(c)
    assert len(train) + len(test) == 600 and train.sample_shape == (2, 8, 8)
    x, y = Loader(train, len(train), shuffle=False).next()
    again = Loader(data.open_source(c)[0], len(train), shuffle=False).next()[0]
    np.testing.assert_array_equal(x, again)
    other = Loader(data.open_source(dict(c, seed=4))[0], 10, shuffle=False).next()[0]
    assert not np.allclose(x[:10], other)
    # nearest class mean, fitted on train, scored on test: far above the 1/5 of chance
    means = np.stack([x[y == k].mean(0) for k in range(5)]).reshape(5, -1)
    xt, yt, n = next(Loader(test, len(test), train=False).epoch())
    dist = ((xt.reshape(len(xt), 1, -1) - means[None]) ** 2).sum(-1)
    assert np.mean(dist.argmin(1) == yt) > 0.9


def cifar_batch(path, n, offset):
    rng = np.random.default_rng(offset)
    d = {b"batch_label": b"x", b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
         b"labels": [int(v) for v in rng.integers(0, 10, n)], b"filenames": [b"f"] * n}
    with open(path, "wb") as f:
        pickle.dump(d, f)
    return d


def test_cifar_python_batches(tmp_path):
    b1 = cifar_batch(tmp_path / "data_batch_1", 6, 1)
    b2 = cifar_batch(tmp_path / "data_batch_2", 4, 2)
    tb = cifar_batch(tmp_path / "test_batch", 5, 3)
    assert data.source_kind(str(tmp_path)) == "cifar"
    assert data.describe(cfg(tmp_path)) == ((3, 32, 32), 10)
    assert data.describe(cfg(tmp_path, crop=24)) == ((3, 24, 24), 10)
    train, test = data.open_source(str(tmp_path))
    assert (len(train), len(test)) == (10, 5)
    x, y = Loader(train, 10, shuffle=False).next()
    # rows of b'data' are 1024 red, then green, then blue values, each row-major 32×32
    np.testing.assert_allclose(x[0, 1, 0, 0], b1[b"data"][0, 1024] / 255.0, rtol=1e-6)
    np.testing.assert_allclose(x[7, 2, 1, 3], b2[b"data"][1, 2048 + 32 + 3] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(y, b1[b"labels"] + b2[b"labels"])
    xt, yt, n = next(Loader(test, 5, train=False).epoch())
    np.testing.assert_allclose(xt.reshape(5, -1), tb[b"data"] / 255.0, rtol=1e-6)


class _Sneaky:
    def __reduce__(self):
        return (os.getcwd, ())  # harmless, but a data file must not call anything


def test_cifar_pickle_cannot_run_code(tmp_path):
    with open(tmp_path / "data_batch_1", "wb") as f:
        pickle.dump({b"data": _Sneaky(), b"labels": []}, f)
    cifar_batch(tmp_path / "test_batch", 2, 0)
    with raises_one_line(SNError, match="refusing") as e:
        data.open_source(str(tmp_path))
    assert str(tmp_path / "data_batch_1") in str(e.value)


def write_image(path, array):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(np.asarray(array, dtype=np.uint8)).save(path)


def solid(h, w, colour):
    return np.broadcast_to(np.asarray(colour, np.uint8), (h, w, 3))


COLOURS = {"cat": (200, 10, 60), "dog": (5, 250, 128)}


def image_folder(root, per_class=5):
    for name, colour in COLOURS.items():
        for i in range(per_class):
            write_image(os.path.join(root, name, f"{i}.png"), solid(12 + i, 20 - 2 * i, colour))
    os.makedirs(os.path.join(root, "dog", "notes"), exist_ok=True)
    with open(os.path.join(root, "cat", "readme.txt"), "w") as f:
        f.write("not an image")


def test_image_folder_split_resize_and_values(tmp_path):
    image_folder(tmp_path)
    c = cfg(tmp_path, size=8, test_fraction=0.4)
    assert data.source_kind(str(tmp_path)) == "folder"
    assert data.describe(c) == ((3, 8, 8), 2)
    train, test = data.open_source(c)
    assert (len(train), len(test)) == (6, 4) and not hasattr(train, "x")  # paths only: lazy
    x, y = Loader(train, 6).next()
    assert x.shape == (6, 3, 8, 8) and x.dtype == np.float32
    for xi, yi in zip(x, y, strict=True):  # a solid colour stays that colour through resize and crop
        colour = np.array(list(COLOURS.values())[int(yi)]) / 255.0
        np.testing.assert_allclose(xi, np.broadcast_to(colour[:, None, None], xi.shape), atol=1e-6)


def test_image_folder_train_test_subfolders_and_lazy_errors(tmp_path):
    image_folder(tmp_path / "train", 3)
    image_folder(tmp_path / "val", 2)
    train, test = data.open_source(cfg(tmp_path, crop=10))
    assert (len(train), len(test), train.sample_shape) == (6, 4, (3, 10, 10))
    bad = tmp_path / "val" / "dog" / "1.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n broken")  # damaged after opening: found when its batch loads
    batches = Loader(test, 2, train=False).epoch()
    next(batches)
    with raises_one_line(SNError) as e:
        next(batches)
    assert str(bad) in str(e.value) and "\n" not in str(e.value)
    write_image(str(tmp_path / "val" / "bird" / "0.png"), solid(4, 4, (0, 0, 0)))
    with raises_one_line(SNError, match="class not in") as e:
        data.open_source(cfg(tmp_path, size=8))
    assert "bird" in str(e.value)


def test_image_crop_and_mirror(tmp_path):
    row = np.arange(0, 240, 20, dtype=np.uint8)  # 12 columns, each its own value
    for i in range(4):
        write_image(str(tmp_path / "a" / f"{i}.png"), np.broadcast_to(row[None, :, None], (12, 12, 3)))
    train, _ = data.open_source(cfg(tmp_path, crop=6, mirror=True, test_fraction=0.0))
    x, _, _ = next(Loader(train, 4, train=False).epoch())  # testing: centre crop, no flip
    np.testing.assert_allclose(x[0, 0, 0] * 255, row[3:9], atol=1e-4)
    starts, flips = set(), set()
    loader = Loader(train, 4, seed=5)
    for _ in range(8):
        for first_row in np.rint(loader.next()[0][:, 0, 0] * 255).astype(int):
            step = first_row[1] - first_row[0]  # +20: as stored, -20: mirrored
            assert abs(step) == 20 and np.all(np.diff(first_row) == step)
            starts.add(min(first_row[0], first_row[-1]) // 20)
            flips.add(step < 0)
    assert starts == set(range(7)) and flips == {True, False}


def test_array_crop_mirror_and_normalisation(tmp_path):
    path, x = indexed_npz(tmp_path, n=6, c=2, h=6, w=5)
    train, test = data.open_source(cfg(path, crop=4, mirror=True))
    assert train.sample_shape == (2, 4, 4)
    xt, yt, _ = next(Loader(test, 6, train=False).epoch())
    np.testing.assert_array_equal(xt, x[:, :, 1:5, 0:4])  # centred: (6-4)//2, (5-4)//2
    loader, seen = Loader(train, 6, seed=2), set()
    for _ in range(10):
        xb, yb = loader.next()
        for s, i in zip(xb, yb.astype(int), strict=True):
            r0, c0 = int(s[0, 0].min() - 1000 * i) // 10, int(s[0, 0].min() - 1000 * i) % 10
            window = x[i, :, r0:r0 + 4, c0:c0 + 4]
            mirrored = np.array_equal(s, window[..., ::-1])
            assert np.array_equal(s, window) or mirrored
            seen.add((r0, c0, mirrored))
    assert len(seen) == 3 * 2 * 2  # every offset and both orientations occur
    # scale, then per-channel mean and std
    _, test = data.open_source(cfg(path, scale=0.5, mean=[1.0, 2.0], std=[4.0, 8.0]))
    xn, _, _ = next(Loader(test, 6, train=False).epoch())
    expect = (x * 0.5 - np.array([1.0, 2.0])[:, None, None]) / np.array([4.0, 8.0])[:, None, None]
    np.testing.assert_allclose(xn, expect, rtol=1e-6)
    _, test = data.open_source(cfg(path, mean=0.5))  # one value for every channel
    np.testing.assert_allclose(next(Loader(test, 6, train=False).epoch())[0], x - 0.5)


# ---------------------------------------------------------------- loaders


def test_shuffle_is_seeded_and_wraps_across_epochs(tmp_path):
    path, _ = indexed_npz(tmp_path, n=10)
    train, _ = data.open_source(path)
    got = sum(ids(Loader(train, 4, seed=7), 10), [])  # 40 samples: 4 epochs exactly
    assert got == sum(ids(Loader(train, 4, seed=7), 10), [])
    assert got != sum(ids(Loader(train, 4, seed=8), 10), [])
    epochs = [got[k:k + 10] for k in range(0, 40, 10)]
    assert all(sorted(e) == list(range(10)) for e in epochs)  # each epoch a permutation
    assert len({tuple(e) for e in epochs}) == 4  # reshuffled every epoch
    assert sum(ids(Loader(train, 4, shuffle=False), 5), []) == list(range(10)) * 2
    # a batch bigger than the dataset spans several epochs
    assert ids(Loader(train, 23, shuffle=False), 1)[0] == list(range(10)) * 2 + [0, 1, 2]


def test_test_epoch_pads_last_batch(tmp_path):
    path, x = indexed_npz(tmp_path, n=10)
    _, test = data.open_source(path)
    loader = Loader(test, 4, train=False)
    batches = list(loader.epoch())
    assert len(loader) == len(batches) == 3 and [b[2] for b in batches] == [4, 4, 2]
    np.testing.assert_array_equal(batches[2][1], [8, 9, -1, -1])
    np.testing.assert_array_equal(batches[2][0], x[[8, 9, 9, 9]])
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches])[:10], np.arange(10))
    assert [b[2] for b in Loader(test, 5, train=False).epoch()] == [5, 5]


def test_resume_gives_the_same_batches(tmp_path):
    path, _ = indexed_npz(tmp_path, n=10)
    train, _ = data.open_source(cfg(path, crop=3, mirror=True))
    straight = Loader(train, 4, seed=3)
    [straight.next() for _ in range(3)]  # stops mid-epoch (position 2 of epoch 1)
    state = json.loads(json.dumps(straight.state()))
    expect = [straight.next() for _ in range(6)]
    resumed = Loader(train, 4, seed=99)  # the snapshot's seed wins
    resumed.restore(state)
    for (x1, y1), (x2, y2) in zip(expect, [resumed.next() for _ in range(6)], strict=True):
        np.testing.assert_array_equal(y1, y2)
        np.testing.assert_array_equal(x1, x2)  # same crops and flips too
    small = data.open_source(cfg(write_npz(tmp_path, "s.npz", x=np.zeros((3, 2, 2)), y=np.zeros(3))))[0]
    with raises_one_line(SNError, match="snapshot"):
        Loader(small, 4).restore(state)


def test_check_labels(tmp_path):
    path = write_npz(tmp_path, x=np.zeros((4, 2, 2)), y=np.array([0, 1, 5, 2]))
    train, _ = data.open_source(cfg(path, test_fraction=0.0))
    data.check_labels(train, 6, path)
    with raises_one_line(SNError, match=r"label 5 is outside \[0, 4\)") as e:
        data.check_labels(train, 4, path)
    assert path in str(e.value)


def test_source_detection(tmp_path):
    path, _ = indexed_npz(tmp_path)
    assert data.source_config(path)["source"] == path
    merged = data.source_config("synthetic", {"source": "digits", "size": 5, "batch_size": 3})
    assert (merged["source"], merged["size"], merged["batch_size"], merged["crop"]) == ("synthetic", 5, 3, 0)
    assert data.source_kind("digits") == "digits"


# ---------------------------------------------------------------- errors


def _bad_sources(tmp_path):
    """(what, path that must be named, config) for each user error."""
    p = tmp_path
    garbage = p / "garbage.npz"
    garbage.write_bytes(b"PK\x03\x04 this is not a zip archive")
    npy = p / "one.npz"
    np.save(open(npy, "wb"), np.zeros(3))
    cases = [
        ("missing", str(p / "nope.npz"), None),
        ("missing dir", str(p / "no_such_dir"), None),
        ("not a source", str(p / "x.txt"), None),
        ("bad zip", str(garbage), None),
        ("npy not npz", str(npy), None),
        ("no y", write_npz(p, "noy.npz", x=np.zeros((3, 2, 2))), None),
        ("x 2-D", write_npz(p, "x2.npz", x=np.zeros((3, 4)), y=np.zeros(3)), None),
        ("x 5-D", write_npz(p, "x5.npz", x=np.zeros((3, 1, 1, 2, 2)), y=np.zeros(3)), None),
        ("y length", write_npz(p, "ylen.npz", x=np.zeros((3, 2, 2)), y=np.zeros(4)), None),
        ("y negative", write_npz(p, "yneg.npz", x=np.zeros((3, 2, 2)), y=np.array([0, -1, 1])), None),
        ("y fractional", write_npz(p, "yfrac.npz", x=np.zeros((3, 2, 2)), y=np.array([0, 0.5, 1])), None),
        ("x_test alone", write_npz(p, "xt.npz", x=np.zeros((3, 2, 2)), y=np.zeros(3),
                                   x_test=np.zeros((1, 2, 2))), None),
        ("x_test shape", write_npz(p, "xts.npz", x=np.zeros((3, 2, 2)), y=np.zeros(3),
                                   x_test=np.zeros((1, 3, 3)), y_test=np.zeros(1)), None),
        ("strings", write_npz(p, "str.npz", x=np.array([["a"]] * 3).reshape(3, 1, 1), y=np.zeros(3)), None),
        ("crop too big", write_npz(p, "crop.npz", x=np.zeros((3, 4, 4)), y=np.zeros(3)), {"crop": 5}),
        ("mean length", write_npz(p, "mean.npz", x=np.zeros((3, 2, 4, 4)), y=np.zeros(3)),
         {"mean": [1, 2, 3]}),
        ("size on arrays", write_npz(p, "size.npz", x=np.zeros((3, 4, 4)), y=np.zeros(3)), {"size": 8}),
    ]
    (p / "x.txt").write_text("hi")
    cif = p / "cifar"
    cif.mkdir()
    (cif / "data_batch_1").write_bytes(b"\x80\x04 not a pickle")
    cases.append(("corrupt pickle", str(cif / "data_batch_1"), None))
    cif2 = p / "cifar2"
    cif2.mkdir()
    cifar_batch(cif2 / "data_batch_1", 2, 0)
    cases.append(("no test_batch", str(cif2 / "test_batch"), None))
    cif3 = p / "cifar3"
    cif3.mkdir()
    with open(cif3 / "data_batch_1", "wb") as f:
        pickle.dump({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, f)
    cases.append(("wrong row length", str(cif3 / "data_batch_1"), None))
    (p / "empty").mkdir()
    cases.append(("no classes", str(p / "empty"), {"size": 8}))
    (p / "noimg" / "a").mkdir(parents=True)
    (p / "noimg" / "a" / "x.txt").write_text("hi")
    cases.append(("no images", str(p / "noimg"), {"size": 8}))
    cases.append(("folder without size", str(p / "noimg"), {}))
    write_image(str(p / "small" / "a" / "0.png"), solid(4, 6, (1, 2, 3)))
    cases.append(("image smaller than crop", str(p / "small" / "a" / "0.png"),
                  {"crop": 5, "test_fraction": 0.0}))
    (p / "broken" / "a").mkdir(parents=True)
    (p / "broken" / "a" / "0.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    cases.append(("corrupt image", str(p / "broken" / "a" / "0.jpg"), {"size": 4, "test_fraction": 0.0}))
    return cases


def test_every_error_names_its_file(tmp_path):
    for what, path, extra in _bad_sources(tmp_path):
        with raises_one_line(SNError) as e:
            c = cfg(path, **(extra or {}))
            data.describe(c)
            train, test = data.open_source(c)
            Loader(train, 2, train=True).next()  # image folders read files per batch
        message = str(e.value)
        assert path in message and "\n" not in message, f"{what}: {message}"


def test_bad_options():
    for bad in ({"size": -1}, {"crop": -2}, {"test_fraction": 1.0}, {"classes": 0}, {"std": [1.0, 0.0, 1.0]}):
        with raises_one_line(SNError, match=next(iter(bad))):
            data.describe(cfg("synthetic", **bad))
    train, _ = data.open_source(cfg("synthetic", size=4, samples=20))
    with raises_one_line(SNError, match="batch size"):
        Loader(train, 0)


# ---------------------------------------------------------------- layers


def test_input_layer_copies_the_feed():
    layer, params = build("Input", [], n_tops=2, shape=[[2, 3], [4]])
    assert layer.top_shapes == [(2, 3), (4,)] and not layer.BACKWARD
    feed = {"t0": np.arange(6.0).reshape(2, 3), "t1": np.array([1.0, 0.0, 3.0, 2.0])}
    tops = forward(layer, [], params, feed=feed)
    np.testing.assert_array_equal(tops[0], feed["t0"])
    np.testing.assert_array_equal(tops[1], feed["t1"])
    with raises_one_line(LayerError, match="nothing fed for top 't1'"):
        forward(layer, [], params, feed={"t0": feed["t0"]})
    with raises_one_line(LayerError, match=r"has shape \(3, 2\)"):
        forward(layer, [], params, feed=dict(feed, t0=np.zeros((3, 2))))
    with raises_one_line(LayerError, match="2 shape"):
        build("Input", [], n_tops=1, shape=[[2, 3], [4]])


def test_data_layer_shapes_and_forward(tmp_path):
    layer, params = build("Data", [], dtype=np.float32, n_tops=2, source="synthetic", batch_size=4, size=6, channels=2,
                          crop=4, classes=3)
    assert layer.top_shapes == [(4, 2, 4, 4), (4,)] and layer.num_classes == 3
    train, _ = data.open_source(layer.cfg)
    x, y = Loader(train, 4).next()
    tops = forward(layer, [], params, feed={"t0": x, "t1": y})
    np.testing.assert_array_equal(tops[0], x)
    np.testing.assert_array_equal(tops[1], y)
    layer, _ = build("Data", [], n_tops=2, source="digits", batch_size=3, size=12)
    assert layer.top_shapes == [(3, 1, 12, 12), (3,)]
    for bad, match in ((dict(source=str(tmp_path / "gone.npz")), "gone.npz"),
                       (dict(source=str(tmp_path)), "size or crop"),  # an empty folder read as images
                       (dict(source="digits", batch_size=0), "batch_size")):
        with raises_one_line(LayerError, match=match):
            build("Data", [], **dict(dict(batch_size=2), **bad))
