"""Fuzz: the files sn-train reads and writes. Data (.npz cut short, flipped bytes, crafted
headers, bad arrays; Data layer options; CIFAR-10 batches; image folders), snapshots (cut,
flipped, members missing, crafted fields with a valid checksum) and faults (a full disk while
a snapshot is written, a kill -9 in the middle of one). Each case ends in a clean error or a
correct run, within its time; see fuzz_helpers for the judge."""

import io
import os
import pickle
import zipfile

import numpy as np
import pytest
from fuzz_helpers import HUGE_INTS, assert_clean, rng, run_main

from superneuron.cli.train import main as train_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "nets", "tiny.yaml")


def _npz_bytes(**arrays):
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _good_arrays():
    r = np.random.default_rng(0)
    return {"x": r.random((40, 3, 8, 8), dtype=np.float32), "y": r.integers(0, 5, 40)}


def _npy(array, header=None):
    """The .npy bytes of ``array``, its header dict replaced by ``header`` (a crafted one)."""
    buf = io.BytesIO()
    np.save(buf, array)
    if header is None:
        return buf.getvalue()
    data = np.ascontiguousarray(array).tobytes()
    text = (repr(header) if isinstance(header, dict) else header).encode("latin1")
    text += b" " * (-(len(text) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + data


def _zip(members):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def _crafted_npz():
    """Named .npz files whose zip is sound but whose arrays or headers lie or are wrong."""
    good = _good_arrays()
    x, y = good["x"], good["y"]
    hx = {"descr": "<f4", "fortran_order": False, "shape": (10**11, 3, 8, 8)}
    return {
        "x header claims 1e11 samples": _zip({"x.npy": _npy(x, hx), "y.npy": _npy(y)}),
        "y header claims 1e11 labels": _zip({"x.npy": _npy(x), "y.npy": _npy(y, dict(
            descr="<i8", fortran_order=False, shape=(10**11,)))}),
        "x header of an object array": _zip({"x.npy": _npy(x, dict(hx, descr="|O", shape=(40, 3, 8, 8))),
                                             "y.npy": _npy(y)}),
        "x header not a dict": _zip({"x.npy": _npy(x, "[1, 2, 3]"), "y.npy": _npy(y)}),
        "x header with a negative shape": _zip({"x.npy": _npy(x, dict(hx, shape=(-40, 3, 8, 8))), "y.npy": _npy(y)}),
        "x header of 65 000 spaces": _zip({"x.npy": b"\x93NUMPY\x01\x00\xff\xff" + b" " * 65535, "y.npy": _npy(y)}),
        "x header of npy version 9": _zip({"x.npy": b"\x93NUMPY\x09\x00" + _npy(x)[8:], "y.npy": _npy(y)}),
        "no x": _npz_bytes(y=y),
        "no y": _npz_bytes(x=x),
        "x_test without y_test": _npz_bytes(x=x, y=y, x_test=x),
        "y with NaN": _npz_bytes(x=x, y=np.where(y == 1, np.nan, y.astype(float))),
        "y negative": _npz_bytes(x=x, y=-y - 1),
        "y past the classes": _npz_bytes(x=x, y=y + 5),
        "y of 1e9 classes": _npz_bytes(x=x, y=np.full(40, 10**9)),
        "y 2-D": _npz_bytes(x=x, y=y[:, None]),
        "y strings": _npz_bytes(x=x, y=np.array(["a"] * 40)),
        "x with NaN": _npz_bytes(x=np.where(x > 0.9, np.nan, x).astype(np.float32), y=y),
        "x with inf": _npz_bytes(x=np.where(x > 0.9, np.inf, x).astype(np.float32), y=y),
        "x rank 2": _npz_bytes(x=x.reshape(40, -1), y=y),
        "x rank 5": _npz_bytes(x=x[:, None], y=y),
        "x complex": _npz_bytes(x=x.astype(np.complex64), y=y),
        "x strings": _npz_bytes(x=np.array(["a"] * 40), y=y),
        "x of 1e30": _npz_bytes(x=np.full(x.shape, 1e30, np.float32), y=y),
        "x float64": _npz_bytes(x=x.astype(np.float64), y=y),
        "x uint8": _npz_bytes(x=(x * 255).astype(np.uint8), y=y),
        "x_test of other samples": _npz_bytes(x=x, y=y, x_test=x[:, :, :4, :4], y_test=y),
        "no samples": _npz_bytes(x=x[:0], y=y[:0]),
        "one sample": _npz_bytes(x=x[:1], y=y[:1]),
        "not a zip": b"x, y\n1, 2\n",
        "empty": b"",
        "a zip of text": _zip({"x.npy": b"hello", "y.npy": b"world"}),
        "a zip with a folder": _zip({"x.npy/": b"", "y.npy": _npy(y)}),
    }


def _npz_cases():
    r = rng("npz")
    good = _npz_bytes(**_good_arrays())
    cases = [pytest.param(data, id=name) for name, data in _crafted_npz().items()]
    for _ in range(12):
        at = r.randrange(len(good))
        cases.append(pytest.param(good[:at], id=f"cut at {at}"))
    for k in range(16):
        data = bytearray(good)
        for _ in range(r.randint(1, 8)):
            data[r.randrange(len(data))] ^= 1 << r.randrange(8)
        cases.append(pytest.param(bytes(data), id=f"flips {k}"))
    return cases


@pytest.mark.parametrize("data", _npz_cases())
def test_npz_data_file(data, tmp_path):
    path = tmp_path / "data.npz"
    path.write_bytes(data)
    assert_clean(run_main(train_main, [TINY, "--data", path, "--iters", "1", "--display", "1"]))


DATA_NET = """
name: datanet
layers:
  - {{name: data, type: Data, top: [data, label], source: {source}, batch_size: {batch}, {options}}}
  - {{name: ip, type: InnerProduct, bottom: data, top: ip, num_output: {classes}}}
  - {{name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}}
"""
OPTIONS = {"samples": HUGE_INTS + [1, 3], "classes": HUGE_INTS + [1, 2], "size": HUGE_INTS + [1, 65537],
           "crop": HUGE_INTS + [9], "channels": HUGE_INTS + [1], "test_fraction": [1.0, -0.1, 0.999, ".nan"],
           "mean": ["[1, 2, 3, 4]", ".inf"], "std": [0, "[0, 1, 1]", 1e-320], "scale": [1e300, ".nan", 0]}


def _data_layer_cases(count=40):
    r = rng("data-layer")
    cases = []
    for k in range(count):
        chosen = r.sample(sorted(OPTIONS), r.randint(1, 2))
        options = {key: r.choice(OPTIONS[key]) for key in chosen}
        options.setdefault("samples", 64)
        options.setdefault("size", 4)
        text = DATA_NET.format(source=r.choice(["synthetic", "digits"]), batch=r.choice([2, 2, 2, 10**9, 0]),
                               classes=r.choice([10, 3]), options=", ".join(f"{a}: {b}" for a, b in options.items()))
        cases.append(pytest.param(text, id=f"{k}-" + " ".join(f"{a}={b}" for a, b in options.items())[:60]))
    return cases


@pytest.mark.parametrize("text", _data_layer_cases())
def test_data_layer_options(text, tmp_path):
    path = tmp_path / "net.yaml"
    path.write_text(text)
    assert_clean(run_main(train_main, [path, "--iters", "1", "--display", "1"]))


def _cifar_folder(root, break_it):
    root.mkdir()
    r = np.random.default_rng(1)
    for name in ("data_batch_1", "data_batch_2", "test_batch"):
        labels = [int(v) for v in r.integers(0, 10, 6)]  # plain ints, as in CIFAR-10's files
        batch = {b"data": r.integers(0, 256, (6, 3072), dtype=np.uint8), b"labels": labels}
        (root / name).write_bytes(pickle.dumps(batch, protocol=4))
    break_it(root)
    return root


def _replace(name, data):
    return lambda root: (root / name).write_bytes(data)


CIFAR_BREAKS = {
    "whole": lambda root: None,
    "cut": lambda root: (root / "data_batch_2").write_bytes((root / "data_batch_2").read_bytes()[:500]),
    "garbage": _replace("data_batch_1", bytes(range(256)) * 20),
    "empty": _replace("test_batch", b""),
    "fifo": lambda root: ((root / "data_batch_1").unlink(), os.mkfifo(root / "data_batch_1")),
    "folder": lambda root: ((root / "test_batch").unlink(), (root / "test_batch").mkdir()),
    "no test batch": lambda root: (root / "test_batch").unlink(),
    "os.system": _replace("data_batch_1", b"cos\nsystem\n(S'echo pwned'\ntR."),
    "eval": _replace("data_batch_1", b"cbuiltins\neval\n(S'1+1'\ntR."),
    "numpy.f2py": _replace("data_batch_1", b"cnumpy.f2py.__main__\nmain\n(tR."),
    "a bytes of 2**60 claimed": _replace("data_batch_1", b"\x80\x04\x8e" + (2**60).to_bytes(8, "little") + b"xx."),
    "a list of 2**31 claimed": _replace("data_batch_1", b"\x80\x02]q\x00(" + b"K\x01" * 3 + b"e."),
    "wrong shape": _replace("data_batch_1", pickle.dumps({b"data": np.zeros((6, 100), np.uint8), b"labels": [0] * 6})),
    "labels past 10": _replace("test_batch", pickle.dumps({b"data": np.zeros((6, 3072), np.uint8),
                                                           b"labels": [10**9] * 6})),
    "labels strings": _replace("test_batch", pickle.dumps({b"data": np.zeros((6, 3072), np.uint8),
                                                           b"labels": ["a"] * 6})),
    "protocol 2 from Python 3": _replace("data_batch_1", pickle.dumps({b"data": np.zeros((6, 3072), np.uint8),
                                                                      b"labels": [0] * 6}, protocol=2)),
    "not a dict": _replace("test_batch", pickle.dumps([1, 2, 3])),
    "deep nesting": _replace("data_batch_1", b"\x80\x02" + b"]" * 100000 + b"."),
}


@pytest.mark.parametrize("name", sorted(CIFAR_BREAKS))
def test_cifar_folder(name, tmp_path):
    root = _cifar_folder(tmp_path / "cifar", CIFAR_BREAKS[name])
    outcome = run_main(train_main, [TINY, "--data", root, "--set", "size=32", "--set", "classes=10", "--iters", "1"])
    assert_clean(outcome)
    assert outcome.rc == 2 or name == "whole"




def _png(size=(8, 8)):
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", size, (120, 30, 200)).save(buf, format="PNG")
    return buf.getvalue()


def _bomb_png():
    """A PNG whose header claims 100 000 x 100 000 pixels (its data is a few bytes)."""
    data = bytearray(_png((1, 1)))
    data[16:24] = (100000).to_bytes(4, "big") * 2
    import zlib
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    return bytes(data)


IMAGE_BREAKS = {
    "whole": lambda d: None,
    "cut png": lambda d: (d / "a.png").write_bytes(_png()[:30]),
    "empty png": lambda d: (d / "a.png").write_bytes(b""),
    "text png": lambda d: (d / "a.png").write_text("not an image"),
    "fifo png": lambda d: os.mkfifo(d / "f.png"),
    "folder png": lambda d: (d / "g.png").mkdir(),
    "loop png": lambda d: os.symlink(d / "l.png", d / "l.png"),
    "bomb png": lambda d: (d / "a.png").write_bytes(_bomb_png()),
    "tiny png": lambda d: (d / "a.png").write_bytes(_png((1, 1))),
}


@pytest.mark.parametrize("name", sorted(IMAGE_BREAKS))
def test_image_folder(name, tmp_path):
    root = tmp_path / "images"
    for cls in ("cat", "dog"):
        (root / cls).mkdir(parents=True)
        for k in range(3):
            (root / cls / f"{k}.png").write_bytes(_png())
    IMAGE_BREAKS[name](root / "cat")
    net = tmp_path / "net.yaml"
    net.write_text(DATA_NET.format(source=f"'{root}'", batch=2, classes=2, options="size: 8"))
    assert_clean(run_main(train_main, [net, "--iters", "1", "--display", "1"]))
