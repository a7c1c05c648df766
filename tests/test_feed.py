"""feed.py on its own (sn-train's tests drive it through the CLI): which side a fixed-size
source gives a net's size parameter, the source fitted to an Input net, and the checks that
refuse a source the net cannot take."""

import numpy as np
import pytest

from superneuron.data.feed import data_config, fixed_side
from superneuron.errors import SNError
from superneuron.netfile.spec import load_spec

LENET = "nets/lenet.yaml"  # its size parameter is 32
TINY = "tests/nets/tiny.yaml"  # an Input net


def npz(path, side, channels=1, n=8):
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.random((n, channels, side, side)).astype(np.float32), y=np.arange(n) % 2)
    return str(path)


def test_a_fixed_size_source_gives_its_side_unless_the_size_was_given(tmp_path):
    spec = load_spec(LENET)
    assert spec.params["size"] == 32
    source = npz(tmp_path / "m.npz", 28)
    assert fixed_side(spec, source) == 28
    assert fixed_side(spec, source, size_given=True) is None
    assert fixed_side(spec, npz(tmp_path / "same.npz", 32)) is None  # already that size
    assert fixed_side(spec, "digits") is None and fixed_side(spec, None) is None  # resized sources


def test_an_input_net_gets_the_source_sized_to_its_input():
    spec = load_spec(TINY)
    shape = spec.layers[0].cfg["shape"][0]
    assert data_config(spec, None) is None  # synthetic data like the input, made once the net is
    cfg = data_config(spec, "synthetic")
    assert (cfg["batch_size"], cfg["size"], cfg["channels"]) == (shape[0], shape[2], shape[1])


def test_square_sources_refuse_a_wide_input(tmp_path):
    (tmp_path / "net.yaml").write_text(
        "name: wide\ninput: {data: [2, 3, 4, 6], label: [2]}\nlayers:\n"
        "  - {name: ip, type: InnerProduct, bottom: data, top: ip, num_output: 2}\n"
        "  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}\n")
    with pytest.raises(SNError, match="is made square, but the net's input 'data' is 4x6"):
        data_config(load_spec(str(tmp_path / "net.yaml")), "synthetic")
