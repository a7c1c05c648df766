"""Fuzz: snapshots and the faults around writing them. A snapshot cut short, with flipped bytes,
with members missing, or crafted with a valid checksum (fields of the wrong type or size,
parameters that are NaN) must give a clean error or a correct resume; ``--resume DIR`` passes
over a damaged newest file; a full disk while a snapshot is written (a fake that raises ENOSPC)
is a clean error that leaves no ``.tmp`` and keeps the snapshot before; a kill -9 in the middle
of a write (seen by its ``.tmp``) leaves every finished snapshot whole."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest
from fuzz_helpers import assert_clean, rng, run_main

from superneuron.cli.train import main as train_main
from superneuron.train import snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "nets", "tiny.yaml")
RESUME = [TINY, "--iters", "5", "--display", "0", "--test-interval", "0"]


@pytest.fixture(scope="module")
def snaps(tmp_path_factory):
    """tiny's snapshots at iterations 2 and 4."""
    folder = tmp_path_factory.mktemp("fuzz-snaps") / "snap"
    outcome = run_main(train_main, RESUME[:1] + ["--iters", "4", "--display", "0", "--snapshot", folder,
                                                 "--snapshot-interval", "2"])
    assert outcome.rc == 0, outcome
    return folder


def _parts(path):
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    return json.loads(str(arrays.pop("__meta__"))), arrays


def _crafted(src, dst, meta=None, arrays=None):
    """A snapshot written by the real writer (so its checksum and manifest are right) from
    ``src``'s contents, with ``meta`` and ``arrays`` changed by the functions given."""
    m, a = _parts(src)
    for key in ("format", "arrays", "checksum"):
        m.pop(key)
    if meta:
        meta(m)
    if arrays:
        arrays(a)
    snapshot.write(str(dst), m, a)
    return dst


def _set(path, value):
    def change(m):
        *head, last = path
        for key in head:
            m = m[key]
        m[last] = value
    return change


def _first_param(a, change):
    key = next(k for k in sorted(a) if k.startswith("param:"))
    a[key] = change(a[key])


CRAFTED = {
    **{f"iteration {v!r}"[:40]: _set(["iteration"], v) for v in (-1, 10**30, "3", 2.5, True, None, 2**63, [1])},
    **{f"loader {k} {v!r}"[:40]: _set(["loader", k], v) for k in ("epoch", "position", "seed", "samples")
       for v in (-1, 10**30, "1", None)},
    "loader a list": _set(["loader"], [1, 2]),
    "net other": _set(["net"], "other"),
    "net a number": _set(["net"], 5),
    "fingerprint": _set(["fingerprint"], "0" * 16),
    "solver Adam": _set(["solver"], "Adam"),
    "a huge extra field": _set(["extra"], "x" * 100000),
}
ARRAYS = {
    "a parameter NaN": lambda a: _first_param(a, lambda w: np.full_like(w, np.nan)),
    "a parameter inf": lambda a: _first_param(a, lambda w: np.full_like(w, np.inf)),
    "a parameter float64": lambda a: _first_param(a, lambda w: w.astype(np.float64)),
    "a parameter of another shape": lambda a: _first_param(a, lambda w: np.zeros(w.size + 1, w.dtype)),
    "a parameter missing": lambda a: a.pop(next(k for k in sorted(a) if k.startswith("param:"))),
    "momentum missing": lambda a: a.pop(next(k for k in sorted(a) if k.startswith("opt:"))),
    "an extra array": lambda a: a.update({"param:extra/w": np.zeros(3, np.float32)}),
    "an object array": lambda a: a.update({"opt:x": np.array([{}], dtype=object)}),
}


@pytest.mark.parametrize("name", sorted(CRAFTED) + sorted(ARRAYS))
def test_crafted_snapshot(name, snaps, tmp_path):
    path = tmp_path / "tiny_iter_4.npz"
    try:
        _crafted(snaps / "tiny_iter_4.npz", path, meta=CRAFTED.get(name), arrays=ARRAYS.get(name))
    except (TypeError, ValueError):  # the writer itself refuses it: nothing to resume from
        return
    assert_clean(run_main(train_main, RESUME + ["--resume", path]))


def _damaged(good, r, k):
    data = bytearray(good)
    kind = ("cut", "flip", "zero run")[k % 3]
    if kind == "cut":
        data = data[:r.randrange(len(data))]
    elif kind == "flip":
        for _ in range(r.randint(1, 6)):
            data[r.randrange(len(data))] ^= 1 << r.randrange(8)
    else:
        at = r.randrange(len(data))
        data[at:at + r.randint(1, 400)] = bytes(min(400, len(data) - at))
    return kind, bytes(data)


