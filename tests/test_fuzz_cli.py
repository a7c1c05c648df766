"""Fuzz: the command-line tools' arguments. Random combinations of flags with bad numbers (huge,
negative, non-finite, not numbers), sizes, policies, ``--set`` values and paths that are
folders, FIFOs, devices, missing, huge or binary must end, within their time, in a clean error
(status 2, one line) or a correct run. Also: output into a pipe that closes (``| head``)."""

import os
import subprocess
import sys

import pytest
from fuzz_helpers import assert_clean, rng, run_main

from superneuron.cli.depth import main as depth_main
from superneuron.cli.plan import main as plan_main
from superneuron.cli.train import main as train_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "nets", "tiny.yaml")

NUMBERS = ["-1", "0", "10000000", "1048577", "1e400", "9" * 400, "x", "", "2.5", "0x10", "-0", " 7", "nan", "inf"]
FLOATS = ["nan", "inf", "-inf", "-1", "0", "1e400", "1e-320", "x", "", "0.05"]
SIZES = ["9" * 400, "1e400", "-5GiB", "0", "1B", "12GiB", "nan", "inf", "1024TiB", "1025TiB", " ", "5 GiB ", "0.5B",
         "10KB", "1" + "0" * 30 + "B"]
POLICIES = ["", "x", "liveness+params+params", "superneurons+params", "baseline+params", "+params", "liveness",
            "offload", "recompute", "superneurons", "optimal", "gist", "auto"]
SETS = ["width=1000000000", "width=0", "width=-1", "size=100000", "size=1", "batch=10000000", "classes=0",
        "width='${10**12}'", "nope=1", "width=", "size=[1, 2]", "width=" + "[" * 60 + "]" * 60]

# path kinds, made on demand in a case's tmp_path: (what the flag is given, its name in the id)
PATHS = ["dir", "fifo", "/dev/zero", "/dev/null", "/dev/full", "missing", "missing-folder", "binary", "empty",
         "sparse-1GiB", "loop", "non-utf8"]


def make_path(kind, tmp_path, suffix=".yaml"):
    """A path of the given kind under ``tmp_path`` (or a device): what a hostile argument names."""
    path = tmp_path / f"{kind.replace('/', '_')}{suffix}"
    if kind.startswith("/dev/"):
        return kind
    if os.path.lexists(path):  # named twice in one case
        return str(path)
    if kind == "dir":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "missing-folder":
        return str(tmp_path / "no" / f"such{suffix}")
    elif kind == "binary":
        path.write_bytes(bytes(range(256)) * 64)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "sparse-1GiB":
        with open(path, "wb") as f:
            f.truncate(1 << 30)  # no disk taken; reads as a GiB of NUL bytes
    elif kind == "loop":
        os.symlink(path, path)
    elif kind == "non-utf8":
        path.write_bytes(b"name: caf\xe9\nlayers: []\n")
    return str(path)


def _flag_cases(tool, flags, count):
    """``count`` random argument lists for ``tool``: 1 to 3 of ``flags`` (flag -> values)."""
    r = rng(f"cli-{tool}")
    cases = []
    for k in range(count):
        chosen = r.sample(sorted(flags), r.randint(1, 3))
        args = []
        for flag in chosen:
            args += [flag, r.choice(flags[flag])]
        cases.append(pytest.param(args, id=f"{tool}-{k}-" + " ".join(args)[:70]))
    return cases


PLAN_FLAGS = {"--batch": NUMBERS, "--memory": SIZES, "--host-memory": SIZES, "--workspace-limit": SIZES,
              "--policy": POLICIES, "--placement": ["dynamic", "planned", "x"], "--set": SETS,
              "--device": ["cpu", "gpu", "tpu"], "--timeline": ["PATH:" + k for k in PATHS] + ["x.xyz", "t.png"],
              "--trace": ["PATH:" + k for k in PATHS] + ["t.json"], "--solver": ["PATH:" + k for k in PATHS],
              "--ranks": NUMBERS, "--bucket-size": SIZES,
              "--link": ["nan", "inf", "1e400GB/s", "0GB/s", "5GB/s,-1us", "5GB/s,nanus", "5GB/s,infs", ",", "x",
                         "100GB/s", "25GB/s,10us"]}
