"""Data sources and batch loaders (host side, NumPy only).

A source is named by a string: ``digits`` (scikit-learn's bundled 8×8 digits), ``synthetic`` (a
seeded, learnable task of any shape), a ``.npz`` file, a CIFAR-10 python directory, or an image
folder (one subfolder per class). :func:`open_source` turns a Data layer's options into a train and
a test :class:`Dataset`; a :class:`Loader` cuts a dataset into batches: a seeded shuffle per epoch
for training, one padded pass in order for testing, and a small state for exact resumption.

Pixels are first brought to [0, 1] (digits /16, 8-bit arrays and images /255, other arrays as
stored), then multiplied by ``scale``, then normalised per channel: ``(x - mean) / std``.
"""

import functools
import math
import os
import stat

import numpy as np

from ..errors import SNError
from ..limits import MAX_DATA_SIDE, MAX_SPEC_INT, over
from .array_files import check_memory, npz_describe, read_cifar, read_npz
from .box_data import describe_boxes, open_boxes
from .dataset import Dataset, ShardDraws, crop_mirror, one_line
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
IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".gif", ".tif", ".tiff", ".webp")
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
        classes = len(_folder_classes(_folder_dirs(src)[0]))
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


class ImageFolder(Dataset):
    """Image files read per batch with Pillow: RGB, shorter side resized to ``size``, then a square
    of ``crop`` (or ``size``) cut out; nothing is cached."""

    def __init__(self, name, paths, labels, num_classes, cfg):
        self.size, self.side = cfg["size"], cfg["crop"] or cfg["size"]
        super().__init__(name, labels, num_classes, (3, self.side, self.side), cfg, 1 / 255)
        self.paths = paths

    def _load(self, path, rng, train):
        from PIL import Image
        try:
            with Image.open(path) as im:
                im = im.convert("RGB")
            w, h = im.size
            if self.size and min(w, h) != self.size:
                r = self.size / min(w, h)
                im = im.resize((max(self.size, round(w * r)), max(self.size, round(h * r))), Image.BILINEAR)
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
            raise SNError(f"{path}: cannot read image ({one_line(e)})") from None
        w, h, k = *im.size, self.side
        if w < k or h < k:
            raise SNError(f"{path}: image is {w}×{h}, smaller than the crop {k}")
        if train and self.crop:
            ox, oy = int(rng.integers(0, w - k + 1)), int(rng.integers(0, h - k + 1))
        else:
            ox, oy = (w - k) // 2, (h - k) // 2
        return np.asarray(im.crop((ox, oy, ox + k, oy + k)), dtype=np.uint8).transpose(2, 0, 1)

    def _pixels(self, idx, rng, train):
        x = np.stack([self._load(self.paths[i], rng, train) for i in idx])
        return crop_mirror(x, np.arange(len(idx)), 0, self.mirror, rng, train)


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
        return _open_folder(src, cfg)
    if kind == "lmdb":
        # here, not at the top: Caffe's formats load protobuf, which costs start-up time
        from .lmdb_data import open_lmdb
        return open_lmdb(cfg)
    if kind == "imagelist":
        # here, not at the top: Caffe's formats load protobuf, which costs start-up time
        from .image_data import open_image_list
        return open_image_list(cfg)
    if kind == "digits":
        x, y = _digits(cfg["size"])
        if cfg["channels"] > 1:  # a net that expects colour: the grey in every channel
            x = np.repeat(x, cfg["channels"], axis=1)
        x_test = y_test = None
        unit, classes = 1.0, 10
    elif kind == "synthetic":
        x, y = _synthetic(cfg)
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
        train, test = _split(y, cfg["test_fraction"], cfg["seed"])
        x, y, x_test, y_test = x[train], y[train], x[test], y[test]
    return (ArrayDataset(f"{src} (train)", x, y, classes, cfg, unit),
            ArrayDataset(f"{src} (test)", x_test, y_test, classes, cfg, unit))


def _split(labels, fraction, seed):
    """Sorted train and test indices: from each class, round(fraction × its count) samples (halves
    round up) chosen by a seeded shuffle go to the test set."""
    rng = np.random.default_rng(seed)
    is_test = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        is_test[members[:int(fraction * len(members) + 0.5)]] = True
    return np.flatnonzero(~is_test), np.flatnonzero(is_test)


