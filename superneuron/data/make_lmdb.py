"""Caffe LMDBs of ``Datum`` records, written from an ``.npz`` (``x`` uint8 (N, C, H, W) and
integer ``y``, as our .npz sources hold them) or an image folder (one subfolder per class), as
Caffe's ``convert_imageset`` does; ``sn-make-lmdb`` (:mod:`superneuron.cli.make_lmdb`) is its
command line.

Raw records keep Caffe's layout (channels first, colour images in BGR order); keys are
``%08d_name`` in writing order, as Caffe's tools write them.
"""

import os
import shutil

import numpy as np

from ..errors import SNError
from ..netfile.caffe import caffe_pb2
from .array_files import read_npz
from .lmdb_data import decode


def datum_bytes(pixels, label):
    """A serialised raw Datum of ``pixels`` (C, H, W) uint8 and ``label``."""
    c, h, w = pixels.shape
    return caffe_pb2.Datum(channels=c, height=h, width=w, data=np.ascontiguousarray(pixels, np.uint8).tobytes(),
                           label=int(label)).SerializeToString()


def write_lmdb(dest, records):
    """Write ``records`` (an iterable of ``(name, serialised Datum)``) to a new LMDB ``dest``."""
    import lmdb
    if os.path.exists(dest):
        raise SNError(f"{dest}: already exists (Caffe's tools never overwrite a database either)")
    env = lmdb.open(dest, map_size=1 << 40, subdir=True)
    count = 0
    try:
        txn = env.begin(write=True)
        for name, value in records:
            txn.put(f"{count:08d}_{name}".encode(), value)
            count += 1
            if count % 1000 == 0:
                txn.commit()
                txn = env.begin(write=True)
        txn.commit()
    except BaseException:
        env.close()
        shutil.rmtree(dest, ignore_errors=True)  # we made it: a half-written database would block a retry
        raise
    env.close()
    return count


def npz_records(path, split):
    """Raw records of an .npz: ``x``/``y`` (``split`` train) or ``x_test``/``y_test`` (test)."""
    keys = ("x", "y") if split == "train" else ("x_test", "y_test")
    x, y = read_npz(path)[:2] if split == "train" else read_npz(path)[2:]
    if x is None:
        raise SNError(f"{path}: no '{keys[0]}' and '{keys[1]}' arrays")
    if x.ndim != 4 or x.dtype != np.uint8:
        raise SNError(f"{path}: '{keys[0]}' must be uint8 of shape (N, C, H, W), got {x.dtype} {x.shape}")
    if x.shape[1] == 3:
        x = x[:, ::-1]  # RGB → Caffe's BGR
    for i in range(len(x)):
        yield str(i), datum_bytes(x[i], y[i])


def folder_records(root, encoded):
    """Records of an image folder (class subfolders in sorted order are labels 0, 1, ...)."""
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    if not classes:
        raise SNError(f"{root}: no class subfolders")
    for label, cls in enumerate(classes):
        for name in sorted(os.listdir(os.path.join(root, cls))):
            path = os.path.join(root, cls, name)
            with open(path, "rb") as f:
                raw = f.read()
            if encoded:
                yield f"{cls}/{name}", caffe_pb2.Datum(data=raw, label=label, encoded=True).SerializeToString()
                continue
            pixels, _ = decode(caffe_pb2.Datum(data=raw, encoded=True).SerializeToString(), path)
            yield f"{cls}/{name}", datum_bytes(pixels, label)
