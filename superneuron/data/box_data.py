"""Synthetic detection data: images with boxes, for SSD's AnnotatedData layer (``boxes`` > 0).

Each image holds ``boxes`` rectangles of random classes (1 .. classes − 1: class 0 is the
background), each filled with its class's colour over a noisy grey background, so a detector
can learn them. Only the boxes are stored; an image is drawn when its batch is made, from the
seed and its index, so a 300×300 set costs no memory. A batch's labels are Caffe's annotated
label blob: ``(1, 1, batch × boxes, 8)``, rows ``[image in batch, label, instance, xmin,
ymin, xmax, ymax, difficult]`` (coordinates normalised to [0, 1]); the padded samples of a
test pass get image -1, which MultiBoxLoss skips, as Caffe's readers do.
"""

import numpy as np

from ..errors import SNError
from .dataset import Dataset


def describe_boxes(cfg):
    """``(sample_shape, classes)`` of synthetic boxes; SNError for any other source."""
    if cfg["source"] != "synthetic":
        raise SNError(f"{cfg['source']}: annotated data (boxes) is made here only as 'synthetic'; "
                      "an annotated LMDB (AnnotatedDatum records) is not read")
    if cfg["classes"] < 2:
        raise SNError(f"synthetic boxes need at least 2 classes (the background and one), got {cfg['classes']}")
    if cfg["crop"] or cfg["mirror"]:
        raise SNError("synthetic boxes: crop and mirror are not applied to boxes; leave them off")
    side = cfg["size"] or 32
    return (cfg["channels"] or 3, side, side), cfg["classes"]


def open_boxes(cfg):
    """``(train, test)`` BoxDatasets of ``cfg`` (the Data options plus ``boxes``)."""
    shape, classes = describe_boxes(cfg)
    rng = np.random.default_rng(cfg["seed"])
    n, g = cfg["samples"], cfg["boxes"]
    labels = np.zeros((n, g, 7), dtype=np.float32)  # label, instance, xmin, ymin, xmax, ymax, difficult
    size = rng.uniform(0.2, 0.5, (n, g, 2))
    corner = rng.uniform(0.0, 1.0, (n, g, 2)) * (1 - size)
    labels[..., 0] = rng.integers(1, classes, (n, g))
    labels[..., 1] = np.arange(g)
    labels[..., 2:4] = corner
    labels[..., 4:6] = corner + size
    colours = np.random.default_rng([cfg["seed"], 1]).uniform(-1, 1, (classes, shape[0])).astype(np.float32)
    test = int(n * cfg["test_fraction"])
    return (BoxDataset("synthetic boxes (train)", labels[test:], classes, shape, cfg, colours, test),
            BoxDataset("synthetic boxes (test)", labels[:test], classes, shape, cfg, colours, 0))


class BoxDataset(Dataset):
    """Images drawn from their boxes (``labels``: (samples, boxes, 7)); see the module."""

    def __init__(self, name, labels, num_classes, shape, cfg, colours, first):
        super().__init__(name, labels, num_classes, shape, cfg, 1.0)
        self.colours, self.first, self.seed = colours, first, cfg["seed"]

    @property
    def class_labels(self):
        """The boxes' classes (what check_labels compares with the net's classes)."""
        return self.labels[..., 0].reshape(-1)

    def _pixels(self, idx, rng, train):
        c, h, w = self.sample_shape
        out = np.empty((len(idx), c, h, w), dtype=np.float32)
        for k, i in enumerate(idx):
            noise = np.random.default_rng([self.seed, 2, self.first + int(i)])
            out[k] = 0.5 + 0.1 * noise.standard_normal((c, h, w), dtype=np.float32)
            for row in self.labels[i]:
                x0, x1 = int(row[2] * w), max(int(row[4] * w), int(row[2] * w) + 1)
                y0, y1 = int(row[3] * h), max(int(row[5] * h), int(row[3] * h) + 1)
                out[k, :, y0:y1, x0:x1] = 0.5 + 0.4 * self.colours[int(row[0])][:, None, None]
        return out

    def batch_labels(self, idx, valid=None):
        """Caffe's annotated label blob of samples ``idx``: (1, 1, len(idx) × boxes, 8); samples
        from ``valid`` on (a test pass's padding) get image -1."""
        rows = self.labels[np.asarray(idx)]
        out = np.empty(rows.shape[:2] + (8,), dtype=np.float32)
        out[..., 0] = np.arange(len(rows))[:, None]
        out[..., 1:] = rows
        if valid is not None:
            out[valid:, :, 0] = -1
        return out.reshape(1, 1, -1, 8)
