"""What sn-train prints while it runs, so that no run is silent for long: the plan of the run
at the start (iterations, batch, device, tests, an estimated time), then progress (a bar on a
terminal; otherwise a line at least every ``PERIOD`` seconds, the test passes included) and
the time measured on the first iterations. And for work with no iterations (sn-plan's solver,
sn-depth's search): :class:`Working`, which also stops the tool at once on Ctrl-C."""

import os
import select
import signal
import sys
import threading
import time

from ..report import human_bytes, human_seconds

PERIOD = 10.0        # seconds: the longest a run stays silent when not on a terminal
MEASURE_AFTER = 3    # timed iterations before the measured time per iteration is printed


def count_tests(start, max_iter, test_interval, has_test):
    """Test passes between iteration ``start`` and ``max_iter``: every ``test_interval`` and
    one at the end, as Trainer.run does."""
    if not has_test or start >= max_iter:
        return 0
    every = set(range(test_interval, max_iter + 1, test_interval)) if test_interval else set()
    return len({i for i in every if i > start} | {max_iter})


def _count(n, one, many):
    return f"{n} {one if n == 1 else many}"


def plan_lines(trainer, net, solver):
    """The plan of the run: what it will do, and its time estimated by the net's cost model
    (measured kernel times under ``--profile`` or a cached table, else flops and bytes at the
    device's assumed rates; which one is said)."""
    start, batch, k = trainer.iteration, trainer.train_loader.batch, net.iter_size
    iterations = max(solver.max_iter - start, 0)
    samples = len(trainer.train_loader.dataset)
    tests = count_tests(start, solver.max_iter, solver.test_interval, trainer.test_loader is not None)
    batches = trainer.test_batches()
    where = "the CPU" if net.backend.name == "cpu" else "the GPU"
    testing = (f"test every {solver.test_interval} iterations and at the end" if solver.test_interval
               else "test at the end")
    of = f"batch {batch}" if k == 1 else f"{k} batches of {batch} (iter_size {k})"
    lines = [f"plan: {iterations} iterations of {of} ({iterations * batch * k / max(samples, 1):.1f} "
             f"epochs of {samples} samples) on {where}"
             + (f", from iteration {start}" if start else "")
             + (f"; display every {solver.display}" if solver.display else "")
             + (f"; {testing}: {_count(tests, 'pass', 'passes')} of {_count(batches, 'batch', 'batches')}"
                if tests else "; no test")]
    model = net.costs
    per_iter = model.timeline(net.schedules["train"]).seconds
    per_test = model.timeline(net.schedules["test"]).seconds * batches
    source = ("kernel times measured on this device" if net.costs_measured
              else f"the cost model's assumed rates for the {net.backend.name.upper()}, not measured")
    lines.append(f"estimated time: {human_seconds(iterations * per_iter + tests * per_test)} "
                 f"({human_seconds(per_iter)} per iteration, {human_seconds(per_test)} per test pass; "
                 f"from {source}); the time measured on the first iterations follows")
    return lines