@functools.lru_cache(maxsize=4)
def _digits(size):
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise SNError("the 'digits' source needs scikit-learn (pip install scikit-learn)") from None
    from PIL import Image
    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)
    if size and size != 8:
        # Bilinear keeps strokes smooth, which a LeNet learns faster than nearest's blocks.
        x = np.stack([np.asarray(Image.fromarray(im).resize((size, size), Image.BILINEAR)) for im in x])
    x = np.clip(x, 0.0, 1.0)[:, None]
    y = d.target.astype(np.int64)
    x.flags.writeable = y.flags.writeable = False  # shared by every call through the cache
    return x, y


def _synthetic(cfg):
    """Each class is a smooth random pattern (4×4 cells per channel, upsampled) plus pixel noise
    of the same strength: learnable by a linear model or a convolutional net."""
    rng = np.random.default_rng(cfg["seed"])
    c, s, k, n = cfg["channels"] or 3, cfg["size"] or 32, cfg["classes"], cfg["samples"]
    g = min(4, s)
    cells = np.arange(s) * g // s
    coarse = rng.standard_normal((k, c, g, g)).astype(np.float32)
    patterns = coarse[:, :, cells[:, None], cells[None, :]]
    y = rng.integers(0, k, n)
    x = rng.standard_normal((n, c, s, s), dtype=np.float32)
    x += patterns[y]
    x *= 0.25
    x += 0.5
    return x, y.astype(np.int64)



def _folder_dirs(root):
    """``(train_dir, test_dir)``: ``train/`` and ``test/`` (or ``val/``) when both exist, else
    ``(root, None)`` and the test set is split off by test_fraction."""
    train = os.path.join(root, "train")
    tests = [os.path.join(root, d) for d in ("test", "val") if os.path.isdir(os.path.join(root, d))]
    if os.path.isdir(train) and tests:
        return train, tests[0]
    return root, None


