"""Text as a data source (``--data text:PATH``): byte-level tokens in windows with next-token targets.

The source is a file, or a folder whose text files (``.py``, ``.txt``, ``.md``, ``.rst``,
``.c``, ``.h``, ``.yaml``, read in sorted path order) are joined into one stream of bytes:
256 token ids, no tokenizer to train or download. Sample i is the window of ``size`` bytes
starting at ``i * size``; its label is the same window shifted by one byte, so each position
is scored on the byte that follows it. The last ``test_fraction`` of the stream is the test
set (a held-out tail, never shuffled into training).

``text`` alone names the Python standard library's own source (the folder of the ``os``
module, without site-packages and the test suites), which every machine with Python has;
it is capped at :data:`DEFAULT_BYTES` so that it loads in a blink.
"""

import os

import numpy as np

from ..errors import SNError
from .dataset import Dataset

VOCAB = 256
TEXT_EXTS = (".py", ".txt", ".md", ".rst", ".c", ".h", ".yaml", ".yml", ".json", ".html", ".css")
SKIP_DIRS = ("site-packages", "dist-packages", "__pycache__", "test", "tests", "idlelib", ".git")
DEFAULT_BYTES = 8 << 20  # of the standard library's source: some 8 MB of its 11


def is_text_source(src):
    """Whether ``src`` names a text source: ``text`` or ``text:PATH``."""
    return src == "text" or src.startswith("text:")


def _default_root():
    return os.path.dirname(os.__file__)


def text_files(src):
    """``(name, paths, cap)``: the files of a text source in reading order, and a byte cap (None: all)."""
    path = src[len("text:"):] if src.startswith("text:") else ""
    if not path:
        root, cap = _default_root(), DEFAULT_BYTES
    else:
        root, cap = os.path.expanduser(path), None
    if os.path.isfile(root):
        return src, [root], cap
    if not os.path.isdir(root):
        raise SNError(f"{src}: no such file or directory (a text source is 'text' or text:FILE_OR_FOLDER)")
    paths = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        paths += [os.path.join(folder, f) for f in sorted(files) if f.lower().endswith(TEXT_EXTS)]
    if not paths:
        raise SNError(f"{src}: the folder has no text files ({', '.join(TEXT_EXTS)})")
    return src, paths, cap


def read_tokens(src):
    """The byte stream of a text source as uint8 token ids."""
    _, paths, cap = text_files(src)
    parts, total = [], 0
    for p in paths:
        try:
            with open(p, "rb") as f:
                data = f.read() if cap is None else f.read(cap - total)
        except OSError as e:
            raise SNError(f"{p}: cannot read ({e.strerror})") from None
        parts.append(data)
        total += len(data)
        if cap is not None and total >= cap:
            break
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


class TextWindows(Dataset):
    """Windows of ``size`` tokens of one stream; labels are the windows shifted by one token
    (a strided view of the stream: no copy)."""

    def __init__(self, name, tokens, size, cfg):
        n = (len(tokens) - 1) // size
        if n < 1:
            raise SNError(f"{name}: {len(tokens)} bytes make no window of {size} tokens and its targets")
        step = tokens.strides[0]
        windows = np.lib.stride_tricks.as_strided(tokens, (n, size), (size * step, step), writeable=False)
        labels = np.lib.stride_tricks.as_strided(tokens[1:], (n, size), (size * step, step), writeable=False)
        super().__init__(name, labels, VOCAB, (size,), dict(cfg, crop=0, mirror=False, mean=(), std=()), 1.0)
        self.windows = windows

    def _pixels(self, idx, rng, train):
        return self.windows[idx]


def describe_text(cfg):
    """``((size,), 256)``: a window's shape and the token ids."""
    if cfg["size"] < 2:
        raise SNError(f"{cfg['source']}: a text source needs size (tokens per window) >= 2, got {cfg['size']}")
    text_files(cfg["source"])  # the path exists and holds text
    return (cfg["size"],), VOCAB


def open_text(cfg):
    """``(train, test)`` windows of a text source: the test set is the stream's last ``test_fraction``."""
    src, size = cfg["source"], cfg["size"]
    describe_text(cfg)
    tokens = read_tokens(src)
    cut = int(len(tokens) * (1.0 - cfg["test_fraction"]))
    return (TextWindows(f"{src} (train)", tokens[:cut], size, cfg),
            TextWindows(f"{src} (test)", tokens[cut:], size, cfg))


def unigram_entropy(tokens):
    """The entropy of the bytes' frequencies, in nats: the loss of the best model that ignores context."""
    counts = np.bincount(tokens, minlength=VOCAB).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
