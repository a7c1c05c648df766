"""sn-train is never silent for long: the plan of the run at the start, a progress line at
least every PERIOD seconds off a terminal (in training and in test passes, on a fake clock),
the average speed of the whole run and the arena at the end, and a JSONL log whose records say
what they are, when, and which run."""

import io
import json
import os
import re

import pytest

from superneuron.cli.progress import PERIOD, Progress, count_tests
from superneuron.cli.train import build_parser, main
from superneuron.data.batches import Loader
from superneuron.data.sources import open_source, source_config
from superneuron.net import load_net
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig
from superneuron.train.trainer import Trainer

TINY = os.path.join(os.path.dirname(__file__), "nets", "tiny.yaml")


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Recorder(io.StringIO):
    """Output that notes the fake time of every line written."""

    def __init__(self, clock):
        super().__init__()
        self.clock, self.times = clock, []

    def write(self, text):
        self.times += [self.clock()] * text.count("\n")
        return super().write(text)


def test_off_a_terminal_a_line_comes_at_least_every_period():
    """Iterations of 3 s, then a test pass of 40 batches of 2 s, with no display lines: the
    longest silence is under PERIOD plus one step, and the lines say where the run is."""
    clock = FakeClock()
    out = Recorder(clock)
    progress = Progress(100, out=out, clock=clock, tty=False)
    for it in range(1, 31):
        clock.now += 3.0
        progress({"kind": "iter", "iter": it, "loss": 1.0 / it, "images": 8, "seconds": 3.0,
                  "warmup": it == 1})
    for b in range(1, 41):
        clock.now += 2.0
        progress({"kind": "test_batch", "batch": b, "batches": 40})
    times = [1000.0] + out.times + [clock.now]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps) <= PERIOD + 3.0, gaps
    text = out.getvalue()
    assert "measured: 3.0 s per iteration over 3 iterations" in text
    assert re.search(r"progress: iter \d+/100 \(\d+ %\) \| loss [\d.]+ \| 3 img/s \| .* elapsed, about .* left", text)
    assert "testing at iter 30: batch" in text
    # and none when the run is busy printing anyway: one line per PERIOD, not per iteration
    assert len(out.times) <= (clock.now - 1000.0) / PERIOD + 2


def test_the_heartbeat_speaks_during_one_long_iteration():
    """A single iteration longer than the period (a 224x224 net on a CPU) is not silent."""
    out = io.StringIO()
    progress = Progress(1000, out=out, period=0.05, tty=False)
    progress({"kind": "iter", "iter": 1, "loss": 1.0, "images": 8, "seconds": 0.01, "warmup": True})
    progress.start_heartbeat()
    import time
    time.sleep(0.4)
    progress.close()
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2 and all(re.fullmatch(r"progress: iteration 2/1000 running, .* so far \(.* elapsed\)", x)
                                   for x in lines), lines
    time.sleep(0.1)
    assert out.getvalue().splitlines() == lines  # closed: silent


def test_a_fast_run_prints_no_progress_lines():
    clock = FakeClock()
    out = Recorder(clock)
    progress = Progress(1000, out=out, clock=clock, tty=False)
    for it in range(1, 1001):
        clock.now += 0.001
        progress({"kind": "iter", "iter": it, "loss": 1.0, "images": 8, "seconds": 0.001, "warmup": it == 1})
    assert "progress:" not in out.getvalue() and out.getvalue().count("measured:") == 1


def test_on_a_terminal_a_live_bar_is_drawn():
    out = io.StringIO()
    progress = Progress(10, out=out, tty=True)
    for it in range(1, 4):
        progress({"kind": "iter", "iter": it, "loss": 0.5, "images": 8, "seconds": 0.01, "warmup": it == 1})
    progress.close()
    assert "3/10" in out.getvalue() and "loss=0.5000" in out.getvalue()


@pytest.mark.parametrize("start, max_iter, interval, expected", [
    (0, 10, 4, 3), (0, 8, 4, 2), (0, 10, 0, 1), (5, 10, 4, 2), (10, 10, 4, 0)])