TRAIN_FLAGS = {"--batch": NUMBERS, "--memory": SIZES, "--policy": POLICIES, "--set": SETS,
               "--epochs": FLOATS, "--lr": FLOATS, "--seed": ["-1", "4294967296", "4294967295", "x", "9" * 30, "0"],
               "--display": ["-1", "0", "x", "1"], "--test-interval": ["-1", "0", "x"],
               "--snapshot-interval": ["-1", "0", "x"], "--log": ["PATH:" + k for k in PATHS],
               "--snapshot": ["PATH:" + k for k in PATHS], "--resume": ["PATH:" + k for k in PATHS],
               "--data": ["PATH:" + k for k in PATHS] + ["digits", "synthetic", "PATH:fifo.npz", "PATH:dir.npz"],
               "--solver": ["PATH:" + k for k in PATHS], "--iters": ["-1", "0", "x", "1e3", "2"],
               "--timeout": FLOATS, "--bucket-size": SIZES}
DEPTH_FLAGS = {"--batch": NUMBERS, "--memory": SIZES, "--host-memory": SIZES, "--size": NUMBERS,
               "--policies": ["", ",", "x", "liveness+params+params", "baseline,x"], "--set": SETS,
               "--max-depth": NUMBERS, "--device": ["cpu", "tpu"]}


def _resolve(args, tmp_path):
    out = []
    for a in args:
        if a.startswith("PATH:"):
            kind = a[5:]
            suffix = ".npz" if kind.endswith(".npz") else ".yaml"
            a = make_path(kind.removesuffix(".npz"), tmp_path, suffix)
        out.append(a)
    return out


@pytest.mark.parametrize("args", _flag_cases("plan", PLAN_FLAGS, 110))
def test_plan_arguments(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # t.png, t.json and x.xyz land here
    assert_clean(run_main(plan_main, [TINY] + _resolve(args, tmp_path)), ok=(0, 3))


@pytest.mark.parametrize("args", _flag_cases("train", TRAIN_FLAGS, 110))
def test_train_arguments(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SN_CACHE_DIR", str(tmp_path / "cache"))
    base = [TINY, "--display", "1"] + ([] if "--iters" in args or "--epochs" in args else ["--iters", "1"])
    if "--epochs" in args:
        base += ["--data", "synthetic"]  # 1024 samples: an epoch is 205 iterations of batch 4
    assert_clean(run_main(train_main, base + _resolve(args, tmp_path)), ok=(0,))


@pytest.mark.parametrize("args", _flag_cases("depth", DEPTH_FLAGS, 40))
def test_depth_arguments(args, tmp_path):
    base = {"--memory": "1GiB", "--batch": "1", "--policies": "liveness", "--size": "32", "--max-depth": "56"}
    for i in range(0, len(args), 2):
        base.pop(args[i], None)
    argv = [a for kv in base.items() for a in kv] + _resolve(args, tmp_path)
    assert_clean(run_main(depth_main, argv), ok=(0, 3))


@pytest.mark.parametrize("kind", PATHS)
@pytest.mark.parametrize("main", [plan_main, train_main, depth_main], ids=["plan", "train", "depth"])
def test_the_network_file_is_any_kind_of_path(main, kind, tmp_path):
    extra = {depth_main: ["--memory", "1GiB", "--batch", "1"], train_main: ["--iters", "1"]}.get(main, [])
    assert_clean(run_main(main, [make_path(kind, tmp_path)] + extra), ok=(0, 3))


def test_output_into_a_closed_pipe_ends_quietly():
    """``sn-plan --steps | head -1``: the reader goes away; no BrokenPipeError, status 141 as a
    tool killed by SIGPIPE would give."""
    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    outcome = run_main(plan_main, [TINY, "--steps"], stdout=ClosedPipe())
    assert outcome.escaped is None and outcome.rc == 141 and outcome.err == "", outcome


def test_a_real_pipe_closed_by_head():
    # more output than a pipe holds (64 KiB), so the writer meets the closed pipe whatever the timing
    env = dict(os.environ, PYTHONPATH=ROOT)
    net = os.path.join(ROOT, "nets", "resnet_cifar.yaml")
    proc = subprocess.run(f"'{sys.executable}' -m superneuron.cli.plan '{net}' --set depth=56 --steps | head -1; "
                          "exit ${PIPESTATUS[0]}", shell=True, executable="/bin/bash", env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.startswith("net resnet56_cifar") and proc.stdout.count("\n") == 1
    assert proc.stderr == "" and proc.returncode == 141, proc.stderr


def test_timeline_into_dev_full_is_an_error_not_wrote():
    outcome = run_main(plan_main, [TINY, "--timeline", "/dev/full"])
    assert_clean(outcome)
    assert outcome.rc == 2 and "No space left" in outcome.err and "wrote" not in outcome.err
