"""Caffe's LMDB datasets: records are ``Datum`` protobufs (raw bytes in Caffe's BGR channel
order, float_data, or an encoded JPEG/PNG decoded with Pillow and turned to BGR as OpenCV gives
it), read per batch from the memory-mapped database, labels read once at open.

Caffe's transform is ``(pixel - mean) * scale`` on raw 0..255 values, the mean per channel
(``mean_value``) or per pixel (``mean_file``, a ``.binaryproto`` image, cut with the same crop as
the sample); crops are random in TRAIN and centred in TEST, mirroring in TRAIN only.
"""

import functools
import io
import os

import numpy as np

from ..errors import SNError
from ..netfile.caffe import caffe_pb2
from .dataset import Dataset, crop_mirror, one_line


def is_lmdb(path):
    """Whether ``path`` is an LMDB environment folder (Caffe's ``source`` with backend LMDB)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "data.mdb"))


def _open_env(path):
    try:
        import lmdb
    except ImportError:
        raise SNError(f"{path}: reading LMDB needs the 'lmdb' package (pip install lmdb)") from None
    try:
        return lmdb.open(str(path), readonly=True, lock=False, readahead=False, max_readers=64)
    except lmdb.Error as e:
        raise SNError(f"{path}: cannot open the LMDB ({one_line(e)})") from None


def decode(value, where="datum"):
    """``(pixels (C, H, W) uint8 or float32, label)`` of one serialised Datum."""
    datum = caffe_pb2.Datum()
    try:
        datum.ParseFromString(value)
    except Exception as e:  # protobuf's DecodeError, or garbage it cannot even start on
        raise SNError(f"{where}: not a Caffe Datum ({one_line(e)})") from None
    if datum.encoded:
        from PIL import Image
        try:
            with Image.open(io.BytesIO(datum.data)) as im:
                im = im.convert("L" if im.mode in ("L", "1", "I;16") else "RGB")
                x = np.asarray(im, dtype=np.uint8)
        except (OSError, ValueError, SyntaxError) as e:
            raise SNError(f"{where}: cannot decode the encoded image ({one_line(e)})") from None
        x = x[None] if x.ndim == 2 else x[:, :, ::-1].transpose(2, 0, 1)  # RGB → Caffe's BGR
        return np.ascontiguousarray(x), datum.label
    shape = (datum.channels, datum.height, datum.width)
    if datum.data:
        x = np.frombuffer(datum.data, dtype=np.uint8)
    else:
        x = np.asarray(datum.float_data, dtype=np.float32)
    if x.size != np.prod(shape) or x.size == 0:
        raise SNError(f"{where}: {x.size} values for channels×height×width {shape}")
    return x.reshape(shape), datum.label


@functools.lru_cache(maxsize=8)
def _index(path, mtime):
    """``(keys, labels, first sample's shape)`` of an LMDB, read once per file version."""
    env = _open_env(path)
    keys, labels, shape = [], [], None
    with env.begin() as txn:
        for key, value in txn.cursor():
            x, label = decode(value, f"{path}: record {key.decode(errors='replace')}")
            if shape is None:
                shape = x.shape
            elif x.shape != shape:
                raise SNError(f"{path}: record {key.decode(errors='replace')} is {x.shape}, the first "
                              f"{shape}; Caffe's Data layer needs one shape (use ImageData to resize)")
            keys.append(key)
            labels.append(label)
    env.close()
    if not keys:
        raise SNError(f"{path}: the LMDB holds no records")
    labels = np.asarray(labels, dtype=np.int64)
    if labels.min() < 0:
        raise SNError(f"{path}: a record has the negative label {int(labels.min())}")
    return tuple(keys), labels, shape


def index(path):
    return _index(os.path.abspath(path), os.path.getmtime(os.path.join(path, "data.mdb")))


def describe(cfg):
    """``(sample shape, classes)`` of an LMDB source."""
    keys, labels, shape = index(cfg["source"])
    classes = int(labels.max()) + 1
    if cfg.get("test_source"):
        classes = max(classes, int(index(cfg["test_source"])[1].max()) + 1)
    return shape, classes


def read_mean_file(path, shape):
    """A ``.binaryproto`` mean image (a BlobProto) as float32 ``shape`` (C, H, W)."""
    blob = caffe_pb2.BlobProto()
    try:
        with open(path, "rb") as f:
            blob.ParseFromString(f.read())
    except OSError as e:
        raise SNError(f"{path}: cannot read the mean file: {e.strerror or e}") from None
    except Exception as e:
        raise SNError(f"{path}: not a Caffe .binaryproto mean ({one_line(e)})") from None
    dims = tuple(blob.shape.dim) if blob.HasField("shape") else (blob.num, blob.channels, blob.height, blob.width)
    data = np.asarray(blob.data, dtype=np.float32)
    if data.size != np.prod(dims) or data.size != np.prod(shape):
        raise SNError(f"{path}: the mean is {dims}; the samples are {shape}")
    return data.reshape(shape)


class CaffeDataset(Dataset):
    """A split read per batch (:meth:`_read` gives the samples as stored) with Caffe's transform:
    the mean image, then the crop and mirror, then (by :class:`Dataset`) scale and mean_value."""

    def __init__(self, name, labels, shape, cfg, classes):
        crop = cfg["crop"]
        if crop > min(shape[1:]):
            raise SNError(f"{name}: crop {crop} is larger than its {shape[1]}×{shape[2]} samples")
        super().__init__(name, labels, classes, (shape[0], crop or shape[1], crop or shape[2]), cfg, 1.0)
        self.shape = shape
        self.mean_image = read_mean_file(cfg["mean_file"], shape) if cfg.get("mean_file") else None

    def _read(self, idx):
        raise NotImplementedError

    def _pixels(self, idx, rng, train):
        x = self._read(idx)
        if self.mean_image is not None:  # per pixel, before the crop (Caffe cuts both alike)
            x -= self.mean_image
        return crop_mirror(x, np.arange(len(idx)), self.crop, self.mirror, rng, train)


class LmdbDataset(CaffeDataset):
    """One LMDB as a split: records decoded per batch."""

    def __init__(self, path, cfg, classes):
        keys, labels, shape = index(path)
        super().__init__(str(path), labels, shape, cfg, classes)
        self.path, self.keys = path, keys
        self.env = None

    def _read(self, idx):
        if self.env is None:
            self.env = _open_env(self.path)
        x = np.empty((len(idx),) + self.shape, dtype=np.float32)
        with self.env.begin() as txn:
            for i, k in enumerate(idx):
                x[i] = decode(txn.get(self.keys[k]), f"{self.path}: record {k}")[0]
        return x


def open_lmdb(cfg):
    """``(train, test)`` datasets of an LMDB source: the test split is ``test_source`` (the TEST
    phase's Data layer) when there is one."""
    shape, classes = describe(cfg)
    train = LmdbDataset(cfg["source"], cfg, classes)
    if cfg.get("test_source"):
        return train, LmdbDataset(cfg["test_source"], cfg, classes)
    empty = LmdbDataset(cfg["source"], cfg, classes)
    empty.labels, empty.keys = empty.labels[:0], ()
    return train, empty
