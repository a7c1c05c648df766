"""Issue 17's list of tracebacks and hangs, one case each: every one is now a one-line error
(exit status 2) that names the limit it hit, found before any work."""

import io
import os
import zipfile

import numpy as np
import pytest
from fuzz_helpers import assert_clean, run_main

from superneuron import limits
from superneuron.cli.depth import main as depth_main
from superneuron.cli.plan import main as plan_main
from superneuron.cli.train import main as train_main
from superneuron.errors import SNError
from superneuron.files import read_text_capped
from superneuron.netfile.expr import ExprError, evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "nets", "tiny.yaml")
RESNET = os.path.join(ROOT, "nets", "resnet.yaml")
TINY_TEXT = open(TINY).read()


def one_error(main, argv):
    """Run a tool; assert a clean one-line error; return its text."""
    outcome = run_main(main, argv)
    assert_clean(outcome)
    lines = outcome.err.splitlines()
    assert outcome.rc == 2 and len(lines) == 1, outcome
    return lines[0]


def net(tmp_path, text):
    path = tmp_path / "net.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("num_output: '${classes}'", "num_output: 100000000000000000000000"), "(MAX_SPEC_INT)"),
    (lambda t: t.replace("pad: 1}", "pad: '${10**12}'}", 1), "(MAX_SPEC_INT)"),
    (lambda t: t.replace("width: 4}", "width: 4, s: \"${'a' * 10**12}\"}"), "(MAX_EXPR_SIZE)"),
    (lambda t: t.replace("width: 4}", "width: 4, s: '${" + "+".join(["1"] * 100000) + "}'}"), "(MAX_EXPR_CHARS)"),
    (lambda t: t.replace("width: 4}", "width: 4, s: '${" + "-" * 200 + "1}'}"), "(MAX_EXPR_DEPTH)"),
    (lambda t: t.replace("width: 4}", "width: 4, s: \"${'%*d' % (2**31, 1)}\"}"), "'*' widths"),
    (lambda t: t.replace("width: 4}", "width: 4, s: '${9**4096**4096}'}"), "(MAX_INT_BITS)"),
    (lambda t: t.replace("width: 4}", "width: 4, s: '${sum([[0]] * 10**6, [])}'}"), "(MAX_EXPR_SIZE)"),
    (lambda t: t + "  - {repeat: 1000000000, layers: [{name: r, type: ReLU, bottom: ip, top: ip}]}\n",
     "(MAX_LAYERS)"),
    (lambda t: t + "  - {repeat: 1000, as: j, layers: [{repeat: 1000, as: i, layers: [{name: 'r${j}_${i}', "
                   "type: ReLU, bottom: ip, top: ip}]}]}\n", "(MAX_LAYERS)"),
    (lambda t: t.replace("size: 8,", "size: 2147483647,"), "(MAX_TENSOR_BYTES)"),
    (lambda t: t.replace("kernel_size: 2, stride: 2", "kernel_size: 1024, stride: 2, pad: 1000"),
     "(MAX_WINDOW_TAPS)"),
    (lambda t: "params:\n" + "".join(f"  {c}: &{c} [{', '.join([f'*{chr(ord(c) - 1)}' if c > 'a' else 'x'] * 9)}]\n"
                                      for c in "abcdefghi") + t, "(MAX_YAML_NODES)"),
])
def test_net_file_limits(edit, message, tmp_path):
    assert message in one_error(plan_main, [net(tmp_path, edit(TINY_TEXT))])


@pytest.mark.parametrize("data, message", [
    (b"name: x\n\xff\xfe layers: []\n", "net.yaml:2:1: byte 0xff is not UTF-8"),
    (b"name: x\x00\nlayers: []\n", "net.yaml:1:8: a NUL byte"),
])
def test_bytes_that_are_not_text(data, message, tmp_path):
    assert message in one_error(plan_main, [net(tmp_path, data)])


def test_read_text_capped(tmp_path):
    os.mkfifo(tmp_path / "fifo")  # reading it would wait for a writer for ever
    for path, message in [(tmp_path / "fifo", "is a FIFO"), ("/dev/zero", "is a character device"),
                          (tmp_path, "is a folder"), (tmp_path / "none", "No such file")]:
        with pytest.raises(SNError, match=message):
            read_text_capped(path, 100)
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(limits.MAX_NET_FILE_BYTES + 1)
    with pytest.raises(SNError, match="MAX_NET_FILE_BYTES"):
        read_text_capped(big, limits.MAX_NET_FILE_BYTES)
    (tmp_path / "ok.yaml").write_text("name: caf\u00e9\n")
    assert read_text_capped(tmp_path / "ok.yaml", 100) == "name: caf\u00e9\n"


