"""NaN and infinity never train in silence: in a net file, in solver values, in the data, and in
a loss that goes non-finite, each is a one-line error that says where."""

import numpy as np
import pytest
from one_line import cli_error, one_line, raises_one_line

from superneuron.cli.train import main
from superneuron.data import sources as data
from superneuron.data.batches import Loader
from superneuron.errors import SNError, SpecError
from superneuron.netfile.spec import loads_spec
from superneuron.train.solver_config import SolverConfig, load_solver
from tests.test_train import TINY, tiny_trainer

HEAD = """name: n
params: {big: 1.0e+308}
input: {data: [2, 3, 4, 4], label: [2]}
layers:
"""


@pytest.mark.parametrize("layer, key", [
    ("{name: c, type: Convolution, bottom: data, top: c, num_output: 2, kernel_size: 3, "
     "weight_filler: {type: gaussian, std: .nan}}", "'weight_filler': filler option 'std'"),
    ("{name: c, type: Convolution, bottom: data, top: c, num_output: 2, kernel_size: 3, "
     "bias_filler: {type: constant, value: -.inf}}", "'bias_filler': filler option 'value'"),
    ("{name: r, type: ReLU, bottom: data, top: r, negative_slope: .nan}", "'negative_slope'"),
    ("{name: r, type: ReLU, bottom: data, top: r, negative_slope: '${big * 10}'}", "'negative_slope'"),
    ("{name: ip, type: InnerProduct, bottom: data, top: ip, num_output: 2, lr_mult: [1, .inf]}", "'lr_mult'"),
    ("{name: ip, type: InnerProduct, bottom: data, top: ip, num_output: 2, decay_mult: .nan}", "'decay_mult'"),
    ("{name: l, type: SoftmaxWithLoss, bottom: [data, label], top: l, loss_weight: .inf}", "'loss_weight'"),
])
def test_non_finite_numbers_in_a_net_file_are_refused_at_their_line(layer, key):
    with raises_one_line(SpecError) as e:
        loads_spec(HEAD + "  - " + layer + "\n", "net.yaml")
    assert len(e.value.problems) == 1
    message = e.value.problems[0]
    assert message.startswith("net.yaml:5:") and key in message and "finite number, got" in message, message


def test_non_finite_solver_values_are_refused(tmp_path, capsys):
    with raises_one_line(SpecError, match="base_lr must be a finite number, got nan"):
        SolverConfig(base_lr=float("nan"))
    with raises_one_line(SpecError, match="clip_gradients must be a finite number, got inf"):
        SolverConfig(clip_gradients=float("inf"))
    (tmp_path / "s.yaml").write_text("base_lr: 0.1\nmomentum: .nan\n")
    with raises_one_line(SpecError, match=r"s.yaml:2: 'momentum': expected a finite number, got nan"):
        load_solver(tmp_path / "s.yaml")
    err = cli_error(capsys, main, [TINY, "--lr", "inf", "--iters", "1"])
    assert err == "error: 'base_lr': expected a finite number, got inf"


def nan_npz(tmp_path, key, index):
    rng = np.random.default_rng(0)
    arrays = {"x": rng.random((24, 3, 8, 8)).astype(np.float32), "y": np.arange(24) % 5,
              "x_test": rng.random((8, 3, 8, 8)).astype(np.float32), "y_test": np.arange(8) % 5}
    arrays[key][index, 1, 2, 3] = np.nan if key == "x_test" else np.inf
    np.savez(tmp_path / "d.npz", **arrays)
    return str(tmp_path / "d.npz")


@pytest.mark.parametrize("key, index", [("x_test", 6), ("x", 17)])
def test_non_finite_data_is_an_error_before_training(tmp_path, capsys, key, index):
    """(It used to train, and report "test accuracy 100.00 %".)"""
    path = nan_npz(tmp_path, key, index)
    code = main([TINY, "--data", path, "--iters", "2"])
    out, err = capsys.readouterr()
    of = 24 if key == "x" else 8
    assert code == 2 and one_line(err) == (f"error: {path}: '{key}' sample {index} (of {of}) holds a NaN "
                                           "or an infinity; data must be finite")
    assert "iter " not in out


def test_a_batch_made_non_finite_by_scaling_names_its_samples(tmp_path):
    x = np.ones((6, 1, 2, 2), np.float32)
    x[4] = 1e30
    np.savez(tmp_path / "big.npz", x=x, y=np.zeros(6, np.int64))
    train, _ = data.open_source(dict(data.DEFAULTS, source=str(tmp_path / "big.npz"), scale=1e10,
                                     test_fraction=0.0))
    loader = Loader(train, 3, shuffle=False)
    loader.next()  # samples 0..2 are fine
    with raises_one_line(SNError, match=r"big.npz \(train\): sample 4 is non-finite after scale, mean and std "
                                      r"\(batch of samples 3..5\)"):
        loader.next()
    with raises_one_line(SNError, match="scale must be finite"):
        data.open_source(dict(data.DEFAULTS, source=str(tmp_path / "big.npz"), scale=float("nan")))


def test_a_loss_gone_non_finite_names_the_iteration_and_the_first_layer(tmp_path):
    """An overflowing InnerProduct: the error names the iteration and layer 'ip' at its line in
    the net file (the layers before it are finite), and the update of that iteration was not
    applied, so the parameters are as they were."""
    t = tiny_trainer(tmp_path, 5)
    t.run()
    t.solver = t.solver.with_overrides(max_iter=8)
    t.net.set_param("ip/weight", np.full(t.net.param("ip/weight").shape, 3e38, np.float32))
    before = {n: t.net.param(n) for n in t.net.learnable_names}
    with raises_one_line(SNError) as e:
        t.run()
    line = next(i for i, text in enumerate(open(TINY), 1) if "name: ip," in text)
    assert str(e.value) == (f"loss is nan at iteration 5, first non-finite output at {TINY}:{line}: layer 'ip' "
                            "(InnerProduct); lower the learning rate (--lr) or check the data")
    assert t.iteration == 5
    for name, value in before.items():
        assert t.net.param(name).tobytes() == value.tobytes(), name


def test_a_diverging_run_stops_with_one_line(tmp_path, capsys):
    err = cli_error(capsys, main, [TINY, "--lr", "1e8", "--iters", "50", "--display", "0"])
    assert "at iteration" in err, err
    assert "first non-finite output at " in err or "is non-finite" in err, err
