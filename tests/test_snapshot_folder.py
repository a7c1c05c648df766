"""A snapshot folder over a long run: one run at a time writes in it (a second is refused while
the first lives, and let in once it is killed), ``--resume DIR`` never takes a file being written
or another net's, only the ``--snapshot-keep`` newest snapshots stay, and a disk that refuses
a write (a real file-size limit, not a fake) or a folder that cannot be written stop the run
with one line, the earlier snapshots whole; and what a long run keeps in memory stays bounded."""

import ctypes
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

import pytest
from fuzz_helpers import assert_clean, run_main
from one_line import one_line, raises_one_line

from superneuron.cli.train import main as train_main
from superneuron.errors import SNError
from superneuron.train import snapshot
from tests.test_train import TINY, tiny_trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIET = ["--display", "0", "--test-interval", "0"]


def env(tmp_path):
    return dict(os.environ, PYTHONPATH=ROOT, SN_CACHE_DIR=str(tmp_path / "cache"), PYTHONDONTWRITEBYTECODE="1")


def iterations(folder, net="tiny"):
    return sorted(int(n[len(net) + 6:-4]) for n in os.listdir(folder)
                  if n.startswith(net + "_iter_") and n.endswith(".npz"))


# -- --snapshot-keep ------------------------------------------------------------------------
def test_only_the_newest_snapshots_are_kept_and_another_nets_are_left(tmp_path):
    folder = tmp_path / "snap"
    folder.mkdir()
    (folder / "other_iter_1.npz").write_bytes(b"another net's")
    (folder / "tiny_iter_1.npz.tmp").write_bytes(b"")  # a stale .tmp: removed at start, as before
    trainer = tiny_trainer(tmp_path, 7, snapshot_every=1)
    trainer.snapshot_keep = 3
    trainer.run()
    assert iterations(folder) == [5, 6, 7]
    assert sorted(os.listdir(folder)) == ["other_iter_1.npz", "tiny_iter_5.npz", "tiny_iter_6.npz",
                                          "tiny_iter_7.npz"]


def test_keep_zero_keeps_all_and_a_higher_iteration_is_never_removed(tmp_path):
    trainer = tiny_trainer(tmp_path, 6, snapshot_every=1)
    trainer.snapshot_keep = 0
    trainer.run()
    folder = tmp_path / "snap"
    assert iterations(folder) == [1, 2, 3, 4, 5, 6]
    # a run resumed from iteration 2 keeps 1 snapshot: its own newest, older ones removed, and
    # the later ones of the first run (3 .. 6) left alone, as they are not older
    again = tiny_trainer(tmp_path, 3, snapshot_every=1)
    again.snapshot_keep = 1
    again.restore(str(folder / "tiny_iter_2.npz"))
    again.run()
    assert iterations(folder) == [3, 4, 5, 6]


def test_snapshot_keep_on_the_command_line(tmp_path):
    outcome = run_main(train_main, [TINY, "--iters", "5", *QUIET, "--snapshot", tmp_path / "s",
                                    "--snapshot-interval", "1", "--snapshot-keep", "2"])
    assert_clean(outcome)
    assert iterations(tmp_path / "s") == [4, 5]
    outcome = run_main(train_main, [TINY, "--iters", "3", *QUIET, "--snapshot", tmp_path / "t",
                                    "--snapshot-interval", "1"])
    assert iterations(tmp_path / "t") == [1, 2, 3]  # the default keeps 5
    outcome = run_main(train_main, [TINY, "--iters", "1", "--snapshot", tmp_path / "u", "--snapshot-keep", "-1"])
    assert outcome.rc == 2 and "--snapshot-keep" in one_line(outcome.err)
    outcome = run_main(train_main, ["--help"])
    assert "--snapshot-keep" in outcome.out and f"default {snapshot.DEFAULT_KEEP}" in outcome.out


# -- two runs, one folder -------------------------------------------------------------------
def test_a_second_run_on_a_live_runs_folder_is_refused_and_let_in_after_a_kill(tmp_path):
    folder = tmp_path / "snap"
    folder.mkdir()
    first = subprocess.Popen([sys.executable, "-m", "superneuron.cli.train", TINY, "--iters", "100000", *QUIET,
                              "--snapshot", str(folder), "--snapshot-interval", "1"], env=env(tmp_path),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not iterations(folder) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.poll() is None and iterations(folder), first.stderr.read() if first.poll() else "no snapshot"
        second = run_main(train_main, [TINY, "--iters", "2", *QUIET, "--snapshot", folder])
        assert second.rc == 2, second
        line = one_line(second.err)
        assert str(folder) in line and "another run is writing snapshots" in line
        # the API is refused alike; it held the lock while the first run kept writing
        with raises_one_line(SNError, "another run"):
            tiny_trainer(tmp_path, 2)
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGKILL)  # a crash: the system drops the lock with the process
        first.wait(timeout=60)
    after = run_main(train_main, [TINY, "--iters", "1", *QUIET, "--snapshot", folder])
    assert_clean(after)
    assert not [n for n in os.listdir(folder) if n.endswith(".tmp")]


