"""Caffe's ImageData layer: a text list of ``path label`` lines (paths under ``root_folder``),
each image read with Pillow per batch, resized to ``new_height`` × ``new_width`` when both are
given (else all must share one size), grey when ``is_color`` is false, in Caffe's BGR order, with
Caffe's transform (:class:`~superneuron.data.lmdb_data.CaffeDataset`)."""

import functools
import os

import numpy as np

from ..errors import SNError
from .dataset import one_line
from .lmdb_data import CaffeDataset


def is_image_list(path):
    """Whether ``path`` names an ImageData list (a ``.txt`` file)."""
    return str(path).lower().endswith(".txt") and os.path.isfile(path)


@functools.lru_cache(maxsize=8)
def _read_list(path, mtime):
    paths, labels = [], []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            name, _, label = line.rpartition(" ")
            if not name or not label.lstrip("-").isdigit():
                raise SNError(f"{path}:{n}: expected 'path label', got {line[:60]!r}")
            paths.append(name)
            labels.append(int(label))
    if not paths:
        raise SNError(f"{path}: the image list is empty")
    labels = np.asarray(labels, dtype=np.int64)
    if labels.min() < 0:
        raise SNError(f"{path}: a negative label ({int(labels.min())})")
    return tuple(paths), labels


def read_list(path):
    return _read_list(os.path.abspath(path), os.path.getmtime(path))


def load_image(path, cfg):
    """One image as Caffe's ImageData reads it: (C, H, W) float32, BGR."""
    from PIL import Image
    try:
        with Image.open(path) as im:
            im = im.convert("RGB" if cfg["is_color"] else "L")
            if cfg["new_height"] and cfg["new_width"]:
                im = im.resize((cfg["new_width"], cfg["new_height"]), Image.BILINEAR)
            x = np.asarray(im, dtype=np.float32)
    except (OSError, ValueError, SyntaxError) as e:
        raise SNError(f"{path}: cannot read image ({one_line(e)})") from None
    return x[None] if x.ndim == 2 else np.ascontiguousarray(x[:, :, ::-1].transpose(2, 0, 1))


def describe(cfg):
    """``(sample shape, classes)`` of an image list (its first image's shape)."""
    paths, labels = read_list(cfg["source"])
    shape = load_image(os.path.join(cfg["root_folder"], paths[0]), cfg).shape
    classes = int(labels.max()) + 1
    if cfg.get("test_source"):
        classes = max(classes, int(read_list(cfg["test_source"])[1].max()) + 1)
    return shape, classes


class ImageListDataset(CaffeDataset):
    def __init__(self, path, cfg, classes, shape):
        paths, labels = read_list(path)
        super().__init__(str(path), labels, shape, cfg, classes)
        self.paths, self.cfg = paths, cfg

    def _read(self, idx):
        x = np.empty((len(idx),) + self.shape, dtype=np.float32)
        for i, k in enumerate(idx):
            path = os.path.join(self.cfg["root_folder"], self.paths[k])
            image = load_image(path, self.cfg)
            if image.shape != self.shape:
                raise SNError(f"{path}: image is {image.shape}, the first {self.shape}; give new_height "
                              "and new_width to resize them all")
            x[i] = image
        return x


def open_image_list(cfg):
    """``(train, test)`` datasets of an image list (the test one from ``test_source``)."""
    shape, classes = describe(cfg)
    train = ImageListDataset(cfg["source"], cfg, classes, shape)
    if cfg.get("test_source"):
        return train, ImageListDataset(cfg["test_source"], cfg, classes, shape)
    empty = ImageListDataset(cfg["source"], cfg, classes, shape)
    empty.labels, empty.paths = empty.labels[:0], ()
    return train, empty
