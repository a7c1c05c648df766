"""A data set's split as the loaders see it: :class:`Dataset` (labels, sample shape, and
normalised float32 batches), the crop and flip every source shares, and the one-line form of a
reader's exception. The readers (data.py's own, and Caffe's LMDB and image lists in caffe/) build
on this module.
"""

import numpy as np

from ..errors import SNError


def one_line(e):
    """An exception as one line: its type and the first line of its text."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


class Dataset:
    """One split of a source: integer ``labels``, ``num_classes``, ``sample_shape`` (after
    cropping) and :meth:`batch`, which makes a normalised float32 batch from sample indices."""

    def __init__(self, name, labels, num_classes, sample_shape, cfg, unit):
        self.name, self.labels, self.num_classes = name, labels, num_classes
        self.sample_shape = tuple(sample_shape)
        self.crop, self.mirror = cfg["crop"], cfg["mirror"]
        self.factor = np.float32(unit * cfg["scale"])
        c = self.sample_shape[0]
        self.mean, self.std = (np.broadcast_to(np.asarray(cfg[k], np.float32), (c,)).reshape(c, 1, 1)
                               if cfg[k] else None for k in ("mean", "std"))

    def __len__(self):
        return len(self.labels)

    def batch(self, idx, rng=None, train=False):
        """Samples ``idx`` as float32 ``(n, C, H, W)``; random crops and flips only when ``train``."""
        idx = np.asarray(idx, dtype=np.int64)
        x = self._pixels(idx, rng if rng is not None else np.random.default_rng(0), train)
        x = x.astype(np.float32, copy=False)  # _pixels returns a new array: the stored samples stay
        with np.errstate(over="ignore", invalid="ignore"):  # checked below, in one line
            if self.factor != 1:
                x *= self.factor
            if self.mean is not None:
                x -= self.mean
            if self.std is not None:
                x /= self.std
        if not np.isfinite(x.sum()):  # one cheap pass; the sum of finite values may still overflow
            bad = ~np.isfinite(x.reshape(len(x), -1)).all(axis=1)
            if bad.any():
                raise SNError(f"{self.name}: sample {int(idx[bad][0])} is non-finite after scale, mean and "
                              f"std (batch of samples {int(idx.min())}..{int(idx.max())})")
        return x

    def batch_labels(self, idx, valid=None):
        """The labels of samples ``idx`` as a batch (float32, one per sample); those from
        ``valid`` on (the padding of a test pass's last batch) -1, which losses ignore."""
        y = self.labels[idx].astype(np.float32)
        if valid is not None:
            y[valid:] = -1
        return y

    def _pixels(self, idx, rng, train):
        """Samples ``idx`` cropped and flipped, as a new array in the stored dtype."""
        raise NotImplementedError


def crop_mirror(x, idx, crop, mirror, rng, train):
    """``x[idx]`` cut to ``crop``×``crop`` (random offsets when training, else centred) and, when
    training with ``mirror``, each sample flipped left-right with probability 1/2; one gather."""
    if not crop and not (mirror and train):
        return x[idx]
    n, (c, h, w) = len(idx), x.shape[1:]
    kh, kw = (crop, crop) if crop else (h, w)
    if train and crop:
        oy, ox = rng.integers(0, h - kh + 1, n), rng.integers(0, w - kw + 1, n)
    else:
        oy, ox = np.full(n, (h - kh) // 2), np.full(n, (w - kw) // 2)
    rows = oy[:, None] + np.arange(kh)
    cols = ox[:, None] + np.arange(kw)
    if train and mirror:
        flip = rng.random(n) < 0.5
        cols[flip] = cols[flip, ::-1]
    channels = np.arange(c)[:, None, None]
    return x[idx[:, None, None, None], channels, rows[:, None, :, None], cols[:, None, None, :]]


class ShardDraws:
    """The random draws of one rank's shard of a global batch: each draw of ``n`` values (one
    per sample: crop_mirror's crops and flips) is the rank's part of the draw the whole
    batch would make, so a shard's samples come out as they would in the global batch."""

    def __init__(self, rng, rank, ranks):
        self.rng, self.rank, self.ranks = rng, rank, ranks

    def _part(self, values, n):
        return values[self.rank * n:(self.rank + 1) * n]

    def integers(self, low, high, n):
        return self._part(self.rng.integers(low, high, n * self.ranks), n)

    def random(self, n):
        return self._part(self.rng.random(n * self.ranks), n)


def split_by_class(labels, fraction, seed):
    """Sorted train and test indices: from each class, round(fraction × its count) samples (halves
    round up) chosen by a seeded shuffle go to the test set."""
    rng = np.random.default_rng(seed)
    is_test = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        is_test[members[:int(fraction * len(members) + 0.5)]] = True
    return np.flatnonzero(~is_test), np.flatnonzero(is_test)
