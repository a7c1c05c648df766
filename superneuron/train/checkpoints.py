"""The Trainer's snapshots: when and where they are written, and resuming from one (their format: snapshot.py)."""

import json
import os

import numpy as np

from ..errors import SNError
from . import snapshot as snap


class Snapshots:
    """The snapshot part of :class:`superneuron.train.trainer.Trainer`: it reads the trainer's
    ``net``, ``solver``, ``group``, ``writes``, ``snapshot_dir``, ``prefix``, ``snapshot_keep``,
    ``train_loader`` and ``iteration``, and sets the last two on :meth:`restore`."""

    def _identity(self):
        return {"net": self.net.graph.name, "fingerprint": snap.fingerprint(self.net),
                "solver": self.solver.type}

    @property
    def snapshots(self):
        """Whether this run writes snapshots: a snapshot folder, or the solver's snapshot_prefix."""
        return bool(self.snapshot_dir or self.prefix)

    def snapshot(self, path=None):
        """Write the state of training to ``path`` (default: the snapshot folder, and with the
        solver's ``snapshot_prefix`` Caffe's pair ``PREFIX_iter_N.caffemodel`` and
        ``.solverstate``) atomically; its path (the folder's snapshot, else the solverstate).
        With ranks, every rank calls it and rank 0 writes (the others return None), once they
        all agree on the iteration (else SNError, and nothing is written)."""
        if self.group is not None:
            if not self.group.agree(self.iteration, f"the snapshot of iteration {self.iteration}"):
                raise SNError(f"the ranks are not all at iteration {self.iteration}: "
                              f"no snapshot written")
            if not self.writes:
                return None
        written = None
        if path is not None or self.snapshot_dir:
            written = self._snapshot(path)
        if path is None and self.prefix is not None:
            from ..netfile.caffe.weights import write_caffemodel  # late: protobuf's start-up cost
            stem = f"{self.prefix}_iter_{self.iteration}"
            state = self._snapshot(stem + ".solverstate")
            write_caffemodel(self.net, stem + ".caffemodel")
            written = written or state
        return written

    def _snapshot(self, path=None):
        path = path or os.path.join(self.snapshot_dir, f"{self.net.graph.name}_iter_{self.iteration}.npz")
        # the resident arrays themselves (under parameter offload, the masters on the host): a
        # device copy left placed by a test pass that Ctrl-C cut short may be half copied
        resident, to_host = self.net.runtime.resident, self.net.backend.to_host
        arrays = {key: to_host(resident[key.split(":", 1)[1]]) for key in snap.expected_arrays(self.net)}
        meta = dict(self._identity(), iteration=self.iteration, loader=self.train_loader.state())
        written = snap.write(path, json.loads(json.dumps(meta, default=_jsonable)), arrays)
        if self.snapshot_dir and os.path.dirname(os.path.abspath(written)) == os.path.abspath(self.snapshot_dir):
            snap.prune(self.snapshot_dir, self.net.graph.name, written, self.snapshot_keep)
        return written

    def restore(self, path, on_event=lambda event: None):
        """Continue from the snapshot at ``path``, checked whole first; returns the path used.

        ``path`` may be a folder: its newest snapshot of this net that passes every check is
        used, and each newer one that does not is reported as a ``skipped_snapshot`` event
        (``path``, ``error``); another net's snapshots are never considered."""
        if not os.path.isdir(path):
            meta, arrays = self._read(path)
        else:
            name = self.net.graph.name
            files = snap.candidates(path, name)
            if not files:
                raise SNError(f"{path}: no snapshots of net '{name}' ({name}_iter_N.npz) to resume from")
            errors = []
            for file in files:
                try:
                    meta, arrays = self._read(file)
                    path = file
                    break
                except SNError as e:
                    errors.append(str(e))
                    on_event({"kind": "skipped_snapshot", "path": file, "error": str(e)})
            else:
                raise SNError(f"{path}: none of its {len(files)} snapshots of net '{name}' is usable; "
                              f"the newest: {errors[0]}")
        for key, value in arrays.items():
            self.net.backend.copy_from_host(self.net.runtime.resident[key.split(":", 1)[1]], value)
        self.train_loader.restore(meta["loader"])
        self.iteration = meta["iteration"]
        return path

    def _read(self, path):
        """``(meta, arrays)`` of the snapshot at ``path`` if it fits this net, solver and data."""
        meta, arrays = snap.read(path, snap.expected_arrays(self.net), self._identity())
        try:
            self.train_loader.check_state(meta.get("loader"))
        except SNError as e:
            raise snap.BadSnapshot(f"{path}: {e}") from None
        return meta, arrays


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(type(value))