def test_resume_from_a_folder_takes_neither_a_file_being_written_nor_another_nets(tmp_path):
    folder = tmp_path / "snap"
    assert_clean(run_main(train_main, [TINY, "--iters", "4", *QUIET, "--snapshot", folder,
                                       "--snapshot-interval", "2"]))
    # a whole-looking file still under its .tmp name (as another run writes it), at a higher
    # iteration, and another net's snapshot, also newer
    shutil.copy(folder / "tiny_iter_4.npz", folder / "tiny_iter_90.npz.tmp")
    shutil.copy(folder / "tiny_iter_4.npz", folder / "tiny2_iter_95.npz")
    shutil.copy(folder / "tiny_iter_4.npz", folder / "xtiny_iter_99.npz")
    # a resume that writes elsewhere leaves the other run's .tmp alone
    outcome = run_main(train_main, [TINY, "--iters", "5", *QUIET, "--resume", folder])
    assert_clean(outcome)
    assert f"resumed from {folder / 'tiny_iter_4.npz'} at iteration 4" in outcome.out
    assert "skipped" not in outcome.out  # not even looked at
    assert (folder / "tiny_iter_90.npz.tmp").exists()


# -- a disk that refuses, a folder that cannot be written -------------------------------------
def _file_size_limit(limit):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_file_size_limit_stops_with_one_line_and_keeps_the_earlier_snapshots(tmp_path):
    folder = tmp_path / "snap"
    assert_clean(run_main(train_main, [TINY, "--iters", "2", *QUIET, "--snapshot", folder,
                                       "--snapshot-interval", "1"]))
    size = os.path.getsize(folder / "tiny_iter_2.npz")
    before = {n: (folder / n).read_bytes() for n in os.listdir(folder)}
    run = subprocess.run([sys.executable, "-m", "superneuron.cli.train", TINY, "--iters", "4", *QUIET,
                          "--snapshot", str(folder), "--snapshot-interval", "1", "--resume", str(folder)],
                         env=env(tmp_path), preexec_fn=_file_size_limit(size // 2), capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2, run
    line = one_line(run.stderr)
    assert "tiny_iter_3.npz" in line and "File too large" in line and "earlier snapshots" in line
    assert {n: (folder / n).read_bytes() for n in os.listdir(folder)} == before  # no .tmp, none changed
    outcome = run_main(train_main, [TINY, "--iters", "2", *QUIET, "--resume", folder])
    assert_clean(outcome)
    assert "tiny_iter_2.npz at iteration 2" in outcome.out and "skipped" not in outcome.out


def _without_root_override():
    """For a process run as root: drop the capabilities that let root write where the
    permissions say no (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH) from its bounding set, so that
    the program it executes obeys them."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_a_read_only_folder_is_refused_at_start_up(tmp_path):
    folder = tmp_path / "snap"
    assert_clean(run_main(train_main, [TINY, "--iters", "1", *QUIET, "--snapshot", folder]))
    folder.chmod(0o500)
    try:
        run = subprocess.run([sys.executable, "-m", "superneuron.cli.train", TINY, "--iters", "3", *QUIET,
                              "--snapshot", str(folder)], env=env(tmp_path), capture_output=True, text=True,
                             timeout=120, preexec_fn=_without_root_override if os.geteuid() == 0 else None)
    except subprocess.SubprocessError as e:
        pytest.skip(f"cannot drop root's permission override here: {e}")
    finally:
        folder.chmod(0o700)
    assert run.returncode == 2, run
    assert one_line(run.stderr) == f"error: {folder}: cannot write there (Permission denied)"
    assert "iter " not in run.stdout  # refused before training
    assert iterations(folder) == [1]


# -- memory flat over a long run ----------------------------------------------------------
@pytest.mark.parametrize("display, most", [(0, 0), (4, 4)])
def test_the_display_window_holds_one_interval_at_most(display, most, tmp_path, monkeypatch):
    """What a display averages is kept for one interval only; with display 0 (none), nothing:
    before, every loss of the run was kept (a float and an accuracy an iteration, for ever:
    the slow growth of tools/long_run.py's first curve)."""
    from superneuron.train import evaluation
    from superneuron.train import trainer as train

    longest = []

    class Window(evaluation.Window):
        def add(self, *args, **kwargs):
            super().add(*args, **kwargs)
            longest.append(len(self.losses))

    monkeypatch.setattr(train, "Window", Window)
    trainer = tiny_trainer(tmp_path, 13)
    trainer.solver = trainer.solver.with_overrides(display=display)
    trainer.run()
    assert max(longest, default=0) == most and trainer.iteration == 13
