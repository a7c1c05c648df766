"""Data sources named, described and opened into train and test datasets (host side, NumPy only).

A source is named by a string: ``digits`` (scikit-learn's bundled 8×8 digits), ``synthetic`` (a
seeded, learnable task of any shape), a ``.npz`` file, a CIFAR-10 python directory, or an image
folder (one subfolder per class). :func:`open_source` turns a Data layer's options into a train and
a test :class:`Dataset`; batches.py's :class:`Loader` cuts a dataset into batches. The families
live apart: builtin.py (digits, synthetic), image_folder.py, array_files.py (.npz, CIFAR-10),
text.py, box_data.py, and Caffe's lmdb_data.py and image_data.py.

Pixels are first brought to [0, 1] (digits /16, 8-bit arrays and images /255, other arrays as
stored), then multiplied by ``scale``, then normalised per channel: ``(x - mean) / std``.
"""

import math
import os
import stat

import numpy as np

from ..errors import SNError
from ..limits import MAX_DATA_SIDE, MAX_SPEC_INT, over
from .array_files import check_memory, npz_describe, read_cifar, read_npz
from .box_data import describe_boxes, open_boxes
from .builtin import digits_arrays, synthetic_arrays
from .dataset import Dataset, crop_mirror, split_by_class
from .image_folder import folder_classes, folder_dirs, open_folder
from .text import describe_text, is_text_source, open_text

# The Data layer's options besides source and batch_size: kind, default, meaning.
OPTIONS = {
    "size": ("int", 0, "sample side: digits and synthetic are size×size, images' shorter side is "
             "resized to it; 0 = native (digits 8, synthetic 32)"),
    "scale": ("float", 1.0, "multiply pixel values (after bringing them to [0, 1])"),
    "mean": ("floats", (), "per-channel mean subtracted after scaling (one value or one per channel)"),
    "std": ("floats", (), "per-channel standard deviation divided by after subtracting the mean"),
    "mirror": ("bool", False, "random horizontal flips when training"),
    "crop": ("int", 0, "square crop: random when training, centred when testing; 0 = none"),
    "shuffle": ("bool", True, "reshuffle the training set every epoch"),
    "test_fraction": ("float", 0.2, "test share for sources without a test split"),
    "classes": ("int", 10, "number of classes (synthetic)"),
    "channels": ("int", 0, "number of channels: synthetic data's (0 = 3), or digits' grey replicated "
                 "over them (0 = 1)"),
    "samples": ("int", 1024, "number of samples, train and test together (synthetic)"),
    "seed": ("int", 0, "seed of the synthetic data and of train/test splits"),
    "mean_file": ("str", "", "a Caffe .binaryproto mean image subtracted before cropping (LMDB sources)"),
    "test_source": ("str", "", "the test split's own source (Caffe's TEST-phase Data layer; LMDB sources)"),
    "root_folder": ("str", "", "folder the paths of an image list (.txt) are under (Caffe's ImageData)"),
    "new_height": ("int", 0, "image list: resize every image to new_height x new_width (both, or none)"),
    "new_width": ("int", 0, "image list: see new_height"),
    "is_color": ("bool", True, "image list: false reads the images grey"),
}
DEFAULTS = {key: default for key, (_, default, _) in OPTIONS.items()}
SOURCES = ("'digits', 'synthetic', a .npz file, a CIFAR-10 python directory, an image folder, an LMDB, "
           "an image list (.txt) or text[:FILE_OR_FOLDER]")


def source_kind(src):
    """'digits', 'synthetic', 'npz', 'cifar' or 'folder'; SNError naming a missing or odd path."""
    if src in ("digits", "synthetic"):
        return src
    if is_text_source(src):
        return "text"  # byte-level tokens in windows: superneuron.data.text
    if not os.path.exists(src):
        raise SNError(f"{src}: no such file or directory (a data source is {SOURCES})")
    if os.path.isdir(src) and os.path.isfile(os.path.join(src, "data.mdb")):
        return "lmdb"  # Caffe's Data layer with backend LMDB: superneuron.data.lmdb_data
    if src.lower().endswith(".txt") and os.path.isfile(src):
        return "imagelist"  # Caffe's ImageData: superneuron.data.image_data
    if os.path.isdir(src):
        return "cifar" if os.path.exists(os.path.join(src, "data_batch_1")) else "folder"
    if src.lower().endswith(".npz"):
        mode = os.stat(src).st_mode
        if not stat.S_ISREG(mode):  # a FIFO would block the zip reader for ever
            raise SNError(f"{src}: not a regular file (a FIFO or a device); a .npz data source is a file")
        return "npz"
    raise SNError(f"{src}: not a data source (expected {SOURCES})")


