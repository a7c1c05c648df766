"""Image folders as a source: one subfolder per class, under train/ and test/ (or val/) or split off."""

import os

import numpy as np

from ..errors import SNError
from .dataset import Dataset, crop_mirror, one_line, split_by_class

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".gif", ".tif", ".tiff", ".webp")


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


def folder_dirs(root):
    """``(train_dir, test_dir)``: ``train/`` and ``test/`` (or ``val/``) when both exist, else
    ``(root, None)`` and the test set is split off by test_fraction."""
    train = os.path.join(root, "train")
    tests = [os.path.join(root, d) for d in ("test", "val") if os.path.isdir(os.path.join(root, d))]
    if os.path.isdir(train) and tests:
        return train, tests[0]
    return root, None


def folder_classes(d):
    """The class names of the image folder ``d``: its subfolders, sorted."""
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


def open_folder(root, cfg):
    """``(train, test)`` :class:`ImageFolder` datasets of the image folder ``root``."""
    train_dir, test_dir = folder_dirs(root)
    classes = folder_classes(train_dir)
    paths, labels = _folder_images(train_dir, classes)
    if test_dir is None:
        train, test = split_by_class(labels, cfg["test_fraction"], cfg["seed"])
        test_paths, test_labels = [paths[i] for i in test], labels[test]
        paths, labels = [paths[i] for i in train], labels[train]
    else:
        extra = sorted(set(folder_classes(test_dir)) - set(classes))
        if extra:
            raise SNError(f"{os.path.join(test_dir, extra[0])}: class not in {train_dir}")
        test_paths, test_labels = _folder_images(test_dir, classes)
    n = len(classes)
    return (ImageFolder(f"{train_dir} (train)", paths, labels, n, cfg),
            ImageFolder(f"{test_dir or root} (test)", test_paths, test_labels, n, cfg))
