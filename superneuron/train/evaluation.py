"""The Trainer's test passes and display averages: loss and accuracy over the test set, and between displays."""

import numpy as np


class Evaluation:
    """The testing part of :class:`superneuron.train.trainer.Trainer`: it reads the trainer's
    ``net``, ``solver``, ``test_loader`` and ``inputs``."""

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


class Window:
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