def source_config(src, base_cfg=None):
    """The Data options for ``--data SRC``: ``base_cfg`` (e.g. the net's Data layer) with its source
    replaced, defaults filled in; the source is checked to exist."""
    cfg = dict(DEFAULTS, **(base_cfg or {}))
    cfg["source"] = os.fspath(src)
    source_kind(cfg["source"])
    return cfg


def _config(cfg):
    if isinstance(cfg, (str, os.PathLike)):
        return source_config(cfg)
    cfg = dict(DEFAULTS, **cfg)
    src = cfg["source"]
    for key in ("mean", "std"):  # a bare number, as from the Python API, means every channel
        cfg[key] = tuple(float(v) for v in np.atleast_1d(cfg[key]))
    for key in ("size", "crop"):
        if cfg[key] < 0:
            raise SNError(f"data source '{src}': {key} must be >= 0, got {cfg[key]}")
        if cfg[key] > MAX_DATA_SIDE:
            raise SNError(f"data source '{src}': " + over(key, cfg[key], MAX_DATA_SIDE, "MAX_DATA_SIDE"))
    if cfg["channels"] < 0:
        raise SNError(f"data source '{src}': channels must be >= 0, got {cfg['channels']}")
    for key in ("classes", "channels", "samples"):
        if cfg[key] < (0 if key == "channels" else 1):
            raise SNError(f"data source '{src}': {key} must be >= 1, got {cfg[key]}")
        if cfg[key] > MAX_SPEC_INT:  # the Python API does not pass Key.convert
            raise SNError(f"data source '{src}': " + over(key, cfg[key], MAX_SPEC_INT, "MAX_SPEC_INT"))
    if not 0.0 <= cfg["test_fraction"] < 1.0:
        raise SNError(f"data source '{src}': test_fraction must be in [0, 1), got {cfg['test_fraction']}")
    if any(s == 0 for s in cfg["std"]):
        raise SNError(f"data source '{src}': std has a zero")
    for key in ("scale", "mean", "std"):  # the YAML path rejects these already (Key.convert)
        if not np.all(np.isfinite(cfg[key])):
            raise SNError(f"data source '{src}': {key} must be finite, got {cfg[key]}")
    return cfg


# ---------------------------------------------------------------- describing a source cheaply


def describe(cfg):
    """``(sample_shape, num_classes)`` of a source, after cropping, without loading it where avoidable."""
    cfg = _config(cfg)
    if cfg.get("boxes"):  # AnnotatedData: images with boxes (box_data.py)
        return describe_boxes(cfg)
    src, size, kind = cfg["source"], cfg["size"], source_kind(cfg["source"])
    if kind == "text":
        return describe_text(cfg)
    if kind == "digits":
        shape, classes = (cfg["channels"] or 1, size or 8, size or 8), 10
        check_memory(src, 1797 * math.prod(shape) * 4, "its 1797 images at this size")
    elif kind == "lmdb":
        # here, not at the top: Caffe's formats load protobuf, which costs start-up time
        from .lmdb_data import describe as describe_lmdb
        shape, classes = describe_lmdb(cfg)
    elif kind == "imagelist":
        # here, not at the top: Caffe's formats load protobuf, which costs start-up time
        from .image_data import describe as describe_list
        shape, classes = describe_list(cfg)
    elif kind == "synthetic":
        shape, classes = (cfg["channels"] or 3, size or 32, size or 32), cfg["classes"]
        # the samples, and one pattern per class
        check_memory(src, (cfg["samples"] + classes) * math.prod(shape) * 4,
                      f"{cfg['samples']} samples of {classes} classes at this size")
    elif kind == "cifar":
        shape, classes = (3, 32, 32), 10
    elif kind == "npz":
        shape, classes = npz_describe(src)
    else:
        if not (size or cfg["crop"]):
            raise SNError(f"{src}: an image folder needs size or crop set (its images differ in size)")
        classes = len(folder_classes(folder_dirs(src)[0]))
        shape = (3, size or cfg["crop"], size or cfg["crop"])
    if kind in ("cifar", "npz", "lmdb", "imagelist") and size not in (0, shape[1]):
        raise SNError(f"{src}: size {size} given, but its samples are {shape[1]}×{shape[2]} "
                      "(size resizes digits, synthetic data and image folders only)")
    crop = cfg["crop"]
    if crop > min(shape[1:]):
        raise SNError(f"{src}: crop {crop} is larger than its {shape[1]}×{shape[2]} samples")
    for key in ("mean", "std"):
        if len(cfg[key]) not in (0, 1, shape[0]):
            raise SNError(f"{src}: {key} has {len(cfg[key])} values for {shape[0]} channels")
    return ((shape[0], crop, crop) if crop else shape), classes


