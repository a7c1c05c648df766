"""Ctrl-C held back while a training step runs, so that no step is left half done."""

import contextlib
import signal
import threading


class HeldInterrupt:
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