@pytest.mark.parametrize("k", range(36))
def test_damaged_snapshot_alone_and_in_a_folder(k, snaps, tmp_path):
    """The damaged file alone: a clean error, or a correct resume where the damage missed every
    byte read (zip times, attributes: the checksum covers every array and the meta). In a folder
    with the whole snapshot before it: a resume from that one, or from the file if it resumed."""
    good = (snaps / "tiny_iter_4.npz").read_bytes()
    kind, data = _damaged(good, rng(f"snap-{k}"), k)
    folder = tmp_path / "snap"
    folder.mkdir()
    (folder / "tiny_iter_4.npz").write_bytes(data)
    alone = run_main(train_main, RESUME + ["--resume", folder / "tiny_iter_4.npz"])
    assert_clean(alone)
    shutil.copy(snaps / "tiny_iter_2.npz", folder)
    outcome = run_main(train_main, RESUME + ["--resume", folder])
    assert_clean(outcome)
    resumed = "iteration 4" if alone.rc == 0 else "iteration 2"
    assert outcome.rc == 0 and resumed in outcome.out, (kind, outcome.out[:300])


@pytest.mark.parametrize("member", ["__meta__.npy", "param:conv1/weight.npy", "opt:ip/weight.momentum.npy"])
def test_snapshot_with_a_member_dropped(member, snaps, tmp_path):
    path = tmp_path / "tiny_iter_4.npz"
    with zipfile.ZipFile(snaps / "tiny_iter_4.npz") as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            if info.filename != member:
                dst.writestr(info, src.read(info))
    outcome = run_main(train_main, RESUME + ["--resume", path])
    assert_clean(outcome)
    assert outcome.rc == 2


# -- faults while writing ------------------------------------------------------------------
@pytest.mark.parametrize("where", ["savez", "fsync", "replace"])
def test_full_disk_while_a_snapshot_is_written(where, tmp_path, monkeypatch):
    """The second snapshot's write fails as on a full disk: one clean line naming the file and
    the cause, no .tmp left, and the first snapshot whole (a resume from the folder uses it)."""
    real = {"savez": np.savez, "fsync": os.fsync, "replace": os.replace}[where]

    def failing(*args, **kwargs):
        first = args[0]  # a file (savez), a file descriptor (fsync) or a path (replace)
        name = getattr(first, "name", None) or (os.readlink(f"/proc/self/fd/{first}") if isinstance(first, int)
                                                else str(first))
        if "tiny_iter_2.npz" in str(name):
            if where == "savez":
                first.write(b"PK\x03\x04 half a zip")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, **kwargs)

    target = {"savez": (snapshot.np, "savez"), "fsync": (snapshot.os, "fsync"), "replace": (snapshot.os, "replace")}
    monkeypatch.setattr(*target[where], failing)
    folder = tmp_path / "snap"
    outcome = run_main(train_main, RESUME[:1] + ["--iters", "4", "--display", "0", "--snapshot", folder,
                                                 "--snapshot-interval", "1"])
    assert_clean(outcome)
    assert outcome.rc == 2 and "No space left on device" in outcome.err and "tiny_iter_2.npz" in outcome.err
    monkeypatch.undo()
    assert sorted(os.listdir(folder)) == ["tiny_iter_1.npz"]
    outcome = run_main(train_main, RESUME + ["--resume", folder])
    assert outcome.rc == 0 and "iteration 1" in outcome.out, outcome


@pytest.mark.parametrize("k", range(3))
def test_kill_during_a_snapshot_write(k, tmp_path):
    """sn-train is killed (SIGKILL) while a .tmp exists, that is in the middle of writing a
    snapshot: every finished snapshot still resumes, and the next run removes the .tmp."""
    folder = tmp_path / "snap"
    folder.mkdir()
    env = dict(os.environ, PYTHONPATH=ROOT, SN_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-m", "superneuron.cli.train", TINY, "--set", "width=96", "--iters",
                             "100000", "--display", "0", "--test-interval", "0", "--snapshot", str(folder),
                             "--snapshot-interval", "1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wanted, seen, deadline = 2 + 2 * k, 0, time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            tmps = [n for n in os.listdir(folder) if n.endswith(".tmp")]
            if tmps:
                seen += 1
                if seen >= wanted:
                    proc.send_signal(signal.SIGKILL)
                    break
                while os.path.exists(folder / tmps[0]) and time.monotonic() < deadline:
                    time.sleep(0.0005)
            time.sleep(0.0005)
    finally:
        proc.kill()
        err = proc.communicate(timeout=60)[1].decode()
    assert proc.returncode == -signal.SIGKILL, err
    left = [n for n in os.listdir(folder) if n.endswith(".tmp")]  # killed mid-write (in every trial run)
    finished = sorted(n for n in os.listdir(folder) if n.endswith(".npz"))
    assert finished, "killed before any snapshot was finished"
    for name in finished:
        outcome = run_main(train_main, [TINY, "--set", "width=96", "--iters", "0", "--display", "0",
                                        "--resume", folder / name])
        assert outcome.rc == 0 and "resumed from" in outcome.out, (name, outcome)
    outcome = run_main(train_main, [TINY, "--set", "width=96", "--iters", "0", "--display", "0", "--snapshot",
                                    folder, "--resume", folder])
    assert outcome.rc == 0, outcome
    assert not [n for n in os.listdir(folder) if n.endswith(".tmp")], f"{left} left, and not removed"