def label_shape(cfg, sample_shape):
    """The shape of one sample's label: a class number (``()``), or for text one target token
    per window position (the sample's shape)."""
    return tuple(sample_shape) if source_kind(cfg["source"]) == "text" else ()


# ---------------------------------------------------------------- datasets


class ArrayDataset(Dataset):
    """Samples held in one array ``(N, C, H, W)`` (digits, synthetic, .npz, CIFAR-10)."""

    def __init__(self, name, x, labels, num_classes, cfg, unit=1.0):
        c, h, w = x.shape[1:]
        crop = cfg["crop"]
        super().__init__(name, labels, num_classes, (c, crop or h, crop or w), cfg, unit)
        self.x = x

    def _pixels(self, idx, rng, train):
        return crop_mirror(self.x, idx, self.crop, self.mirror, rng, train)




# ---------------------------------------------------------------- opening sources


def open_source(cfg):
    """``(train, test)`` datasets for a Data layer's options (a dict) or a source string."""
    cfg = _config(cfg)
    describe(cfg)  # the same checks as the layer's setup: crop, size, mean and std lengths
    if cfg.get("boxes"):
        return open_boxes(cfg)
    src, kind = cfg["source"], source_kind(cfg["source"])
    if kind == "text":
        return open_text(cfg)
    if kind == "folder":
        return open_folder(src, cfg)
    if kind == "lmdb":
        # here, not at the top: Caffe's formats load protobuf, which costs start-up time
        from .lmdb_data import open_lmdb
        return open_lmdb(cfg)
    if kind == "imagelist":
        # here, not at the top: Caffe's formats load protobuf, which costs start-up time
        from .image_data import open_image_list
        return open_image_list(cfg)
    if kind == "digits":
        x, y = digits_arrays(cfg["size"])
        if cfg["channels"] > 1:  # a net that expects colour: the grey in every channel
            x = np.repeat(x, cfg["channels"], axis=1)
        x_test = y_test = None
        unit, classes = 1.0, 10
    elif kind == "synthetic":
        x, y = synthetic_arrays(cfg)
        x_test = y_test = None
        unit, classes = 1.0, cfg["classes"]
    elif kind == "cifar":
        x, y, x_test, y_test = read_cifar(src)
        unit, classes = 1 / 255, 10
    else:
        x, y, x_test, y_test = read_npz(src)
        unit = 1 / 255 if x.dtype == np.uint8 else 1.0
        classes = int(max(y.max(initial=-1), -1 if y_test is None else y_test.max(initial=-1))) + 1
    if x_test is None:
        train, test = split_by_class(y, cfg["test_fraction"], cfg["seed"])
        x, y, x_test, y_test = x[train], y[train], x[test], y[test]
    return (ArrayDataset(f"{src} (train)", x, y, classes, cfg, unit),
            ArrayDataset(f"{src} (test)", x_test, y_test, classes, cfg, unit))


def check_labels(dataset, num_classes, source_name):
    """SNError unless every label of ``dataset`` is in [0, num_classes) (the net's class count)."""
    labels = getattr(dataset, "class_labels", dataset.labels)  # detection: the boxes' classes
    bad = labels[(labels < 0) | (labels >= num_classes)]
    if bad.size:
        raise SNError(f"{source_name}: label {int(bad[0])} is outside [0, {num_classes}) "
                      f"({bad.size} of {len(labels)} labels); the net predicts {num_classes} classes")
