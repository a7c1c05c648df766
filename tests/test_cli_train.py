"""sn-train from the command line: a run on an Input net, its log, and every user error as one
line with exit status 2 and no traceback."""

import json
import os

import numpy as np
import pytest

from superneuron.cli.train import main

TINY = os.path.join(os.path.dirname(__file__), "nets", "tiny.yaml")


def test_input_net_trains_on_synthetic_data_and_logs(tmp_path, capsys):
    log = tmp_path / "run.jsonl"
    assert main([TINY, "--iters", "6", "--display", "3", "--test-interval", "3", "--log", str(log),
                 "--snapshot", str(tmp_path / "snap"), "--lr", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "data: synthetic" in out and "iter 3/6" in out and "test @ iter 6" in out
    records = [json.loads(line) for line in open(log)]
    shown = [r for r in records if "loss" in r]
    assert [r["iter"] for r in shown] == [3, 6]
    assert all(r["lr"] == 0.05 and r["peak_bytes"] > 0 and r["img_per_s"] > 0 for r in shown)
    assert [r["iter"] for r in records if "test_accuracy" in r] == [3, 6]
    assert (tmp_path / "snap" / "tiny_iter_6.npz").exists()


def test_epochs_become_iterations(tmp_path, capsys):
    data = tmp_path / "d.npz"
    rng = np.random.default_rng(0)
    np.savez(data, x=rng.random((40, 3, 8, 8)).astype(np.float32), y=rng.integers(0, 5, 40))
    assert main([TINY, "--data", str(data), "--epochs", "1", "--display", "100"]) == 0
    # 40 samples, test_fraction 0.2 → 32 to train on, batch 4 → 8 iterations
    assert "trained tiny for 8 iterations" in capsys.readouterr().out


@pytest.mark.parametrize("make_args, message", [
    (lambda p: [str(p / "bad.yaml")], "bad.yaml:4:"),
    (lambda p: [TINY, "--device", "gpu"], "--device gpu: no usable GPU"),
    (lambda p: [TINY, "--data", str(p / "missing.npz")], "missing.npz: no such file"),
    (lambda p: [TINY, "--data", str(p / "labels.npz")], "labels.npz"),
    (lambda p: [TINY, "--memory", "10KB"], "budget"),
    (lambda p: [TINY, "--memory", "lots"], "bad size 'lots'"),
    (lambda p: [TINY, "--set", "width"], "expected NAME=VALUE"),
    (lambda p: [TINY, "--resume", str(p / "nothing.npz")], "nothing.npz: no such snapshot"),
    (lambda p: [TINY, "--solver", str(p / "nosolver.yaml")], "nosolver.yaml: no such solver file"),
])
def test_user_errors_are_one_line_with_status_2(tmp_path, capsys, make_args, message):
    (tmp_path / "bad.yaml").write_text("name: bad\ninput: {data: [2, 3, 4, 4], label: [2]}\nlayers:\n"
                                       "  - {name: c, type: Convolutoin, bottom: data, top: c}\n")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "labels.npz", x=rng.random((20, 3, 8, 8)).astype(np.float32), y=np.full(20, 7))
    assert main(make_args(tmp_path)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    if "bad.yaml" in message:
        assert "did you mean 'Convolution'?" in err
