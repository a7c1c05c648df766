"""CIFAR-10's python batches are pickles: the reader resolves only the exact NumPy globals such
a batch names, and refuses anything else before importing or calling it."""

import builtins
import pickle

import numpy as np
import pytest
from one_line import raises_one_line

from superneuron.data import sources as data
from superneuron.errors import SNError


def cifar_dir(tmp_path, batch_bytes):
    rng = np.random.default_rng(0)
    good = {b"data": rng.integers(0, 256, (2, 3072), dtype=np.uint8), b"labels": [1, 2]}
    (tmp_path / "data_batch_1").write_bytes(batch_bytes)
    (tmp_path / "test_batch").write_bytes(pickle.dumps(good))
    return str(tmp_path)


def crafted(module, name, arg):
    """A pickle that names ``module.name`` and calls it with the string ``arg``."""
    text = arg.encode()
    return (b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\n"
            + b"X" + len(text).to_bytes(4, "little") + text + b"\x85R.")  # BINUNICODE, TUPLE1, REDUCE


@pytest.mark.parametrize("module, name, arg", [
    ("numpy.f2py.__main__", "_reconstruct", "{m}"),  # importing it ran f2py
    ("numpy.testing", "ndarray", "{m}"),
    ("os", "system", "touch {m}"),
    ("builtins", "eval", "open({m!r}, 'w')"),
    ("numpy", "load", "{m}"),
    ("numpy._core.multiarray", "_vec_string", "{m}"),
])
def test_cifar_pickle_naming_anything_else_is_refused_before_importing_it(tmp_path, monkeypatch, module,
                                                                          name, arg):
    marker, imported, real_import = tmp_path / "ran", [], builtins.__import__

    def spy(mod, *args, **kw):
        if mod.startswith(("numpy.f2py", "numpy.testing")):
            imported.append(mod)
        return real_import(mod, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", spy)
    with raises_one_line(SNError) as e:
        data.open_source(cifar_dir(tmp_path, crafted(module, name, arg.format(m=str(marker)))))
    monkeypatch.undo()
    assert str(e.value) == (f"{tmp_path / 'data_batch_1'}: not a CIFAR-10 python batch (UnpicklingError: "
                            f"refusing to load {module}.{name} (a CIFAR-10 batch names only NumPy's array "
                            "globals))")
    assert imported == [] and not marker.exists()


def test_the_crafted_pickles_would_run_without_the_allow_list(tmp_path):
    """The control: plain pickle runs what the crafted file names."""
    marker = tmp_path / "ran"
    pickle.loads(crafted("builtins", "eval", f"open({str(marker)!r}, 'w').close()"))
    assert marker.exists()


@pytest.mark.parametrize("spelling", [b"numpy.core.multiarray", b"numpy._core.multiarray"])
def test_cifar_batches_of_old_and_new_numpy_still_load(tmp_path, spelling):
    rng = np.random.default_rng(1)
    batch = {b"data": rng.integers(0, 256, (3, 3072), dtype=np.uint8), b"labels": [4, 0, 9]}
    raw = pickle.dumps(batch, protocol=3)  # GLOBAL opcodes, as CIFAR-10's own protocol-2 files
    assert b"cnumpy._core.multiarray\n_reconstruct\n" in raw
    raw = raw.replace(b"cnumpy._core.multiarray\n", b"c" + spelling + b"\n")
    train, test = data.open_source(cifar_dir(tmp_path, raw))
    np.testing.assert_array_equal(train.x.reshape(3, -1), batch[b"data"])
    np.testing.assert_array_equal(train.labels, [4, 0, 9])
    assert len(test) == 2


_SCALAR = np.int64(0).__reduce__()[0]


class _ScalarOf:
    """Pickles as NumPy's scalar reconstruction called with ``args``, as a crafted file would."""

    def __init__(self, *args):
        self.args = args

    def __reduce__(self):
        return _SCALAR, self.args


@pytest.mark.parametrize("label_type", [np.int64, np.int32, np.uint8, np.int16])
def test_a_batch_whose_labels_are_numpy_integers_loads(tmp_path, label_type):
    """Today's NumPy pickles ``np.int64(4)`` as ``numpy._core.multiarray.scalar(dtype, bytes)``."""
    rng = np.random.default_rng(2)
    batch = {b"data": rng.integers(0, 256, (3, 3072), dtype=np.uint8),
             b"labels": [label_type(4), label_type(0), label_type(9)]}
    for protocol in (4, 5):  # today's default, and NumPy's out-of-band buffers
        train, _ = data.open_source(cifar_dir(tmp_path, pickle.dumps(batch, protocol=protocol)))
        np.testing.assert_array_equal(train.labels, [4, 0, 9])
    raw = pickle.dumps(batch, protocol=3)  # GLOBAL opcodes: the module's name as text, to respell
    assert b"cnumpy._core.multiarray\nscalar\n" in raw
    for spelling in (b"numpy.core.multiarray", b"numpy._core.multiarray"):  # NumPy 1 and 2 alike
        (tmp_path / "data_batch_1").write_bytes(raw.replace(b"cnumpy._core.multiarray\n", b"c" + spelling + b"\n"))
        train, _ = data.open_source(str(tmp_path))
        np.testing.assert_array_equal(train.labels, [4, 0, 9])


@pytest.mark.parametrize("args, what", [
    ((np.dtype(object), ["a list"]), "dtype object"),
    ((np.dtype("V8"), b"12345678"), "dtype |V8"),
    ((np.dtype("i4,i4"), b"12345678"), "dtype [('f0', '<i4'), ('f1', '<i4')]"),
    ((np.dtype("U2"), b"a\0\0\0b\0\0\0"), "dtype <U2"),
    ((np.dtype("int64"), b"1234"), "dtype int64"),  # too few bytes
    ((np.dtype("int64"), ["1234"]), "dtype int64"),
    (("int64", b"12345678"), "a str"),
])
def test_a_scalar_other_than_a_plain_number_is_refused(tmp_path, args, what):
    raw = pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [_ScalarOf(*args)]})
    with raises_one_line(SNError) as e:
        data.open_source(cifar_dir(tmp_path, raw))
    assert str(e.value) == (f"{tmp_path / 'data_batch_1'}: not a CIFAR-10 python batch (UnpicklingError: "
                            f"refusing to load a NumPy scalar of {what} (a CIFAR-10 batch holds plain "
                            f"numeric ones only))")


def test_the_refused_scalars_would_load_without_the_guard():
    """The control: plain pickle builds the structured and text scalars refused above."""
    pair = pickle.loads(pickle.dumps(_ScalarOf(np.dtype("i4,i4"), b"12345678")))
    assert pair.dtype.names == ("f0", "f1")
    assert pickle.loads(pickle.dumps(_ScalarOf(np.dtype("U2"), b"a\0\0\0b\0\0\0"))) == "ab"