def test_count_tests_counts_what_the_trainer_runs(tmp_path, start, max_iter, interval, expected):
    trainer = tiny_trainer(tmp_path, max_iter, interval)
    events = []
    trainer.iteration = start  # as after a resume
    trainer.run(events.append)
    ran = sum(e["kind"] == "test" for e in events)
    assert ran == expected == count_tests(start, max_iter, interval, True)


def tiny_trainer(tmp_path, max_iter, test_interval, log=None):
    solver = SolverConfig(base_lr=0.05, max_iter=max_iter, display=2, test_interval=test_interval)
    net = load_net(TINY, optimizer=make_optimizer(solver))
    cfg = source_config("synthetic", {"batch_size": 4})
    cfg.update(channels=3, size=8, classes=5, samples=30)
    train_set, test_set = open_source(cfg)
    return Trainer(net, solver, Loader(train_set, 4), Loader(test_set, 4, shuffle=False, train=False),
                   log_path=log)


def test_average_rate_is_the_whole_runs_not_the_last_intervals(tmp_path):
    trainer = tiny_trainer(tmp_path, 9, 0)
    events = []
    trainer.run(events.append)
    steps = [e for e in events if e["kind"] == "iter"]
    assert [e["warmup"] for e in steps] == [True] + [False] * 8
    timed = steps[1:]
    whole = sum(e["images"] for e in timed) / sum(e["seconds"] for e in timed)
    assert trainer.average_rate == pytest.approx(whole, rel=1e-12)
    last = [e for e in events if e["kind"] == "display"][-1]  # iterations 9 alone
    assert last["img_per_s"] == pytest.approx(4 / steps[-1]["seconds"])


def test_the_jsonl_log_has_kinds_times_and_a_run_marker(tmp_path):
    log = tmp_path / "run.jsonl"
    for _ in range(2):  # two runs appended to one file
        tiny_trainer(tmp_path, 4, 2, log=str(log)).run()
    records = [json.loads(line) for line in open(log)]
    assert all({"kind", "time", "run"} <= set(r) for r in records)
    runs = list(dict.fromkeys(r["run"] for r in records))
    assert len(runs) == 2
    for run in runs:
        kinds = [r["kind"] for r in records if r["run"] == run]
        assert kinds == ["start", "display", "test", "display", "test", "end"]
    start = records[0]
    assert start["net"] == "tiny" and start["max_iter"] == 4 and start["batch"] == 4 and start["start_iter"] == 0
    assert all(abs(r["time"] - records[0]["time"]) < 600 for r in records)
    end = records[5]
    assert end["iter"] == 4 and end["img_per_s"] > 0 and end["arena_bytes"] >= end["peak_bytes"] > 0


def test_sn_train_prints_the_plan_and_ends_with_average_speed_peak_and_arena(tmp_path, capsys):
    log = tmp_path / "run.jsonl"
    assert main([TINY, "--iters", "10", "--display", "5", "--test-interval", "4", "--log", str(log)]) == 0
    out = capsys.readouterr().out.splitlines()
    plan = next(line for line in out if line.startswith("plan:"))
    assert "10 iterations of batch 4" in plan and "on the CPU" in plan and "3 passes of" in plan
    estimate = next(line for line in out if line.startswith("estimated time:"))
    assert "per iteration" in estimate and "cost model" in estimate
    assert out.index(plan) < out.index(next(line for line in out if line.startswith("iter ")))
    assert any(line.startswith("convolutions: im2col") for line in out)
    end = [json.loads(line) for line in open(log)][-1]
    last = out[-1]
    assert f"{end['img_per_s']:.0f} img/s (average over the run" in last
    arena = re.search(r"peak device memory (.+?), arena (.+?)( \||$)", last)
    assert arena, last
    from superneuron.report import human_bytes
    assert arena.group(1) == human_bytes(end["peak_bytes"]) and arena.group(2) == human_bytes(end["arena_bytes"])


def test_help_epilog_points_at_the_flags_above():
    text = build_parser().format_help()
    epilog = text[text.rindex("--log"):]
    assert "flags below" not in text and "flags above" in epilog