@pytest.mark.parametrize("main, argv, message", [
    (plan_main, [TINY, "--memory", "9" * 400], "(MAX_SIZE_BYTES)"),
    (plan_main, [TINY, "--batch", "10000000"], "(MAX_BATCH)"),
    (train_main, [TINY, "--batch", "10000000"], "(MAX_BATCH)"),
    (plan_main, [RESNET, "--set", "depth=999999998"], "(MAX_LAYERS)"),
    (depth_main, ["--memory", "1GiB", "--batch", "1", "--size", "100000"], "(MAX_DATA_SIDE)"),
    (depth_main, ["--memory", "1GiB", "--batch", "1", "--max-depth", "1000000"], "(MAX_SEARCH_DEPTH)"),
    (train_main, [TINY, "--seed", "-1"], "--seed must be in 0 .. 4294967295 (MAX_SEED), got -1"),
    (train_main, [TINY, "--log", ROOT], "is a folder; the log must be a file"),
    (train_main, [TINY, "--iters", "2", "--display", "1", "--log", "/dev/full"], "No space left on device"),
    (plan_main, [TINY, "--timeline", "x.xyz"], "the timeline is written as .png"),
    (plan_main, [TINY, "--timeline", "/dev/full"], "/dev/full: cannot write the timeline: No space left"),
    (plan_main, [TINY, "--iters"], "unrecognized arguments: --iters (see sn-plan --help)"),
])
def test_command_line_limits(main, argv, message):
    assert message in one_error(main, argv)


def test_timeline_extension_is_checked_before_planning():
    outcome = run_main(plan_main, [TINY, "--timeline", "x.xyz"])
    assert outcome.rc == 2 and outcome.out == ""  # nothing planned, nothing printed


def test_synthetic_data_too_large_for_memory(tmp_path):
    text = ("layers:\n  - {name: data, type: Data, top: [data, label], source: synthetic, batch_size: 2, "
            "samples: 1000000000, classes: 1000000000}\n  - {name: ip, type: InnerProduct, bottom: data, "
            "top: ip, num_output: 10}\n  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}\n")
    assert "more than this machine's" in one_error(train_main, [net(tmp_path, text), "--iters", "1"])


def test_npz_header_claiming_1e11_samples(tmp_path):
    buf = io.BytesIO()
    np.save(buf, np.zeros((4, 3, 8, 8), np.float32))
    header = buf.getvalue().replace(b"(4, 3, 8, 8)", b"(100000000000, 3, 8, 8)")
    path = tmp_path / "d.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", header)
        z.writestr("y.npy", (lambda b: (np.save(b, np.zeros(4, np.int64)), b.getvalue())[1])(io.BytesIO()))
    assert "header of 'x' says (100000000000, 3, 8, 8)" in one_error(train_main, [TINY, "--data", path])


@pytest.mark.parametrize("src", ["'a' * 10**6", "[0] * 10**6", "sum([[0]] * 1000, [])", "2 ** 4095", "'%5d' % 3",
                                 "range(10**6)"])
def test_values_within_the_limits_are_computed(src):
    """The limits refuse what is over them, not what is near them."""
    value = evaluate(src, {})
    assert value == eval(src.replace("range(", "list(range(") + (")" if "range(" in src else ""))  # noqa: S307


@pytest.mark.parametrize("src", ["'a' * (10**6 + 1)", "[0] * (10**6 + 1)", "2 ** 4096", "range(10**6 + 1)",
                                 "str(range(10**6))"])
def test_values_just_over_the_limits_are_refused(src):
    with pytest.raises(ExprError, match="MAX_"):
        evaluate(src, {})


def test_ctrl_c_outside_training_is_one_line(monkeypatch):
    """Ctrl-C while sn-plan plans (or sn-train builds its net): 'interrupted', status 130, no
    traceback."""
    import superneuron.cli.plan as plan_cli

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(plan_cli, "plan_from_args", interrupted)
    outcome = run_main(plan_main, [TINY])
    assert outcome.escaped is None and outcome.rc == 130 and outcome.err == "interrupted\n", outcome
