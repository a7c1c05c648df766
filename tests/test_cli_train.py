"""sn-train from the command line: a run on an Input net, its log, and every user error as one
line with exit status 2 and no traceback."""

import json
import os

import numpy as np
import pytest
from one_line import cli_error

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


def test_superneurons_trains_the_same_with_measured_costs(tmp_path, capsys, monkeypatch):
    """--profile measures and caches this net's kernel times and copy bandwidth; the run under
    superneurons offloads to the host, stalls nowhere, and learns exactly as baseline does with
    the same cached table (so with the same convolution algorithms: DESIGN.md's bit-identity)."""
    monkeypatch.setenv("SN_CACHE_DIR", str(tmp_path / "cache"))
    logs, outs = {}, {}
    for policy, extra in (("superneurons", ["--profile"]), ("baseline", [])):
        logs[policy] = tmp_path / f"{policy}.jsonl"
        assert main([TINY, "--iters", "4", "--display", "1", "--test-interval", "0", "--policy", policy,
                     "--log", str(logs[policy]), *extra]) == 0
        outs[policy] = capsys.readouterr().out
    assert "costs: measured on this device" in outs["superneurons"] and ", 0 stalls" in outs["superneurons"]
    assert "costs: measured on this device" in outs["baseline"]  # the cached table
    assert list((tmp_path / "cache").glob("costs-cpu-*.json"))
    losses = {p: [json.loads(line)["loss"] for line in open(f) if '"loss"' in line] for p, f in logs.items()}
    assert len(losses["baseline"]) == 4 and losses["superneurons"] == losses["baseline"]


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
    (lambda p: [TINY, "--threads", "0"], "--threads must be in 1 .. 4096, got 0"),
])
def test_user_errors_are_one_line_with_status_2(tmp_path, capsys, make_args, message):
    (tmp_path / "bad.yaml").write_text("name: bad\ninput: {data: [2, 3, 4, 4], label: [2]}\nlayers:\n"
                                       "  - {name: c, type: Convolutoin, bottom: data, top: c}\n")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "labels.npz", x=rng.random((20, 3, 8, 8)).astype(np.float32), y=np.full(20, 7))
    err = cli_error(capsys, main, make_args(tmp_path))
    assert message in err, err
    if "bad.yaml" in message:
        assert "did you mean 'Convolution'?" in err


def test_policies_train_identically_and_peaks_match_sn_plan(tmp_path, capsys):
    """sn-train under liveness gives bit-identical losses to baseline with a lower peak, and
    the peak it reaches is the one sn-plan prints for the same net, policy and solver."""
    import json as _json

    from superneuron.cli.plan import main as plan_main
    runs = {}
    for policy in ("baseline", "liveness"):
        log = tmp_path / f"{policy}.jsonl"
        assert main([TINY, "--iters", "4", "--display", "1", "--policy", policy, "--log", str(log)]) == 0
        records = [_json.loads(line) for line in open(log) if '"loss"' in line and "test_loss" not in line]
        capsys.readouterr()
        assert plan_main([TINY, "--policy", policy, "--json"]) == 0
        planned = _json.loads(capsys.readouterr().out)["peak_bytes"]
        runs[policy] = ([r["loss"] for r in records], records[-1]["peak_bytes"], planned)
    assert runs["liveness"][0] == runs["baseline"][0]
    for _, real, planned in runs.values():
        assert real == planned
    assert runs["liveness"][1] < runs["baseline"][1]


def test_budget_too_small_names_the_step(capsys):
    err = cli_error(capsys, main, [TINY, "--policy", "liveness", "--memory", "20KiB"])
    assert "needs" in err and "first exceeded at " in err and "the peak is " in err
    assert "budget 20.0 KiB (" in err and "(policy liveness)" in err
    assert "Forward(" in err or "Backward(" in err or "Update(" in err


def test_threads_train_the_same_and_are_given_back(tmp_path, capsys):
    """--threads 1 and --threads 3 train the tiny net to losses equal to float32 rounding (its
    im2col convolutions bit for bit; its GEMMs split three ways may sum in another order), and
    the kernels' thread count is the one asked for during the run."""
    from superneuron.layers import parallel
    before, losses = parallel.threads(), {}
    try:
        for n in (1, 3):
            log = tmp_path / f"{n}.jsonl"
            assert main([TINY, "--iters", "3", "--display", "1", "--test-interval", "0", "--threads", str(n),
                         "--log", str(log)]) == 0
            assert parallel.threads() == n
            losses[n] = [json.loads(line)["loss"] for line in open(log) if '"loss"' in line]
    finally:
        parallel.set_threads(before)
    capsys.readouterr()
    assert len(losses[1]) == 3
    np.testing.assert_allclose(losses[3], losses[1], rtol=1e-5)
