"""Trainer: the solver loop. It reads like a Caffe solver file: train, display every
``display`` iterations, test every ``test_interval``, snapshot every ``snapshot`` and at the end,
and on Ctrl-C snapshot, then stop.

Nothing here prints: the loop reports events (dicts) to a callback, and the CLI prints them.
Snapshots (snapshot.py) hold the weights, optimiser state, iteration and data position; they
are written to a temporary file and renamed, so a killed run never leaves a broken one, and are
checked whole before use. A resumed run continues exactly where the snapshot left it
(bit-identical losses on the CPU), after a Ctrl-C too: Ctrl-C during a training step takes
effect when the step is done, so a snapshot never holds half an update or a loader that is
ahead of its iteration. With ranks (mpiexec forwards Ctrl-C to each), Ctrl-C is held all the
time and the ranks agree on where to stop: each iteration's all-reduce of the loss carries
whether a rank has seen it, so that every rank stops after the same iteration and rank 0
snapshots it.
"""

import collections
import contextlib
import json
import os
import signal
import threading
import time
import uuid
import weakref

import numpy as np

from ..errors import SNError, where
from ..files import LineFile, check_output_path
from . import snapshot as snap


class Trainer:
    """Trains ``net`` (built with an optimiser) on batches from ``train_loader``.

    ``solver`` is a solver_config.SolverConfig (max_iter, display, test_interval, test_iter,
    snapshot); ``snapshot_dir`` None disables snapshots, else the folder is locked for this
    trainer's life (a second run on it is refused) and only the ``snapshot_keep`` newest
    snapshots of the net are kept there (0: all); ``log_path`` appends one JSON object
    per line: a ``start`` record, then one per display (``display``) and test (``test``), and an
    ``end`` record; each has ``kind``, ``time`` (Unix seconds) and ``run`` (an id shared by the
    records of one run, so that runs appended to one file can be told apart).

    After :meth:`run`, ``run_images`` and ``run_seconds`` add up the images and the seconds of
    the training steps of that run, leaving out its first step (it plans and warms up):
    :attr:`average_rate` is their ratio.

    ``group``: the ranks of data-parallel training (runtime/collective.py), or None. Every rank
    trains; only rank 0 writes snapshots (give the others no ``log_path`` and no test loader:
    rank 0 alone logs and tests), each written only when every rank is at the same iteration;
    images count those of every rank. Ctrl-C on any rank stops every rank after the same
    iteration (the first whose loss all-reduce carries it); a test pass under way is cut short
    (rank 0 then trains the next iteration, in which the others wait for it, and all stop
    after it).
    """

    def __init__(self, net, solver, train_loader, test_loader=None, snapshot_dir=None, log_path=None,
                 group=None):
        self.net, self.solver = net, solver
        self.group = group
        self.writes = group is None or group.rank == 0
        self.train_loader, self.test_loader = train_loader, test_loader
        self.snapshot_dir, self.log_path = snapshot_dir, log_path
        # Caffe's snapshot_prefix: PREFIX_iter_N.caffemodel (weights Caffe reads) and
        # PREFIX_iter_N.solverstate (our snapshot format, which --resume reads), as Caffe names them
        self.prefix = getattr(solver, "snapshot_prefix", "") or None
        self.iteration = 0
        self.run_images, self.run_seconds = 0, 0.0
        self.run_id = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.inputs = net.input_names
        if len(self.inputs) != 2:
            raise SNError(f"net '{net.graph.name}' must have exactly two inputs (data, label) to be "
                          f"trained; it has {', '.join(self.inputs) or 'none'}")
        self.snapshot_keep = snap.DEFAULT_KEEP  # the newest snapshots kept (0: all); sn-train's --snapshot-keep
        if snapshot_dir is not None and self.writes:
            _check_writable(snapshot_dir)
            # held for this trainer's life (the process's, in sn-train): a second run on the
            # folder is refused before it removes the .tmp the first one is writing
            weakref.finalize(self, snap.unlock_folder, snap.lock_folder(snapshot_dir))
            snap.remove_stale_tmp(snapshot_dir, net.graph.name)
        if self.prefix is not None and self.writes:
            _check_writable(os.path.dirname(os.path.abspath(self.prefix)))
        if log_path is not None:
            check_output_path(log_path, "log")
            _check_writable(os.path.dirname(os.path.abspath(log_path)))

    # -- the loop -------------------------------------------------------------------------
    def run(self, on_event=lambda event: None):
        """Train from the current iteration to ``solver.max_iter``; returns the last test result
        (or None). Events: ``iter`` (with the step's ``images`` and ``seconds``), ``display``,
        ``test_batch`` (``batch`` of ``batches``, during a test pass), ``test``, ``snapshot``,
        ``interrupted``.

        On Ctrl-C (KeyboardInterrupt) it snapshots the state after the last whole iteration and
        returns (with ranks, after the iteration they agree on: see the module's docstring); a
        non-finite loss is an SNError naming the iteration and the first layer whose top went
        non-finite."""
        # NumPy's overflow warnings would bury the one-line error a non-finite loss gets
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return self._run(on_event)

    def _run(self, on_event):
        s = self.solver
        log = LineFile(self.log_path) if self.log_path else None
        last_test = None
        window = _Window()
        recent = collections.deque(maxlen=s.average_loss)  # Caffe's average_loss: display smoothing
        ctrl_c = _HeldInterrupt(always=self.group is not None)  # ranks stop where they agree
        warm = False  # the first step of a run plans, allocates and warms up: left out of speeds
        self.run_images, self.run_seconds = 0, 0.0
        self._log(log, "start", net=self.net.graph.name, device=self.net.backend.name,
                  policy=self.net.policy, batch=self.train_loader.batch, iter_size=self.net.iter_size,
                  start_iter=self.iteration, max_iter=s.max_iter, solver=s.type)
        try:
            while self.iteration < s.max_iter:
                it = self.iteration
                position = self.train_loader.state()
                try:  # iter_size batches: Caffe's gradient accumulation
                    batches = [self.train_loader.next() for _ in range(self.net.iter_size)]
                except KeyboardInterrupt:
                    self.train_loader.restore(position)  # the batches were never trained on
                    raise
                feeds = [{self.inputs[0]: x, self.inputs[1]: y} for x, y in batches]
                feed = feeds[0] if len(feeds) == 1 else feeds
                images = sum(len(x) for x, _ in batches) * (1 if self.group is None else self.group.size)
                start = time.perf_counter()
                stop = False
                with ctrl_c.held():  # a step is done whole or not at all
                    loss = self.net.train_step(feed, it)
                    accuracy = self._accuracy(self.net.outputs)
                    if self.group is not None:
                        loss, accuracy, stop = self._ranks_mean(loss, accuracy, ctrl_c.pending, it)
                if not np.isfinite(loss):
                    raise SNError(self._non_finite_loss(loss, feed, it))
                self.iteration = it + 1
                if stop or (self.group is None and ctrl_c.pending):
                    raise KeyboardInterrupt
                seconds = time.perf_counter() - start
                if s.display:  # display 0: no window is ever shown, and one kept would grow for ever
                    window.add(loss, accuracy, images, seconds, first=not warm)
                if warm:
                    self.run_images += images
                    self.run_seconds += seconds
                recent.append(loss)
                on_event({"kind": "iter", "iter": self.iteration, "loss": loss, "images": images,
                          "seconds": seconds, "warmup": not warm})
                warm = True
                if s.display and (self.iteration % s.display == 0 or self.iteration == s.max_iter):
                    record = dict(window.summary(), iter=self.iteration, lr=self.net.optimizer.lr(it),
                                  peak_bytes=self.net.peak_bytes)
                    if s.average_loss > 1:  # the mean of the last average_loss iterations, as Caffe shows
                        record["loss"] = float(np.mean(recent))
                    window = _Window()
                    on_event(dict(record, kind="display"))
                    self._log(log, "display", **record)
                if self.test_loader is not None and (self.iteration == s.max_iter or (
                        s.test_interval and self.iteration % s.test_interval == 0)):
                    result = self.test(on_event, cut=lambda: ctrl_c.pending)
                    if result is not None:
                        last_test = dict(result, iter=self.iteration)
                        on_event(dict(last_test, kind="test"))
                        self._log(log, "test", **last_test)
                if (self.snapshots and s.snapshot and self.iteration % s.snapshot == 0
                        and self.iteration != s.max_iter):
                    on_event({"kind": "snapshot", "path": self.snapshot()})
            if self.snapshots:
                on_event({"kind": "snapshot", "path": self.snapshot()})
        except KeyboardInterrupt:
            ctrl_c.restore()  # a second Ctrl-C during the snapshot stops at once
            if self.snapshots:
                on_event({"kind": "interrupted", "iter": self.iteration, "path": self.snapshot()})
            else:
                on_event({"kind": "interrupted", "iter": self.iteration, "path": None})
        finally:
            ctrl_c.restore()
            if log:
                self._log(log, "end", iter=self.iteration, img_per_s=self.average_rate,
                          peak_bytes=self.net.peak_bytes, arena_bytes=self.net.arena_bytes)
                log.close()
        return last_test

    @property
    def average_rate(self):
        """Images per second over the training steps of the last :meth:`run` (its first step
        left out), or None when it timed none."""
        return self.run_images / self.run_seconds if self.run_seconds else None

    def _log(self, log, kind, **record):
        if log is not None:
            log.write_line(json.dumps({"kind": kind, "time": round(time.time(), 3), "run": self.run_id,
                                       **record}))

    def _ranks_mean(self, loss, accuracy, interrupted, it):
        """``(loss, accuracy, stop)`` of the global batch: the means of the ranks' shards, and
        whether any rank has seen Ctrl-C (all ranks get the same answer, and stop together)."""
        values = [loss, 1.0 if interrupted else 0.0] + ([accuracy] if accuracy is not None else [])
        loss, stop, *rest = self.group.mean(values, f"the loss of iteration {it}")
        return loss, (rest[0] if rest else None), stop > 0

    def _non_finite_loss(self, loss, feed, it):
        """The message for a loss that went non-finite at iteration ``it``: the runtime skipped
        that iteration's update, so its forward is re-run (same batch, same dropout masks)
        checking every top, to name the first layer whose output is non-finite."""
        msg = f"loss is {loss} at iteration {it}"
        advice = "lower the learning rate (--lr) or check the data"
        # learned parameters only: this iteration's forward has already updated running statistics
        bad = [n for n in self.net.learnable_names if not np.all(np.isfinite(self.net.param(n)))]
        if bad:
            return f"{msg}; parameter '{bad[0]}' is non-finite: lower the learning rate (--lr)"
        node = self.net.first_non_finite(feed, it)
        if node is None:
            return f"{msg}: {advice}"
        at = where(node.spec.file, node.spec.line) if node.spec else ""
        return f"{msg}, first non-finite output at {at}layer '{node.name}' ({node.layer.type}); {advice}"

    def _accuracy(self, outputs):
        accs = [v for n, v in outputs.items() if self.net.graph.node(n).layer.type == "Accuracy"]
        return accs[0] if accs else None

    def test_batches(self):
        """Batches in one test pass (``test_iter``, or the whole test set)."""
        n = len(self.test_loader) if self.test_loader is not None else 0
        return min(n, self.solver.test_iter) if self.solver.test_iter else n

    def test(self, on_event=lambda event: None, cut=lambda: False):
        """Loss and accuracy over the test set (or ``test_iter`` batches), weighting each batch
        by its number of real samples (the last one is padded with ignored labels). Reports a
        ``test_batch`` event after each batch. None once ``cut()`` is true before a batch (a
        Ctrl-C held under ranks: the pass is left, and half of it is no result)."""
        total = loss = correct = 0.0
        has_acc = False
        batches = self.test_batches()
        for k, (x, y, n_valid) in enumerate(self.test_loader.epoch()):
            if k >= batches:
                break
            if cut():
                return None
            outputs = self.net.forward({self.inputs[0]: x, self.inputs[1]: y}, train=False)
            loss += self.net.loss * n_valid
            acc = self._accuracy(outputs)
            if acc is not None:
                has_acc = True
                correct += acc * n_valid
            total += n_valid
            on_event({"kind": "test_batch", "batch": k + 1, "batches": batches})
        result = {"test_loss": loss / max(total, 1), "test_samples": int(total)}
        if has_acc:
            result["test_accuracy"] = correct / max(total, 1)
        return result

    # -- snapshots ------------------------------------------------------------------------
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


class _HeldInterrupt:
    """Holds Ctrl-C back while a training step runs, so that no step is left half done (some
    parameters updated, others not); the loop raises KeyboardInterrupt once the step is whole.
    Outside ``held()`` Ctrl-C acts at once, as before; ``always``: held everywhere, only noted
    (ranks, which must agree on where to stop). Only the main thread can take signals, and a
    handler someone else installed (or SIG_IGN) is left alone outside steps."""

    def __init__(self, always=False):
        self.pending = False
        self.holding = self.always = always
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if callable(previous):
                self.previous = previous
                signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame):
        if self.holding:
            self.pending = True
        else:
            self.previous(signum, frame)

    @contextlib.contextmanager
    def held(self):
        """Ctrl-C within only sets ``pending``."""
        self.holding = True
        try:
            yield
        finally:
            self.holding = self.always

    def restore(self):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None


def _check_writable(folder):
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise SNError(f"{folder}: not a folder")
    try:
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, ".sn-write-test")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise SNError(f"{folder}: cannot write there ({e.strerror})") from None


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
