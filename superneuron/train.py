"""Trainer: the solver loop. It reads like a Caffe solver file: train, display every
``display`` iterations, test every ``test_interval``, snapshot every ``snapshot`` and at the end,
and on Ctrl-C snapshot, then stop.

Nothing here prints: the loop reports events (dicts) to a callback, and the CLI prints them.
Snapshots hold the weights, optimiser state, iteration and data position; they are written to
a temporary file and renamed, so a killed run never leaves a broken one, and a resumed run
continues exactly where the snapshot left it (bit-identical losses on the CPU).
"""

import glob
import json
import os
import time

import numpy as np

from .errors import SNError

SNAPSHOT_FORMAT = 1


class Trainer:
    """Trains ``net`` (built with an optimiser) on batches from ``train_loader``.

    ``solver`` is an optim.SolverConfig (max_iter, display, test_interval, test_iter,
    snapshot); ``snapshot_dir`` None disables snapshots; ``log_path`` writes one JSON object
    per display and test interval.
    """

    def __init__(self, net, solver, train_loader, test_loader=None, snapshot_dir=None, log_path=None):
        self.net, self.solver = net, solver
        self.train_loader, self.test_loader = train_loader, test_loader
        self.snapshot_dir, self.log_path = snapshot_dir, log_path
        self.iteration = 0
        self.inputs = net.input_names
        if len(self.inputs) != 2:
            raise SNError(f"net '{net.graph.name}' must have exactly two inputs (data, label) to be "
                          f"trained; it has {', '.join(self.inputs) or 'none'}")
        if snapshot_dir is not None:
            _check_writable(snapshot_dir)
        if log_path is not None:
            _check_writable(os.path.dirname(os.path.abspath(log_path)))

    # -- the loop -------------------------------------------------------------------------
    def run(self, on_event=lambda event: None):
        """Train from the current iteration to ``solver.max_iter``; returns the last test result
        (or None). Events: ``iter``, ``display``, ``test``, ``snapshot``, ``interrupted``."""
        s = self.solver
        log = open(self.log_path, "a") if self.log_path else None
        last_test = None
        window = _Window()
        try:
            while self.iteration < s.max_iter:
                it = self.iteration
                x, y = self.train_loader.next()
                start = time.perf_counter()
                loss = self.net.train_step({self.inputs[0]: x, self.inputs[1]: y}, it)
                if not np.isfinite(loss):
                    raise SNError(f"loss is {loss} at iteration {it}: lower the learning rate "
                                  f"(--lr) or check the data")
                self.iteration = it + 1
                window.add(loss, self._accuracy(self.net.outputs), len(x), time.perf_counter() - start,
                           first=(it == 0))
                on_event({"kind": "iter", "iter": self.iteration, "loss": loss})
                if s.display and (self.iteration % s.display == 0 or self.iteration == s.max_iter):
                    record = dict(window.summary(), iter=self.iteration, lr=self.net.optimizer.lr(it),
                                  peak_bytes=self.net.peak_bytes)
                    window = _Window()
                    on_event(dict(record, kind="display"))
                    _log(log, record)
                if self.test_loader is not None and (self.iteration == s.max_iter or (
                        s.test_interval and self.iteration % s.test_interval == 0)):
                    last_test = dict(self.test(), iter=self.iteration)
                    on_event(dict(last_test, kind="test"))
                    _log(log, last_test)
                if (self.snapshot_dir and s.snapshot and self.iteration % s.snapshot == 0
                        and self.iteration != s.max_iter):
                    on_event({"kind": "snapshot", "path": self.snapshot()})
            if self.snapshot_dir:
                on_event({"kind": "snapshot", "path": self.snapshot()})
        except KeyboardInterrupt:
            if self.snapshot_dir:
                on_event({"kind": "interrupted", "iter": self.iteration, "path": self.snapshot()})
            else:
                on_event({"kind": "interrupted", "iter": self.iteration, "path": None})
        finally:
            if log:
                log.close()
        return last_test

    def _accuracy(self, outputs):
        accs = [v for n, v in outputs.items() if self.net.graph.node(n).layer.type == "Accuracy"]
        return accs[0] if accs else None

    def test(self):
        """Loss and accuracy over the test set (or ``test_iter`` batches), weighting each batch
        by its number of real samples (the last one is padded with ignored labels)."""
        total = loss = correct = 0.0
        has_acc = False
        for k, (x, y, n_valid) in enumerate(self.test_loader.epoch()):
            if self.solver.test_iter and k >= self.solver.test_iter:
                break
            outputs = self.net.forward({self.inputs[0]: x, self.inputs[1]: y}, train=False)
            loss += self.net.loss * n_valid
            acc = self._accuracy(outputs)
            if acc is not None:
                has_acc = True
                correct += acc * n_valid
            total += n_valid
        result = {"test_loss": loss / max(total, 1), "test_samples": int(total)}
        if has_acc:
            result["test_accuracy"] = correct / max(total, 1)
        return result

    # -- snapshots ------------------------------------------------------------------------
    def snapshot(self, path=None):
        """Write the state of training to ``path`` (default: the snapshot folder) atomically."""
        path = path or os.path.join(self.snapshot_dir, f"{self.net.graph.name}_iter_{self.iteration}.npz")
        arrays = {f"param:{n}": self.net.runtime.to_host(n) for n in self.net.param_names}
        for name in self.net.runtime.resident:
            if self.net.graph.tensors.get(name) is None:  # optimiser state
                arrays[f"opt:{name}"] = self.net.runtime.to_host(name)
        meta = {"format": SNAPSHOT_FORMAT, "net": self.net.graph.name, "iteration": self.iteration,
                "signature": _signature(self.net), "loader": self.train_loader.state(),
                "solver": self.solver.type}
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            np.savez(f, __meta__=np.array(json.dumps(meta, default=_jsonable)), **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path

    def restore(self, path):
        """Continue from the snapshot at ``path`` (a file, or a folder: its newest snapshot)."""
        path = latest_snapshot(path) if os.path.isdir(path) else path
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["__meta__"]))
                arrays = {k: z[k] for k in z.files if k != "__meta__"}
        except FileNotFoundError:
            raise SNError(f"{path}: no such snapshot") from None
        except Exception as e:  # noqa: BLE001 - zip, json and key errors all mean "not a snapshot"
            raise SNError(f"{path}: not a superneuron snapshot ({type(e).__name__})") from None
        if meta.get("signature") != _signature(self.net):
            raise SNError(f"{path}: snapshot of a different net ('{meta.get('net')}'), "
                          f"not of '{self.net.graph.name}' as loaded")
        if meta.get("solver") != self.solver.type:
            raise SNError(f"{path}: snapshot of a {meta.get('solver')} solver; this run uses "
                          f"{self.solver.type}")
        for key, value in arrays.items():
            name = key.split(":", 1)[1]
            if name not in self.net.runtime.resident:
                raise SNError(f"{path}: snapshot has '{name}', which this net and solver lack")
            self.net.backend.copy_from_host(self.net.runtime.resident[name], value)
        self.train_loader.restore(meta["loader"])
        self.iteration = int(meta["iteration"])
        return path


