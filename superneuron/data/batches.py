"""Loader: a dataset cut into batches, shuffled per epoch for training, padded in order for testing, resumable."""

import numpy as np

from ..errors import SNError
from .dataset import ShardDraws


class Loader:
    """Batches of a dataset. ``next()`` for training: a seeded shuffle per epoch, wrapping across
    epochs (a batch that runs past the end is completed from the next epoch's order); ``epoch()``
    for testing: every sample once, in order, the last batch padded.

    The shuffle of epoch ``e`` and the augmentation of the batch starting at ``(e, position)`` come
    from seeds made of ``(seed, e, position)``, so ``state()`` needs only those numbers.

    ``shard``: ``(rank, ranks)`` of data-parallel training: ``batch`` is then the global batch,
    and :meth:`next` gives rank ``rank``'s ``batch // ranks`` samples of it, so that the ranks
    together see the samples one rank would at the global batch, with the same random crops
    and flips (dataset.ShardDraws)."""

    def __init__(self, dataset, batch, shuffle=True, seed=0, train=True, shard=(0, 1)):
        if batch < 1:
            raise SNError(f"{dataset.name}: batch size must be >= 1, got {batch}")
        if seed < 0:
            raise SNError(f"{dataset.name}: seed must be >= 0, got {seed}")
        self.dataset, self.batch, self.shuffle, self.seed, self.train = dataset, batch, shuffle, seed, train
        self.epoch_index, self.position = 0, 0
        self._order_of = None, None  # (epoch, its order)
        self.shard = shard

    def _order(self):
        if self._order_of[0] != self.epoch_index:
            n = len(self.dataset)
            order = (np.random.default_rng([0, self.seed, self.epoch_index]).permutation(n)
                     if self.shuffle else np.arange(n))
            self._order_of = self.epoch_index, order
        return self._order_of[1]

    def next(self):
        """The next training batch: ``(x float32 (B, C, H, W), y float32 (B,))``."""
        n = len(self.dataset)
        if n == 0:
            raise SNError(f"{self.dataset.name}: no samples to train on")
        rng = np.random.default_rng([1, self.seed, self.epoch_index, self.position])
        parts, need = [], self.batch
        while need:
            take = self._order()[self.position:self.position + need]
            parts.append(take)
            need -= len(take)
            self.position += len(take)
            if self.position == n:
                self.epoch_index, self.position = self.epoch_index + 1, 0
        idx = np.concatenate(parts)
        rank, ranks = self.shard
        if ranks > 1:
            per_rank = self.batch // ranks
            idx = idx[rank * per_rank:(rank + 1) * per_rank]
            rng = ShardDraws(rng, rank, ranks)
        return self.dataset.batch(idx, rng, self.train), self.dataset.batch_labels(idx)

    def __len__(self):
        """Batches in one pass of :meth:`epoch`."""
        return -(-len(self.dataset) // self.batch)

    def epoch(self):
        """Yield ``(x, y, n_valid)`` over the dataset once, in order, with no random augmentation;
        the last batch is padded with copies of the last sample labelled -1 (ignored by losses)."""
        n = len(self.dataset)
        for start in range(0, n, self.batch):
            valid = min(self.batch, n - start)
            idx = np.minimum(np.arange(start, start + self.batch), n - 1)
            y = self.dataset.batch_labels(idx, valid)
            yield self.dataset.batch(idx, None, train=False), y, valid

    def state(self):
        """Where training stands, as plain ints: enough for :meth:`restore` to continue exactly."""
        return {"epoch": int(self.epoch_index), "position": int(self.position), "seed": int(self.seed),
                "samples": len(self.dataset)}

    def check_state(self, state):
        """SNError unless ``state`` (as read from a snapshot) is a :meth:`state` of this dataset."""
        if not isinstance(state, dict):
            raise SNError("data position is not a mapping of epoch, position, seed and samples")
        for key in ("epoch", "position", "seed", "samples"):
            value = state.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SNError(f"data position: '{key}' must be a count >= 0, got {value!r:.40}")
        if state["samples"] != len(self.dataset):
            raise SNError(f"{self.dataset.name}: has {len(self.dataset)} samples, but the snapshot "
                          f"was taken with {state['samples']}")
        if state["position"] >= max(len(self.dataset), 1):
            raise SNError(f"data position {state['position']} is past the {len(self.dataset)} samples")

    def restore(self, state):
        """Continue from a :meth:`state`: the following batches are those the saved run would see."""
        self.check_state(state)
        self.epoch_index, self.position, self.seed = state["epoch"], state["position"], state["seed"]