class Progress:
    """Prints the trainer's events: a tqdm bar on a terminal, plain lines otherwise. Off a
    terminal a progress line comes whenever nothing was printed for ``period`` seconds of
    ``clock``, in training and in test passes alike; :meth:`start_heartbeat` adds a thread that
    says so too while one iteration or test batch takes longer than that."""

    def __init__(self, total, start=0, out=None, clock=time.monotonic, period=PERIOD, tty=None):
        self.out = out or sys.stdout
        self.total, self.start, self.interrupted = total, start, False
        self.clock, self.period = clock, period
        self.began = self.last_line = clock()
        self.timed, self.timed_seconds, self.measured = 0, 0.0, False
        self.iteration, self.loss = start, None
        self.doing = "iteration"   # or "test": what the heartbeat says is running
        self.last_event = self.began
        self.lock = threading.Lock()   # the heartbeat thread writes too
        self.stopped = threading.Event()
        self.bar = None
        if self.out.isatty() if tty is None else tty:
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=start, unit="it", dynamic_ncols=True, leave=False,
                            file=self.out)

    def write(self, line):
        with self.lock:
            if self.bar:
                self.bar.write(line, file=self.out)
            else:
                print(line, file=self.out)
            self.out.flush()
            self.last_line = self.clock()

    def start_heartbeat(self):
        """Off a terminal, a daemon thread that prints a line whenever nothing was printed for
        ``period`` seconds (one iteration of a large net on a CPU takes longer than that)."""
        if not self.bar:
            threading.Thread(target=self._beat, name="sn-progress", daemon=True).start()

    def _beat(self):
        while not self.stopped.wait(self.period / 4):
            if self._quiet_too_long():
                what = (f"iteration {self.iteration + 1}/{self.total}" if self.doing == "iteration"
                        else f"the test pass at iteration {self.iteration}")
                self.write(f"progress: {what} running, {human_seconds(self.clock() - self.last_event)} "
                           f"so far ({human_seconds(self.clock() - self.began)} elapsed)")

    def __call__(self, event):
        kind = event["kind"]
        self.last_event = self.clock()
        self.doing = "test" if kind == "test_batch" else "iteration"
        if kind == "iter":
            self._iteration(event)
        elif kind == "display":
            acc = f" | acc {event['accuracy']:.3f}" if "accuracy" in event else ""
            speed = f" | {event['img_per_s']:.0f} img/s" if event.get("img_per_s") else ""
            self.write(f"iter {event['iter']}/{self.total} | loss {event['loss']:.4f}{acc} | "
                       f"lr {event['lr']:.2e}{speed} | peak {human_bytes(event['peak_bytes'])}")
        elif kind == "test_batch":
            if self.bar:
                self.bar.set_postfix_str(f"testing {event['batch']}/{event['batches']}")
            elif self._quiet_too_long():
                self.write(f"testing at iter {self.iteration}: batch {event['batch']}/{event['batches']}")
        elif kind == "test":
            acc = f", accuracy {100 * event['test_accuracy']:.2f} %" if "test_accuracy" in event else ""
            self.write(f"test @ iter {event['iter']}: loss {event['test_loss']:.4f}{acc} "
                       f"({event['test_samples']} images)")
        elif kind == "snapshot":
            self.write(f"snapshot: {event['path']}")
        elif kind == "note":
            self.write(event["text"])
        elif kind == "interrupted":
            self.interrupted = True
            saved = f"; snapshot {event['path']}" if event["path"] else ""
            self.write(f"interrupted at iteration {event['iter']}{saved}")

    def _quiet_too_long(self):
        return self.clock() - self.last_line >= self.period

    def _iteration(self, event):
        self.iteration, self.loss = event["iter"], event["loss"]
        if self.bar:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{event['loss']:.4f}")
        if not event.get("warmup"):
            self.timed += 1
            self.timed_seconds += event["seconds"]
        left = self.total - self.iteration
        if not self.measured and self.timed and (self.timed >= MEASURE_AFTER or self._quiet_too_long()):
            self.measured = True
            per = self.timed_seconds / self.timed
            self.write(f"measured: {human_seconds(per)} per iteration over {self.timed} iteration"
                       f"{'s' if self.timed > 1 else ''} (the first left out), so about "
                       f"{human_seconds(per * left)} for the {left} left, tests not counted")
        elif not self.bar and self._quiet_too_long():
            done = self.iteration - self.start
            wall = self.clock() - self.began
            eta = f", about {human_seconds(wall / done * left)} left" if done and left else ""
            rate = (f" | {event['images'] * self.timed / self.timed_seconds:.0f} img/s"
                    if self.timed_seconds else "")
            self.write(f"progress: iter {self.iteration}/{self.total} ({100 * self.iteration // max(self.total, 1)} %)"
                       f" | loss {self.loss:.4f}{rate} | {human_seconds(wall)} elapsed{eta}")

    def close(self):
        self.stopped.set()
        if self.bar:
            self.bar.close()


INTERRUPTED = 130   # the exit status of a tool Ctrl-C stopped, as a shell reports it
BAR_DELAY = 1.0     # seconds before a bar shows on a terminal: quick work stays quiet


