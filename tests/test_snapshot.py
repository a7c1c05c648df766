"""Snapshots are checked whole before use, written atomically, and `--resume DIR` takes the newest
one of this net that is whole, saying which newer ones it skipped."""

import errno
import json
import os
import struct
import zipfile

import numpy as np
import pytest
from one_line import cli_error, raises_one_line

from superneuron.cli.train import main
from superneuron.errors import SNError
from superneuron.train import snapshot
from tests.test_train import TINY, tiny_trainer


def one_line_error(capsys, argv):
    """Run sn-train with ``argv``; assert exit status 2 and a one-line error; return it."""
    return cli_error(capsys, main, argv)


def rewrite(src, dst, drop=(), change=None, meta=None):
    """Copy the zip ``src`` to ``dst`` member by member (fresh zip CRCs): leaving out the arrays
    in ``drop``, passing each array through ``change(key, array)`` and the meta through
    ``meta(dict)``; what a damaged or crafted file that zip itself finds sound looks like."""
    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files}
    m = json.loads(str(arrays.pop("__meta__")))
    if meta:
        meta(m)
    out = {"__meta__": np.array(json.dumps(m))}
    for k, a in arrays.items():
        if k not in drop:
            out[k] = change(k, a) if change else a
    np.savez(dst, **out)
    return str(dst)


def cut_central_directory(src, dst, skip):
    """Copy ``src`` with its zip end record pointing past the first ``skip`` central-directory
    entries: zipfile then lists only the later members, silently."""
    data = bytearray(open(src, "rb").read())
    end = data.rfind(b"PK\x05\x06")
    assert data.rfind(b"PK\x06\x06") < 0  # a small file: no zip64 end record to edit as well
    count, size, offset = struct.unpack_from("<HII", data, end + 10)
    pos = offset
    for _ in range(skip):  # walk past central-directory entries
        n, m, k = struct.unpack_from("<HHH", data, pos + 28)
        pos += 46 + n + m + k
    struct.pack_into("<HHII", data, end + 8, count - skip, count - skip, size - (pos - offset), pos)
    open(dst, "wb").write(bytes(data))
    return str(dst)


@pytest.fixture(scope="module")
def run6(tmp_path_factory):
    """A folder with tiny's snapshots at iterations 2, 4 and 6, made by sn-train."""
    folder = tmp_path_factory.mktemp("snaps")
    assert main([TINY, "--iters", "6", "--display", "0", "--snapshot", str(folder / "snap"),
                 "--snapshot-interval", "2"]) == 0
    return folder / "snap"


def test_a_snapshot_with_an_array_missing_is_a_one_line_error(run6, tmp_path, capsys):
    good = str(run6 / "tiny_iter_4.npz")
    assert main([TINY, "--iters", "6", "--display", "0", "--resume", good]) == 0
    capsys.readouterr()
    cases = {
        # members gone from the zip (a damaged zip directory), the manifest still listing them
        rewrite(good, tmp_path / "a.npz", drop={"opt:ip/weight.momentum"}):
            "array 'opt:ip/weight.momentum' is missing",
        cut_central_directory(good, tmp_path / "b.npz", 3): "missing",
        # a consistent but incomplete snapshot (crafted: manifest and checksum agree)
        _crafted(good, tmp_path / "c.npz", drop="param:conv1/weight"): "lacks parameter 'conv1/weight'",
        _crafted(good, tmp_path / "d.npz", drop="opt:conv1/bias.momentum"):
            "lacks optimiser state 'conv1/bias.momentum'",
        # bytes changed behind zip's back (fresh CRCs), and the iteration edited: the checksum
        rewrite(good, tmp_path / "e.npz", change=lambda k, a: a + (k == "param:ip/bias")): "checksum mismatch",
        rewrite(good, tmp_path / "f.npz", meta=lambda m: m.update(iteration=5)): "checksum mismatch",
        _crafted(good, tmp_path / "g.npz", loader={"epoch": -1}): "data position: 'epoch' must be a count >= 0, got -1",
        _crafted(good, tmp_path / "h.npz", iteration="4"): "iteration '4' is not a count",
    }
    assert len(np.load(tmp_path / "b.npz").files) < len(np.load(good).files)  # as the issue found
    for path, message in cases.items():
        err = one_line_error(capsys, [TINY, "--iters", "6", "--resume", path])
        assert path in err and message in err, err


def _crafted(src, dst, drop=None, **changes):
    """A snapshot without array ``drop`` and with the meta ``changes``, whose manifest and
    checksum agree with that (a crafted file, not a damaged one)."""
    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays.pop("__meta__")))
    arrays.pop(drop, None)
    keep = {k: meta[k] for k in ("net", "fingerprint", "solver", "iteration", "loader")}
    snapshot.write(str(dst), dict(keep, **changes), arrays)
    return str(dst)


