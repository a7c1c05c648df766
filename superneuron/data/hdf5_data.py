"""Caffe's HDF5Data source (host side): a text file listing ``.h5`` files, one a line, each
holding one dataset per top of the layer, named as the top, the first axis the samples.

    shapes = describe("train.txt", ["data", "label"])          # per-sample shapes, from the first file
    batches = HDF5Batches("train.txt", ["data", "label"], batch_size=64, shuffle=False)
    feed = batches.next()                                        # {"data": (64, ...), "label": (64, ...)}

As Caffe's HDF5DataLayer: the files in the list's order, each file's rows in order, a batch that
runs past a file's end continued from the next file, the last file followed by the first; with
``shuffle``, the files' order and each file's rows are shuffled (here from a seed, so a run is
repeatable). Values are read as float32, as Caffe reads them into its float blobs.

h5py is an optional dependency (``pip install 'superneuron[hdf5]'``); without it the layer is
one line saying so.
"""

import numpy as np

from ..errors import SNError


def _h5py():
    try:
        import h5py
    except ImportError:
        raise SNError("HDF5Data needs h5py, which is not installed: pip install h5py "
                      "(or pip install 'superneuron[hdf5]')") from None
    return h5py


def file_list(source):
    """The .h5 paths ``source`` lists (relative ones relative to the working folder, as Caffe
    reads them); SNError if the list cannot be read or is empty."""
    try:
        with open(source, encoding="utf-8") as f:
            paths = [line.strip() for line in f if line.strip()]
    except OSError as e:
        raise SNError(f"HDF5Data source {source}: {e.strerror or e}") from None
    if not paths:
        raise SNError(f"HDF5Data source {source}: lists no .h5 file")
    return paths


def _read(path, tops):
    """``{top: float32 array}`` of one file; SNError naming the file for what is wrong."""
    h5py = _h5py()
    try:
        with h5py.File(path, "r") as f:
            out = {}
            for top in tops:
                if top not in f:
                    raise SNError(f"HDF5 file {path} has no dataset '{top}' (it has: {', '.join(sorted(f)) or 'none'})")
                out[top] = np.asarray(f[top], dtype=np.float32)
    except OSError as e:
        raise SNError(f"HDF5 file {path}: cannot be read ({e})") from None
    rows = {len(a) if a.ndim else 0 for a in out.values()}
    if len(rows) != 1 or 0 in rows:
        raise SNError(f"HDF5 file {path}: its datasets {', '.join(tops)} must have the same number "
                      f"(>= 1) of rows, got {', '.join(str(a.shape) for a in out.values())}")
    return out


def describe(source, tops):
    """``{top: the shape of one sample}`` from the first file ``source`` lists."""
    first = _read(file_list(source)[0], tops)
    return {top: tuple(a.shape[1:]) for top, a in first.items()}


class HDF5Batches:
    """Batches of ``batch_size`` rows of every top, in Caffe's order (see the module's doc)."""

    def __init__(self, source, tops, batch_size, shuffle=False, seed=0):
        self.source, self.tops, self.batch = source, list(tops), batch_size
        self.paths = file_list(source)
        self.shuffle, self.rng = shuffle, np.random.default_rng(seed)
        self.shapes = describe(source, self.tops)
        self.order = self._order(len(self.paths))
        self.file_index = 0
        self._open(0)

    def _order(self, n):
        return self.rng.permutation(n) if self.shuffle else np.arange(n)

    def _open(self, index):
        path = self.paths[self.order[index]]
        self.current = _read(path, self.tops)
        for top, a in self.current.items():
            if a.shape[1:] != self.shapes[top]:
                raise SNError(f"HDF5 file {path}: dataset '{top}' has samples of shape {a.shape[1:]}; "
                              f"the first file's are {self.shapes[top]}")
        self.rows = self._order(len(self.current[self.tops[0]]))
        self.row = 0

    def next(self):
        """The next batch: ``{top: (batch_size, ...) float32}``."""
        parts = {top: [] for top in self.tops}
        need = self.batch
        while need:
            take = self.rows[self.row:self.row + need]
            for top in self.tops:
                parts[top].append(self.current[top][take])
            need -= len(take)
            self.row += len(take)
            if self.row == len(self.rows):
                self.file_index += 1
                if self.file_index == len(self.paths):  # an epoch: Caffe reshuffles the files
                    self.file_index = 0
                    if self.shuffle:
                        self.order = self._order(len(self.paths))
                self._open(self.file_index)
        return {top: np.concatenate(p) for top, p in parts.items()}