class Working:
    """Long work that reports no iterations (``with Working("planning (optimal)") as w:``):
    on a terminal a tqdm counter of the seconds elapsed (or, after :meth:`step`, of the steps
    done), shown after BAR_DELAY; otherwise a line whenever nothing was printed for ``period``
    seconds. ``limit``: a text saying when it will stop (the solver's time limit), shown beside.

    Ctrl-C stops the tool at once, with one line on ``out`` and exit status 130, even inside a
    solver written in C (HiGHS, which releases the GIL but returns only at its time limit): the
    signal is caught by Python's C-level handler, which writes it to a pipe (signal.set_wakeup_fd)
    that this class's thread waits on; the main thread's KeyboardInterrupt is not raised, so
    that the line is said once. Outside the main thread, or where SIGINT is ignored (nohup, a
    background job of a script), it only reports progress."""

    def __init__(self, what, limit=None, out=None, period=PERIOD, tty=None, clock=time.monotonic):
        self.what, self.limit, self.out, self.period, self.clock = what, limit, out or sys.stderr, period, clock
        self.tty = self.out.isatty() if tty is None else tty
        self.stream = self.out  # a copy of its descriptor once entered: see __enter__
        self.began = self.last_line = clock()
        self.steps, self.note = 0, None
        self.bar, self.thread, self.pipe, self.saved = None, None, None, None
        self.lock = threading.Lock()
        self.done = threading.Event()

    def __enter__(self):
        try:  # the solver sends descriptors 1 and 2 to /dev/null while it runs (optimal_model.
            # silenced_output): progress and the Ctrl-C line go to a copy made before
            self.out.flush()
            self.stream = os.fdopen(os.dup(self.out.fileno()), "w", buffering=1)
        except (AttributeError, OSError, ValueError):  # not a file (a test's StringIO)
            self.stream = self.out
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN):  # ignored: left so
            read, write = os.pipe()
            os.set_blocking(write, False)
            self.pipe = (read, write)
            self.saved = (signal.set_wakeup_fd(write, warn_on_full_buffer=False),
                          signal.signal(signal.SIGINT, lambda signum, frame: None))
        self.thread = threading.Thread(target=self._watch, name="sn-working", daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        if self.saved is not None:
            signal.set_wakeup_fd(self.saved[0])
            signal.signal(signal.SIGINT, self.saved[1])
        if self.pipe is not None:
            os.close(self.pipe[1])  # the watcher reads the end of the pipe, and ends
        self.thread.join(timeout=5)
        if self.pipe is not None:
            os.close(self.pipe[0])
        with self.lock:
            if self.bar is not None:
                self.bar.close()
                self.bar = None
            if self.stream is not self.out:
                self.stream.close()
                self.stream = self.out
        return False

    def step(self, note=None):
        """One more step done (sn-depth: one more plan), ``note`` saying which."""
        with self.lock:
            self.steps += 1
            self.note = note

    def write(self, line):
        """Print ``line`` (above the bar on a terminal)."""
        with self.lock:
            if self.bar is not None:
                self.bar.write(line, file=self.stream)
            else:
                print(line, file=self.stream)
            self.stream.flush()
            self.last_line = self.clock()

    def _status(self):
        done = f"{self.steps} done, the last {self.note}; " if self.steps else ""
        limit = f" ({self.limit})" if self.limit else ""
        return f"{self.what}: {done}{human_seconds(self.clock() - self.began)} elapsed{limit}"

    def _watch(self):
        read = self.pipe[0] if self.pipe else None
        while not self.done.is_set():
            if read is None:
                self.done.wait(0.25)
            elif select.select([read], [], [], 0.25)[0]:
                data = os.read(read, 64)
                if not data:
                    return  # the work ended
                if signal.SIGINT in data:
                    self._interrupted()
            if not self.done.is_set():
                self._report()

    def _report(self):
        with self.lock:
            now = self.clock()
            if self.tty:
                if self.bar is None and now - self.began >= BAR_DELAY:
                    from tqdm import tqdm
                    self.bar = tqdm(desc=self.what, unit="plan" if self.steps else "s", leave=False,
                                    file=self.stream, dynamic_ncols=True,
                                    bar_format="{desc}: {n_fmt} {unit} | {elapsed}{postfix}")
                if self.bar is not None:
                    self.bar.n = self.steps if self.steps else int(now - self.began)
                    self.bar.set_postfix_str(self.note or self.limit or "", refresh=False)
                    self.bar.refresh()
            elif now - self.last_line >= self.period:
                print(f"progress: {self._status()}", file=self.stream)
                self.stream.flush()
                self.last_line = now

    def _interrupted(self):
        with self.lock:
            if self.bar is not None:
                self.bar.close()
                self.bar = None
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        self.stream.write(f"interrupted: {self._status()}\n")
        self.stream.flush()
        os._exit(INTERRUPTED)
