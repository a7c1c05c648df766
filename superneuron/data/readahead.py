"""Read-ahead: a training :class:`~superneuron.data.batches.Loader` whose next batch is decoded on a
worker thread while the current one trains, so the device never waits on decoding (Caffe's
prefetching data layers). Batches, their order and :meth:`state` are exactly the wrapped
loader's: the batch made ahead is the one ``next()`` would make, and ``state()`` is where
training stands, not where the worker is."""

import concurrent.futures


class ReadAhead:
    """Wraps a Loader; ``next``/``state``/``check_state``/``restore`` as the Loader's, the rest
    (``epoch`` for tests, ``dataset``, ``batch``) passed through."""

    def __init__(self, loader):
        self.loader = loader
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="readahead")
        self._ahead = None     # the future of the next batch
        self._state = None     # the loader's state before the batch made ahead

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def __len__(self):
        return len(self.loader)

    def next(self):
        if self._ahead is None:
            batch = self.loader.next()
        else:
            # kept pending until it is done: a Ctrl-C while waiting leaves restore() to settle it
            batch = self._ahead.result()  # its error, if any, is raised here, as next() would
            self._ahead = None
        self._state = self.loader.state()
        self._ahead = self._pool.submit(self.loader.next)
        return batch

    def _settle(self):
        """Wait for the batch made ahead and put the loader back before it."""
        if self._ahead is not None:
            concurrent.futures.wait([self._ahead])
            self._ahead = None
            self.loader.restore(self._state)

    def state(self):
        return self._state if self._ahead is not None else self.loader.state()

    def check_state(self, state):
        self.loader.check_state(state)

    def restore(self, state):
        self._settle()
        self.loader.restore(state)

    def close(self):
        self._settle()
        self._pool.shutdown(wait=True)