def latest_snapshot(folder):
    """The complete snapshot with the highest iteration in ``folder``."""
    files = glob.glob(os.path.join(folder, "*_iter_*.npz"))
    if not files:
        raise SNError(f"{folder}: no snapshots (*_iter_N.npz) to resume from")
    return max(files, key=lambda f: int(f.rsplit("_iter_", 1)[1][:-4]))


def _signature(net):
    return [[n, list(net.graph.tensors[n].shape)] for n in net.param_names]


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(type(value))


def _check_writable(folder):
    try:
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, ".sn-write-test")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise SNError(f"{folder}: cannot write there ({e.strerror})") from None


def _log(log, record):
    if log is not None:
        log.write(json.dumps(record) + "\n")
        log.flush()


class _Window:
    """Averages over a display interval; the first iteration is left out of speed figures."""

    def __init__(self):
        self.losses, self.accs, self.images, self.seconds = [], [], 0, 0.0

    def add(self, loss, acc, images, seconds, first=False):
        self.losses.append(loss)
        if acc is not None:
            self.accs.append(acc)
        if not first:
            self.images += images
            self.seconds += seconds

    def summary(self):
        out = {"loss": float(np.mean(self.losses)),
               "img_per_s": self.images / self.seconds if self.seconds else None}
        if self.accs:
            out["accuracy"] = float(np.mean(self.accs))
        return out
