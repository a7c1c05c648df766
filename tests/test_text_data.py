"""The text source (superneuron/data/text.py): windows of bytes with next-byte targets, a held-out
tail, folders read in sorted order, the standard library by default, and errors in one line."""

import numpy as np
import pytest

from superneuron.data import sources as data
from superneuron.data.batches import Loader
from superneuron.data.text import read_tokens, unigram_entropy
from superneuron.errors import SNError


def test_windows_targets_and_held_out_tail(tmp_path):
    text = bytes(range(256)) * 2  # 512 bytes, every byte value
    (tmp_path / "a.txt").write_bytes(text)
    cfg = {"source": f"text:{tmp_path / 'a.txt'}", "size": 10, "batch_size": 4, "test_fraction": 0.25}
    assert data.describe(cfg) == ((10,), 256)
    train, test = data.open_source(cfg)
    assert len(train) == (384 - 1) // 10 and len(test) == (128 - 1) // 10
    x = train.batch([0, 3])
    assert x.dtype == np.float32 and x.shape == (2, 10)
    np.testing.assert_array_equal(x[1], np.frombuffer(text[30:40], np.uint8))
    np.testing.assert_array_equal(train.labels[[0, 3]], [list(text[1:11]), list(text[31:41])])
    np.testing.assert_array_equal(test.batch([0])[0], np.frombuffer(text[384:394], np.uint8))
    loader = Loader(train, 4, seed=0)
    xb, yb = loader.next()
    assert xb.shape == yb.shape == (4, 10)
    np.testing.assert_array_equal(yb[:, :-1], xb[:, 1:])  # each target is the next input byte


def test_a_folder_is_read_in_sorted_order_and_skips_what_is_not_text(tmp_path):
    (tmp_path / "b.py").write_bytes(b"BBBB")
    (tmp_path / "a.md").write_bytes(b"AAAA")
    (tmp_path / "c.bin").write_bytes(b"CCCC")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "d.py").write_bytes(b"DDDD")
    assert read_tokens(f"text:{tmp_path}").tobytes() == b"AAAABBBB"


def test_the_default_is_the_standard_librarys_source():
    tokens = read_tokens("text")
    assert 1 << 20 < len(tokens) <= 8 << 20
    assert b"def " in tokens[:1 << 16].tobytes()
    assert 2.0 < unigram_entropy(tokens) < np.log(256)


@pytest.mark.parametrize("source, size, message", [
    ("text:/no/such/path", 8, "no such file or directory"),
    ("text:EMPTY", 8, "has no text files"),
    ("text", 1, "size .* >= 2"),
])
def test_bad_text_sources_say_why(tmp_path, source, size, message):
    source = source.replace("EMPTY", str(tmp_path))
    with pytest.raises(SNError, match=message):
        data.describe({"source": source, "size": size})


def test_a_text_too_short_for_one_window_says_so(tmp_path):
    (tmp_path / "t.txt").write_bytes(b"abc")
    with pytest.raises(SNError, match="make no window of 8 tokens"):
        data.open_source({"source": f"text:{tmp_path / 't.txt'}", "size": 8})
