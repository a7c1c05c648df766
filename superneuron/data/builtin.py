"""The built-in sources: scikit-learn's 8x8 digits and a seeded synthetic task of any shape."""

import functools

import numpy as np

from ..errors import SNError


@functools.lru_cache(maxsize=4)
def digits_arrays(size):
    """``(x, y)``: scikit-learn's digits as (N, 1, size, size) floats in [0, 1] and their labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise SNError("the 'digits' source needs scikit-learn (pip install scikit-learn)") from None
    from PIL import Image
    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)
    if size and size != 8:
        # Bilinear keeps strokes smooth, which a LeNet learns faster than nearest's blocks.
        x = np.stack([np.asarray(Image.fromarray(im).resize((size, size), Image.BILINEAR)) for im in x])
    x = np.clip(x, 0.0, 1.0)[:, None]
    y = d.target.astype(np.int64)
    x.flags.writeable = y.flags.writeable = False  # shared by every call through the cache
    return x, y


def synthetic_arrays(cfg):
    """Each class is a smooth random pattern (4×4 cells per channel, upsampled) plus pixel noise
    of the same strength: learnable by a linear model or a convolutional net."""
    rng = np.random.default_rng(cfg["seed"])
    c, s, k, n = cfg["channels"] or 3, cfg["size"] or 32, cfg["classes"], cfg["samples"]
    g = min(4, s)
    cells = np.arange(s) * g // s
    coarse = rng.standard_normal((k, c, g, g)).astype(np.float32)
    patterns = coarse[:, :, cells[:, None], cells[None, :]]
    y = rng.integers(0, k, n)
    x = rng.standard_normal((n, c, s, s), dtype=np.float32)
    x += patterns[y]
    x *= 0.25
    x += 0.5
    return x, y.astype(np.int64)
