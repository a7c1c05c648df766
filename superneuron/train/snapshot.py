"""Snapshots: the whole state of training in one ``.npz``, written atomically, checked whole
before use.

A snapshot holds every parameter and state buffer of the net (``param:NAME``), the optimiser's
state (``opt:NAME``) and ``__meta__``, a JSON text: the format, the net's name and a fingerprint
of its parameters (names, shapes, dtypes), the solver type, the iteration, the training loader's
position, a manifest of every array (name, shape, dtype) and a SHA-256 over the rest of the meta
and the arrays' bytes. A file is first written to ``NAME.tmp``, flushed to the disk and then
renamed, so a crash or a full disk leaves the previous snapshot as it was; a half-written
``.tmp`` is removed, and ignored when a killed run left one.

Reading checks, before anything is used: every array the net and optimiser need is there with
its shape and dtype and nothing else is, each ``.npy`` header before its bytes are read (a
crafted header cannot make us allocate), the checksum, and the meta's fields. A zip directory
damaged so that members go missing, a truncated member or a flipped byte is an error, never a
silent partial resume.

A run that writes snapshots holds a lock on its folder (``fcntl.flock`` on the folder) for its
life; the system drops it when the process ends, a crash or a kill -9 too. A second run on the
same folder is refused instead of writing beside the first (and removing its ``.tmp``). Once a
new snapshot is whole, older ones of the same net beyond the newest ``keep`` are removed.
"""

import fcntl
import glob
import hashlib
import json
import math
import os
import re
import zipfile

import numpy as np

from ..errors import SNError

FORMAT = 2
DEFAULT_KEEP = 5  # snapshots kept per net and folder (0: all, as Caffe, which fills disks)
MAX_META_BYTES = 64 << 20  # the meta lists every array: ~100 bytes each, ~3 MiB for 10 000 layers
_NAME = re.compile(r"_iter_(\d+)\.npz$")


class BadSnapshot(SNError):
    """A snapshot that cannot be used (damaged, incomplete, or of another net or solver)."""


def expected_arrays(net):
    """``{key: (shape, dtype)}`` of every array a snapshot of ``net`` holds: its parameters and
    state buffers, and the optimiser's state (the resident tensors the graph does not name but
    the gradients' accumulators of iter_size, which are empty between iterations)."""
    resident, tensors = net.runtime.resident, net.runtime.tensors
    out = {f"param:{n}": resident[n] for n in net.kept_names}
    out.update({f"opt:{n}": a for n, a in resident.items()
                if net.graph.tensors.get(n) is None and tensors[n].kind != "accum"})
    return {k: (tuple(a.shape), np.dtype(a.dtype).str) for k, a in out.items()}


def fingerprint(net):
    """A short hash of the net's parameter names, shapes and dtypes: two nets with the same
    fingerprint can exchange snapshots."""
    t = net.graph.tensors
    sig = [[n, list(t[n].shape), np.dtype(t[n].dtype).str] for n in net.kept_names]
    return hashlib.sha256(json.dumps(sig).encode()).hexdigest()[:16]


def _digest(meta, arrays):
    """SHA-256 of ``meta`` (without its checksum) and the arrays in manifest order."""
    h = hashlib.sha256(json.dumps({k: v for k, v in meta.items() if k != "checksum"},
                                  sort_keys=True).encode())
    for key, _, _ in meta["arrays"]:
        h.update(np.ascontiguousarray(arrays[key]).reshape(-1).view(np.uint8))
    return h.hexdigest()


