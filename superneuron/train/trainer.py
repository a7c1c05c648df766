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

The loop is here; its test passes and display averages are in evaluation.py, its snapshots and
resuming in checkpoints.py, and the holding of Ctrl-C in interrupt.py.
"""

import collections
import json
import os
import time
import uuid
import weakref

import numpy as np

from ..errors import SNError, where
from ..files import LineFile, check_output_path
from . import snapshot as snap
from .checkpoints import Snapshots
from .evaluation import Evaluation, Window
from .interrupt import HeldInterrupt


class Trainer(Evaluation, Snapshots):
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
        non-finite. ``note`` (with its ``text``): the net's ``graph_line`` has changed (its CUDA
        graph was captured, or given up)."""
        # NumPy's overflow warnings would bury the one-line error a non-finite loss gets
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return self._run(on_event)

    def _run(self, on_event):
        s = self.solver
        log = LineFile(self.log_path) if self.log_path else None
        last_test = None
        window = Window()
        recent = collections.deque(maxlen=s.average_loss)  # Caffe's average_loss: display smoothing
        ctrl_c = HeldInterrupt(always=self.group is not None)  # ranks stop where they agree
        warm = False  # the first step of a run plans, allocates and warms up: left out of speeds
        graph_line = self.net.graph_line
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
                if self.net.graph_line != graph_line:  # captured, or given up (net.py's cuda_graph)
                    graph_line = self.net.graph_line
                    on_event({"kind": "note", "text": graph_line})
                warm = True
                if s.display and (self.iteration % s.display == 0 or self.iteration == s.max_iter):
                    record = dict(window.summary(), iter=self.iteration, lr=self.net.optimizer.lr(it),
                                  peak_bytes=self.net.peak_bytes)
                    if s.average_loss > 1:  # the mean of the last average_loss iterations, as Caffe shows
                        record["loss"] = float(np.mean(recent))
                    window = Window()
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
