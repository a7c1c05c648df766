"""What a newcomer tries in the first hour works or says plainly why not: image folders and
.npz files of another size feed the nets in `nets/` as they are, the Python API takes plain
values (a solver as a dict; the phase, Dropout and dtype of a net), and a bad `--set` value is
one line that says which value and why."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from superneuron.cli.plan import main as plan_main
from superneuron.cli.train import main
from superneuron.errors import SNError, SpecError
from superneuron.net import load_net
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "nets", "tiny.yaml")
LENET = os.path.join(ROOT, "nets", "lenet.yaml")


def losses(log):
    return [json.loads(line)["loss"] for line in open(log) if '"kind": "display"' in line]


def test_an_image_folder_feeds_an_input_net(tmp_path, capsys):
    """tiny.yaml declares `input:` 3x8x8; images of several sizes are resized to it."""
    rng = np.random.default_rng(0)
    for c, name in enumerate(("ant", "bee")):
        for i in range(6):
            os.makedirs(tmp_path / "imgs" / name, exist_ok=True)
            pixels = rng.integers(0, 256, (10 + i, 14 - i, 3)).astype(np.uint8)
            pixels[..., c] = 255
            Image.fromarray(pixels).save(tmp_path / "imgs" / name / f"{i}.png")
    assert main([TINY, "--data", str(tmp_path / "imgs"), "--iters", "3", "--display", "1"]) == 0
    out = capsys.readouterr().out
    assert f"data: {tmp_path / 'imgs'} (10 train, 2 test, sample 3x8x8)" in out


def test_an_image_folder_cannot_feed_a_non_square_input(tmp_path, capsys):
    (tmp_path / "net.yaml").write_text(
        "name: wide\ninput: {data: [2, 3, 4, 6], label: [2]}\nlayers:\n"
        "  - {name: ip, type: InnerProduct, bottom: data, top: ip, num_output: 2}\n"
        "  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}\n")
    os.makedirs(tmp_path / "imgs" / "a")
    Image.fromarray(np.zeros((5, 5, 3), np.uint8)).save(tmp_path / "imgs" / "a" / "0.png")
    assert main([str(tmp_path / "net.yaml"), "--data", str(tmp_path / "imgs")]) == 2
    err = capsys.readouterr().err
    assert "is made square, but the net's input 'data' is 4x6" in err and len(err.splitlines()) == 1


def digits_npz(path, side, channels=1, n=40, classes=10):
    rng = np.random.default_rng(1)
    np.savez(path, x=rng.random((n, channels, side, side)).astype(np.float32), y=np.arange(n) % classes)


def test_lenet_takes_28x28_samples_without_set_size(tmp_path, capsys):
    """LeNet's size parameter is 32 (digits upsampled, then 28x28 crops); an .npz of 28x28
    samples sets it to 28, exactly as `--set size=28` by hand does."""
    digits_npz(tmp_path / "m.npz", 28)
    common = [LENET, "--data", str(tmp_path / "m.npz"), "--iters", "3", "--display", "1", "--batch", "8"]
    assert main([*common, "--log", str(tmp_path / "auto.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "size parameter is set to 28 (it was 32" in out and "sample 1x28x28" in out
    assert main([*common, "--set", "size=28", "--log", str(tmp_path / "hand.jsonl")]) == 0
    assert "size parameter is set" not in capsys.readouterr().out
    assert losses(tmp_path / "auto.jsonl") == losses(tmp_path / "hand.jsonl") != []


def test_an_input_net_takes_the_size_of_npz_samples_unless_set(tmp_path, capsys):
    digits_npz(tmp_path / "x.npz", 12, channels=3, classes=5)
    assert main([TINY, "--data", str(tmp_path / "x.npz"), "--iters", "2"]) == 0
    assert "sample 3x12x12" in capsys.readouterr().out
    assert main([TINY, "--data", str(tmp_path / "x.npz"), "--iters", "2", "--set", "size=10"]) == 2
    assert "expects (3, 10, 10)" in capsys.readouterr().err  # what the user asked for is kept


def test_a_data_layer_of_fixed_size_takes_npz_samples_as_they_are(tmp_path, capsys):
    (tmp_path / "net.yaml").write_text(
        "name: d\nlayers:\n"
        "  - {name: data, type: Data, top: [data, label], source: digits, batch_size: 4, size: 16}\n"
        "  - {name: ip, type: InnerProduct, bottom: data, top: ip, num_output: 10}\n"
        "  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}\n")
    digits_npz(tmp_path / "m.npz", 10)
    assert main([str(tmp_path / "net.yaml"), "--data", str(tmp_path / "m.npz"), "--iters", "2"]) == 0
    assert "sample 1x10x10" in capsys.readouterr().out


@pytest.mark.parametrize("net, depth, message", [
    ("resnet_cifar.yaml", 21, "parameter 'depth_ok' (with --set depth=21): depth must be 6n+2 >= 8"),
    ("resnet.yaml", 21, "parameter 'depth_ok' (with --set depth=21): depth must be 18, 34, or 3n+2"),
])
def test_a_bad_depth_is_one_line_naming_the_value(capsys, net, depth, message):
    assert main([os.path.join(ROOT, "nets", net), "--set", f"depth={depth}"]) == 2
    err = capsys.readouterr().err
    assert message in err and "KeyError" not in err and len(err.splitlines()) == 1, err


def test_a_missing_key_in_a_parameter_says_which_keys_there_are(tmp_path, capsys):
    (tmp_path / "t.yaml").write_text(
        'name: t\nparams: {k: 3, m: "${ {1: 2, 2: 3}[k] }"}\ninput: {data: [2, 3, 4, 4], label: [2]}\n'
        'layers:\n  - {name: f, type: InnerProduct, bottom: data, top: f, num_output: "${m}"}\n')
    assert plan_main([str(tmp_path / "t.yaml"), "--set", "k=5"]) == 2
    err = capsys.readouterr().err
    assert "t.yaml:2:" in err and "(with --set k=5): 5 is not one of the keys (1, 2)" in err
    assert "KeyError" not in err and len(err.splitlines()) == 1


# -- the Python API --------------------------------------------------------------------------

def test_make_optimizer_takes_a_plain_dict():
    opt = make_optimizer({"type": "Adam", "base_lr": 0.001, "weight_decay": 0})
    assert opt.cfg == SolverConfig(type="Adam", base_lr=0.001, weight_decay=0)
    assert make_optimizer().cfg == SolverConfig()
    with pytest.raises(SpecError, match="unknown solver key 'tpye'; did you mean 'type'"):
        make_optimizer({"tpye": "Adam"})
    with pytest.raises(SNError, match="SolverConfig or a mapping"):
        make_optimizer("Adam")


def feed(net, seed=0):
    rng = np.random.default_rng(seed)
    return {"data": rng.random(net.input_shape("data")), "label": np.arange(4) % 5}


def test_load_net_phase_sets_what_forward_runs():
    x = feed(load_net(TINY))
    test_net, train_net = load_net(TINY), load_net(TINY, phase="train")
    assert test_net.forward(x) == test_net.forward(x, train=False)
    assert train_net.forward(x) == test_net.forward(x, train=True)
    assert train_net.forward(x)["loss"] != test_net.forward(x)["loss"]  # batch statistics, dropout
    with pytest.raises(SNError, match="phase must be 'TRAIN' or 'TEST'"):
        load_net(TINY, phase="VAL")


def test_load_net_dropout_overrides_the_phase():
    x = feed(load_net(TINY))

    def dropped(**kw):
        net = load_net(TINY, **kw)
        net.forward(x)
        before, after = net.blob("pool"), net.blob("drop")
        live = before != 0
        assert live.mean() > 0.5
        return np.count_nonzero(after[live] == 0) / live.sum(), before, after

    share, before, after = dropped(phase="TRAIN")
    assert 0.3 < share < 0.7 and np.allclose(after[after != 0], 2 * before[after != 0])
    share, before, after = dropped(phase="TRAIN", dropout=False)
    assert share == 0 and np.array_equal(after, before)
    assert dropped(phase="TEST")[0] == 0
    share, before, after = dropped(phase="TEST", dropout=True)  # Monte-Carlo dropout
    assert 0.3 < share < 0.7


def test_load_net_dtype():
    net = load_net(TINY, dtype="float64")
    assert net.param("ip/weight").dtype == np.float64
    net.forward_backward(feed(net))
    assert net.grad("ip/weight").dtype == np.float64 and net.blob("drop").dtype == np.float64
    for bad in ("int8", "float16", "floaty"):
        with pytest.raises(SNError, match="dtype must be one of float32, float64"):
            load_net(TINY, dtype=bad)