def write(path, meta, arrays):
    """Write ``arrays`` and ``meta`` (a JSON-able dict) to ``path`` through ``path.tmp``: flushed,
    fsync'ed, then renamed over ``path``; the folder is fsync'ed so the rename is durable too.
    On any failure the ``.tmp`` is removed and ``path`` is left as it was; a failure to write
    (a full disk) is an SNError."""
    meta = dict(meta, format=FORMAT,
                arrays=[[k, list(a.shape), np.dtype(a.dtype).str] for k, a in sorted(arrays.items())])
    meta["checksum"] = _digest(meta, arrays)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            # the meta last: a file cut short, or a zip directory that lost its first
            # entries, still fails on the arrays it lacks, the manifest saying which
            np.savez(f, **arrays, __meta__=np.array(json.dumps(meta)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_folder(os.path.dirname(os.path.abspath(path)))
    except BaseException as e:  # a Ctrl-C mid-write too: never leave a half file behind
        try:
            os.remove(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise SNError(f"{path}: cannot write snapshot ({e.strerror or e}); its partial .tmp file "
                          f"was removed, earlier snapshots are as they were") from None
        raise
    return path


def _fsync_folder(folder):
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some systems cannot open a folder; the rename is done all the same
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_tmp(folder, net_name):
    """Remove ``.tmp`` files a killed run of ``net_name`` left in ``folder``."""
    for tmp in glob.glob(os.path.join(glob.escape(folder), f"{glob.escape(net_name)}_iter_*.npz.tmp")):
        try:
            os.remove(tmp)
        except OSError:
            pass


# ---------------------------------------------------------------- reading


def _member(z, name, limit):
    """``(dtype, shape, fortran, bytes)`` of member ``name`` of zip ``z``, its header checked
    before reading at most ``limit`` bytes of data."""
    with z.open(name) as f:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"npy version {version}")
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
        if dtype.hasobject:
            raise ValueError("an object array")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > limit:
            raise ValueError(f"'{name}' holds {nbytes} bytes, more than the {limit} expected")
        data = f.read(nbytes + 1)
    if len(data) != nbytes:
        raise ValueError(f"'{name}' is truncated")
    return dtype, shape, fortran, data


def _array(dtype, shape, fortran, data):
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")


def read(path, expected, identity):
    """``(meta, arrays)`` of the snapshot at ``path``, checked whole: made for the net and solver
    of ``identity`` (``{"net": name, "fingerprint": ..., "solver": type}``), every array of
    ``expected`` (``{key: (shape, dtype)}``, see :func:`expected_arrays`) present with its shape
    and dtype and nothing else, the iteration a count, and the checksum right. BadSnapshot (one
    line) otherwise."""
    if not os.path.isfile(path):
        raise BadSnapshot(f"{path}: " + ("not a snapshot file" if os.path.exists(path) else "no such snapshot"))
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
            if "__meta__.npy" not in names:
                raise BadSnapshot(f"{path}: not a superneuron snapshot (no __meta__)")
            dtype, shape, fortran, data = _member(z, "__meta__.npy", MAX_META_BYTES)
            if dtype.kind != "U" or shape != ():
                raise BadSnapshot(f"{path}: not a superneuron snapshot (__meta__ is not a text)")
            meta = json.loads(str(_array(dtype, shape, fortran, data)[()]))
            if not isinstance(meta, dict):
                raise BadSnapshot(f"{path}: not a superneuron snapshot (__meta__ is not a mapping)")
            if meta.get("format") != FORMAT:
                raise BadSnapshot(f"{path}: snapshot format {meta.get('format')!r}; this superneuron "
                                  f"reads format {FORMAT} (snapshots with a checksum)")
            _check_identity(path, meta, identity)
            _check_manifest(path, meta.get("arrays"), expected)
            arrays = {}
            for key, (shp, dt) in expected.items():
                if key + ".npy" not in names:
                    raise BadSnapshot(f"{path}: damaged snapshot: array '{key}' is missing from the file")
                dtype, shape, fortran, data = _member(z, key + ".npy", math.prod(shp) * np.dtype(dt).itemsize)
                if shape != shp or dtype.str != dt:
                    raise BadSnapshot(f"{path}: damaged snapshot: '{key}' has shape {shape} {dtype.str}, "
                                      f"its manifest {shp} {dt}")
                arrays[key] = _array(dtype, shape, fortran, data)
            extra = sorted(n[:-4] for n in names - {k + ".npy" for k in expected} - {"__meta__.npy"})
            if extra:
                raise BadSnapshot(f"{path}: damaged snapshot: array '{extra[0]}' is not in its manifest")
    except BadSnapshot:
        raise
    except Exception as e:  # noqa: BLE001 - zip, npy, json and key errors all mean a damaged file
        text = str(e).strip().splitlines()
        raise BadSnapshot(f"{path}: not a superneuron snapshot ({type(e).__name__}"
                          + (f": {text[0]}" if text else "") + ")") from None
    if meta.get("checksum") != _digest(meta, arrays):
        raise BadSnapshot(f"{path}: damaged snapshot: checksum mismatch")
    return meta, arrays


def _check_identity(path, meta, identity):
    """The snapshot was made by the net and solver of ``identity``, at an iteration >= 0."""
    name = identity["net"]
    if meta.get("net") != name:
        raise BadSnapshot(f"{path}: snapshot of a different net ('{meta.get('net')}'), not of '{name}'")
    if meta.get("fingerprint") != identity["fingerprint"]:
        raise BadSnapshot(f"{path}: snapshot of a different net ('{name}' with other parameter names "
                          f"or shapes), not of '{name}' as loaded")
    if meta.get("solver") != identity["solver"]:
        raise BadSnapshot(f"{path}: snapshot of a {meta.get('solver')} solver; this run uses "
                          f"{identity['solver']}")
    it = meta.get("iteration")
    if isinstance(it, bool) or not isinstance(it, int) or it < 0:
        raise BadSnapshot(f"{path}: damaged snapshot: iteration {it!r} is not a count")


def _check_manifest(path, manifest, expected):
    """The manifest ``[[key, shape, dtype], ...]`` lists exactly ``expected``."""
    if not isinstance(manifest, list) or not all(
            isinstance(m, list) and len(m) == 3 and isinstance(m[0], str) and isinstance(m[1], list)
            for m in manifest):
        raise BadSnapshot(f"{path}: damaged snapshot: no manifest of its arrays")
    listed = {m[0]: (tuple(m[1]), m[2]) for m in manifest}
    for key, (shape, dtype) in expected.items():
        if key not in listed:
            kind = "optimiser state" if key.startswith("opt:") else "parameter"
            raise BadSnapshot(f"{path}: snapshot lacks {kind} '{key.split(':', 1)[1]}', which this net "
                              f"and solver need")
        if listed[key] != (shape, dtype):
            raise BadSnapshot(f"{path}: snapshot's '{key}' is {listed[key][0]} {listed[key][1]}; this net "
                              f"needs {shape} {dtype}")
    extra = sorted(set(listed) - set(expected))
    if extra:
        raise BadSnapshot(f"{path}: snapshot has '{extra[0].split(':', 1)[-1]}', which this net and "
                          f"solver lack")


def candidates(folder, net_name):
    """Snapshots of ``net_name`` in ``folder`` (``NAME_iter_N.npz``), newest (highest N) first;
    another net's files, and ``.tmp`` files, are not among them."""
    found = []
    for f in glob.glob(os.path.join(glob.escape(folder), f"{glob.escape(net_name)}_iter_*.npz")):
        m = _NAME.search(os.path.basename(f))
        if m and os.path.basename(f)[:m.start()] == net_name:
            found.append((int(m.group(1)), f))
    return [f for _, f in sorted(found, reverse=True)]


def prune(folder, net_name, newest, keep):
    """Remove the snapshots of ``net_name`` in ``folder`` older (lower iteration) than the one
    just written, ``newest``, beyond the ``keep`` newest (``keep`` 0: remove none), with the
    ``.caffemodel`` written beside each; the removed paths. Snapshots of a higher iteration
    than ``newest`` (a run resumed from an older one) are left alone."""
    if not keep:
        return []
    files = candidates(folder, net_name)
    names = [os.path.basename(f) for f in files]
    if os.path.basename(newest) not in names:
        return []
    removed = []
    for path in files[names.index(os.path.basename(newest)) + keep:]:
        for file in (path, path[:-len(".npz")] + ".caffemodel"):
            try:
                os.remove(file)
                removed.append(file)
            except FileNotFoundError:
                pass
            except OSError as e:
                raise SNError(f"{file}: cannot remove an old snapshot ({e.strerror}); "
                              f"--snapshot-keep 0 keeps them all") from None
    return removed


_held = {}  # folder (real path) -> [its open descriptor, holders in this process]


def lock_folder(folder):
    """Hold the snapshot folder ``folder`` (which exists) for this process: SNError (one line)
    when another process holds it. The lock is a ``flock`` on the folder itself (no lock file to
    leave behind), which the system drops when the process ends. Several holders in one process
    share one lock; each calls :func:`unlock_folder` once."""
    key = os.path.realpath(folder)
    if key in _held:
        _held[key][1] += 1
        return key
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC)
    except OSError as e:
        raise SNError(f"{folder}: cannot use it as a snapshot folder ({e.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise SNError(f"{folder}: another run is writing snapshots in this folder; wait for it to end "
                      f"or give another --snapshot folder") from None
    _held[key] = [fd, 1]
    return key


def unlock_folder(key):
    """Let go of a hold taken by :func:`lock_folder` (its return value)."""
    entry = _held.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] == 0:
        del _held[key]
        os.close(entry[0])  # closing the descriptor drops the flock