def _folder_classes(d):
    classes = sorted(e.name for e in os.scandir(d) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise SNError(f"{d}: image folder has no class subfolders")
    return classes


def _is_file(entry):
    try:
        return entry.is_file()
    except OSError:  # a symlink loop
        return False


def _folder_images(d, classes):
    paths, labels = [], []
    for label, name in enumerate(classes):
        cdir = os.path.join(d, name)
        if os.path.isdir(cdir):  # a test split may lack a class
            # regular files only: opening a FIFO named x.png would wait for ever
            files = sorted(e.name for e in os.scandir(cdir) if e.name.lower().endswith(IMAGE_EXTS) and _is_file(e))
            paths += [os.path.join(cdir, f) for f in files]
            labels += [label] * len(files)
    if not paths:
        raise SNError(f"{d}: image folder has no images ({', '.join(IMAGE_EXTS)}) in its class subfolders")
    return paths, np.array(labels, dtype=np.int64)


def _open_folder(root, cfg):
    train_dir, test_dir = _folder_dirs(root)
    classes = _folder_classes(train_dir)
    paths, labels = _folder_images(train_dir, classes)
    if test_dir is None:
        train, test = _split(labels, cfg["test_fraction"], cfg["seed"])
        test_paths, test_labels = [paths[i] for i in test], labels[test]
        paths, labels = [paths[i] for i in train], labels[train]
    else:
        extra = sorted(set(_folder_classes(test_dir)) - set(classes))
        if extra:
            raise SNError(f"{os.path.join(test_dir, extra[0])}: class not in {train_dir}")
        test_paths, test_labels = _folder_images(test_dir, classes)
    n = len(classes)
    return (ImageFolder(f"{train_dir} (train)", paths, labels, n, cfg),
            ImageFolder(f"{test_dir or root} (test)", test_paths, test_labels, n, cfg))


def check_labels(dataset, num_classes, source_name):
    """SNError unless every label of ``dataset`` is in [0, num_classes) (the net's class count)."""
    labels = getattr(dataset, "class_labels", dataset.labels)  # detection: the boxes' classes
    bad = labels[(labels < 0) | (labels >= num_classes)]
    if bad.size:
        raise SNError(f"{source_name}: label {int(bad[0])} is outside [0, {num_classes}) "
                      f"({bad.size} of {len(labels)} labels); the net predicts {num_classes} classes")


# ---------------------------------------------------------------- batches


class Loader:
    """Batches of a dataset. ``next()`` for training: a seeded shuffle per epoch, wrapping across
    epochs (a batch that runs past the end is completed from the next epoch's order); ``epoch()``
    for testing: every sample once, in order, the last batch padded.

    The shuffle of epoch ``e`` and the augmentation of the batch starting at ``(e, position)`` come
    from seeds made of ``(seed, e, position)``, so ``state()`` needs only those numbers.

    ``shard``: ``(rank, ranks)`` of data-parallel training: ``batch`` is then the global batch,
    and :meth:`next` gives rank ``rank``'s ``batch // ranks`` samples of it, so that the ranks
    together see the samples one rank would at the global batch, with the same random crops
    and flips (dataset.ShardDraws)."""

    def __init__(self, dataset, batch, shuffle=True, seed=0, train=True, shard=(0, 1)):
        if batch < 1:
            raise SNError(f"{dataset.name}: batch size must be >= 1, got {batch}")
        if seed < 0:
            raise SNError(f"{dataset.name}: seed must be >= 0, got {seed}")
        self.dataset, self.batch, self.shuffle, self.seed, self.train = dataset, batch, shuffle, seed, train
        self.epoch_index, self.position = 0, 0
        self._order_of = None, None  # (epoch, its order)
        self.shard = shard

    def _order(self):
        if self._order_of[0] != self.epoch_index:
            n = len(self.dataset)
            order = (np.random.default_rng([0, self.seed, self.epoch_index]).permutation(n)
                     if self.shuffle else np.arange(n))
            self._order_of = self.epoch_index, order
        return self._order_of[1]

    def next(self):
        """The next training batch: ``(x float32 (B, C, H, W), y float32 (B,))``."""
        n = len(self.dataset)
        if n == 0:
            raise SNError(f"{self.dataset.name}: no samples to train on")
        rng = np.random.default_rng([1, self.seed, self.epoch_index, self.position])
        parts, need = [], self.batch
        while need:
            take = self._order()[self.position:self.position + need]
            parts.append(take)
            need -= len(take)
            self.position += len(take)
            if self.position == n:
                self.epoch_index, self.position = self.epoch_index + 1, 0
        idx = np.concatenate(parts)
        rank, ranks = self.shard
        if ranks > 1:
            per_rank = self.batch // ranks
            idx = idx[rank * per_rank:(rank + 1) * per_rank]
            rng = ShardDraws(rng, rank, ranks)
        return self.dataset.batch(idx, rng, self.train), self.dataset.batch_labels(idx)

    def __len__(self):
        """Batches in one pass of :meth:`epoch`."""
        return -(-len(self.dataset) // self.batch)

    def epoch(self):
        """Yield ``(x, y, n_valid)`` over the dataset once, in order, with no random augmentation;
        the last batch is padded with copies of the last sample labelled -1 (ignored by losses)."""
        n = len(self.dataset)
        for start in range(0, n, self.batch):
            valid = min(self.batch, n - start)
            idx = np.minimum(np.arange(start, start + self.batch), n - 1)
            y = self.dataset.batch_labels(idx, valid)
            yield self.dataset.batch(idx, None, train=False), y, valid

    def state(self):
        """Where training stands, as plain ints: enough for :meth:`restore` to continue exactly."""
        return {"epoch": int(self.epoch_index), "position": int(self.position), "seed": int(self.seed),
                "samples": len(self.dataset)}

    def check_state(self, state):
        """SNError unless ``state`` (as read from a snapshot) is a :meth:`state` of this dataset."""
        if not isinstance(state, dict):
            raise SNError("data position is not a mapping of epoch, position, seed and samples")
        for key in ("epoch", "position", "seed", "samples"):
            value = state.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SNError(f"data position: '{key}' must be a count >= 0, got {value!r:.40}")
        if state["samples"] != len(self.dataset):
            raise SNError(f"{self.dataset.name}: has {len(self.dataset)} samples, but the snapshot "
                          f"was taken with {state['samples']}")
        if state["position"] >= max(len(self.dataset), 1):
            raise SNError(f"data position {state['position']} is past the {len(self.dataset)} samples")

    def restore(self, state):
        """Continue from a :meth:`state`: the following batches are those the saved run would see."""
        self.check_state(state)
        self.epoch_index, self.position, self.seed = state["epoch"], state["position"], state["seed"]