def test_resume_dir_falls_back_past_damaged_and_never_takes_another_nets(run6, tmp_path, capsys):
    folder = tmp_path / "snap"
    folder.mkdir()
    for n in (2, 4, 6):
        (folder / f"tiny_iter_{n}.npz").write_bytes((run6 / f"tiny_iter_{n}.npz").read_bytes())
    newest = folder / "tiny_iter_6.npz"
    newest.write_bytes(newest.read_bytes()[:-200])  # a truncated file
    rewrite(folder / "tiny_iter_4.npz", folder / "tiny_iter_5.npz", change=lambda k, a: a * 2)
    # another net's snapshot, newer; and one of a net of the same name with other shapes
    (folder / "other_iter_90.npz").write_bytes((run6 / "tiny_iter_6.npz").read_bytes())
    assert main([TINY, "--set", "width=6", "--iters", "8", "--display", "0", "--snapshot",
                 str(tmp_path / "wide")]) == 0
    (folder / "tiny_iter_8.npz").write_bytes((tmp_path / "wide" / "tiny_iter_8.npz").read_bytes())
    (folder / "tiny_iter_7.npz.tmp").write_bytes(b"half a snapshot from a killed run")
    capsys.readouterr()
    assert main([TINY, "--iters", "6", "--display", "0", "--resume", str(folder)]) == 0
    out = capsys.readouterr().out
    assert f"resumed from {folder / 'tiny_iter_4.npz'} at iteration 4" in out
    skipped = [line for line in out.splitlines() if line.startswith("resume: skipped ")]
    assert [line.split(": ")[1].rsplit("/", 1)[-1] for line in skipped] == [
        "tiny_iter_8.npz", "tiny_iter_6.npz", "tiny_iter_5.npz"], out
    assert "different net" in skipped[0] and "not a superneuron snapshot" in skipped[1]
    assert "checksum mismatch" in skipped[2]
    # nothing usable: one line naming the folder and the newest file's problem
    for n in (2, 4):
        os.remove(folder / f"tiny_iter_{n}.npz")
    err = one_line_error(capsys, [TINY, "--iters", "6", "--resume", str(folder)])
    assert f"{folder}: none of its 3 snapshots of net 'tiny' is usable" in err and "different net" in err
    err = one_line_error(capsys, [TINY, "--iters", "6", "--resume", str(tmp_path / "wide" / "..")])
    assert "no snapshots of net 'tiny'" in err


def test_a_failed_write_leaves_the_previous_snapshot_as_it_was(tmp_path, monkeypatch):
    """A write that fails half-way (a full disk, a kill) must not touch the snapshot already at
    that name, leave a partial file at the final name, or leave its temporary behind; and
    `--resume DIR` still takes the previous snapshot, with nothing skipped. An in-place writer
    fails every one of these."""
    t = tiny_trainer(tmp_path, 2)
    t.run()
    folder = tmp_path / "snap"
    before = (folder / "tiny_iter_2.npz").read_bytes()
    real = np.lib.format.write_array

    def write_array(fp, array, *args, **kw):
        if array.dtype.kind == "f":  # the meta went through; fail within the first parameter
            fp.write(np.ascontiguousarray(array).tobytes()[:array.nbytes // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fp, array, *args, **kw)

    monkeypatch.setattr(np.lib.format, "write_array", write_array)
    with raises_one_line(SNError, match="tiny_iter_2.npz: cannot write snapshot \\(No space left on device\\)"):
        t.snapshot()  # over the existing tiny_iter_2.npz
    t.iteration = 4
    with raises_one_line(SNError, match="cannot write snapshot"):
        t.snapshot()
    monkeypatch.setattr(np.lib.format, "write_array", real)
    assert (folder / "tiny_iter_2.npz").read_bytes() == before
    assert sorted(os.listdir(folder)) == ["tiny_iter_2.npz"]
    events = []
    again = tiny_trainer(tmp_path, 4)
    assert again.restore(str(folder), on_event=events.append) == str(folder / "tiny_iter_2.npz")
    assert events == [] and again.iteration == 2


def test_a_snapshot_is_synced_before_it_is_renamed_into_place(tmp_path, monkeypatch):
    t = tiny_trainer(tmp_path, 1)
    t.run()
    calls, real_fsync, real_replace = [], os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd)))
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append(("replace", str(a), str(b))), real_replace(a, b)))
    path = t.snapshot(str(tmp_path / "snap" / "x_iter_1.npz"))
    tmp = [c for c in calls if c[0] == "replace"]
    assert len(tmp) == 1 and tmp[0][2] == path and tmp[0][1] != path
    assert os.path.dirname(tmp[0][1]) == os.path.dirname(path)  # a rename, not a copy across disks
    assert calls.index(("fsync", tmp[0][1])) < calls.index(tmp[0])  # the data is on disk first


def test_a_stale_tmp_is_removed_and_never_resumed_from(tmp_path):
    folder = tmp_path / "snap"
    folder.mkdir()
    (folder / "tiny_iter_9.npz.tmp").write_bytes(b"PK")
    (folder / "other_iter_9.npz.tmp").write_bytes(b"PK")  # another net's: not ours to remove
    t = tiny_trainer(tmp_path, 1)
    assert sorted(os.listdir(folder)) == ["other_iter_9.npz.tmp"]
    with raises_one_line(SNError, match="no snapshots of net 'tiny'"):
        t.restore(str(folder))


def test_zip_listing_still_matches_the_manifest(run6):
    """What read() checks is what write() wrote: the manifest lists every member."""
    with zipfile.ZipFile(run6 / "tiny_iter_2.npz") as z:
        members = sorted(n[:-4] for n in z.namelist())
    meta, arrays = snapshot.read(str(run6 / "tiny_iter_2.npz"), _expected(run6), _identity(run6))
    assert members == sorted(["__meta__", *arrays]) == sorted(["__meta__", *(m[0] for m in meta["arrays"])])


def _expected(run6):
    with np.load(run6 / "tiny_iter_2.npz") as z:
        meta = json.loads(str(z["__meta__"]))
    return {k: (tuple(s), d) for k, s, d in meta["arrays"]}


def _identity(run6):
    with np.load(run6 / "tiny_iter_2.npz") as z:
        meta = json.loads(str(z["__meta__"]))
    return {k: meta[k] for k in ("net", "fingerprint", "solver")}
