"""Caffe's HDF5Data, MemoryData and Filter layers: HDF5 files made here read back in Caffe's
order, nets fed by them trained with every policy giving baseline's bits, and Filter's gradient
by float64 finite differences."""

import builtins
import math

import numpy as np
import pytest
from layer_harness import backward, build, forward, gradcheck
from one_line import raises_one_line

from superneuron.data.hdf5_data import HDF5Batches
from superneuron.errors import LayerError, SNError, SpecError
from superneuron.graph import Graph
from superneuron.net import Net
from superneuron.netfile.spec import prototxt_spec
from superneuron.train.optim import make_optimizer
from superneuron.train.solver_config import SolverConfig

h5py = pytest.importorskip("h5py")


def write_h5(folder, rows_per_file, seed=0):
    """Files of ``rows_per_file`` rows each (data (r, 3, 2, 2), label (r,)) and their list; the
    rows hold their global index, so that the order read back says which row came."""
    paths, start = [], 0
    for i, rows in enumerate(rows_per_file):
        index = np.arange(start, start + rows, dtype=np.float32)
        path = folder / f"part{i}.h5"
        with h5py.File(path, "w") as f:
            f["data"] = index[:, None, None, None] * np.ones((1, 3, 2, 2), np.float32)
            f["label"] = index % 2
        paths.append(str(path))
        start += rows
    listing = folder / "list.txt"
    listing.write_text("\n".join(paths) + "\n")
    return str(listing)


def test_hdf5_batches_come_in_caffes_order_across_files_and_epochs(tmp_path):
    source = write_h5(tmp_path, [3, 2])
    batches = HDF5Batches(source, ["data", "label"], batch_size=4)
    rows = [batches.next()["data"][:, 0, 0, 0] for _ in range(3)]
    # files in order, a batch continued from the next file, the list read again after the last
    np.testing.assert_array_equal(np.concatenate(rows), [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1])
    shuffled = HDF5Batches(source, ["data", "label"], batch_size=5, shuffle=True, seed=3)
    epoch = shuffled.next()
    assert sorted(epoch["data"][:, 0, 0, 0]) == [0, 1, 2, 3, 4]  # each row once per epoch
    np.testing.assert_array_equal(epoch["label"], epoch["data"][:, 0, 0, 0] % 2)  # rows stay whole


NET = '''name: "h5net"
layer { name: "data" type: "HDF5Data" top: "data" top: "label"
        hdf5_data_param { source: "%s" batch_size: 4 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 2 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
'''


def _train(spec, feeds, policy):
    net = Net(spec, optimizer=make_optimizer(SolverConfig(base_lr=0.1)), policy=policy)
    return [net.train_step(feed, it) for it, feed in enumerate(feeds)], net.param("ip/weight")


def test_an_hdf5_net_plans_from_its_files_and_trains_alike_under_every_policy(tmp_path):
    source = write_h5(tmp_path, [3, 2])
    spec = prototxt_spec(NET % source, "h5net.prototxt")
    graph = Graph(spec)
    assert graph.tensors["data"].shape == (4, 3, 2, 2) and graph.tensors["label"].shape == (4,)
    reader = graph.node("data").layer.batches()
    feeds = [reader.next() for _ in range(3)]
    base_losses, base_w = _train(spec, feeds, "baseline")
    assert np.isfinite(base_losses).all()
    for policy in ("liveness", "superneurons"):
        losses, w = _train(spec, feeds, policy)
        assert losses == base_losses
        np.testing.assert_array_equal(w, base_w)


def test_hdf5_problems_are_one_line(tmp_path, monkeypatch):
    source = write_h5(tmp_path, [2])
    with raises_one_line(SpecError, match=r"h5net.prototxt:2:.*no dataset 'target'.*has: data, label"):
        Graph(prototxt_spec((NET % source).replace('top: "label"', 'top: "target"').replace(
            'bottom: "label"', 'bottom: "target"'), "h5net.prototxt"))
    with raises_one_line(SpecError, match="HDF5Data source .*missing.txt"):
        Graph(prototxt_spec(NET % (tmp_path / "missing.txt"), "h5net.prototxt"))
    real_import = builtins.__import__

    def no_h5py(name, *args, **kw):
        if name == "h5py":
            raise ImportError("no h5py here")
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_h5py)
    with raises_one_line(SpecError, match=r"HDF5Data needs h5py.*pip install h5py"):
        Graph(prototxt_spec(NET % source, "h5net.prototxt"))


def test_sn_train_says_in_one_line_that_an_hdf5_net_trains_from_python(tmp_path, capsys):
    from superneuron.cli.train import main
    net = tmp_path / "h5net.prototxt"
    net.write_text(NET % write_h5(tmp_path, [2]))
    assert main([str(net), "--iters", "1"]) != 0
    err = capsys.readouterr().err.strip()
    assert err.endswith("layer 'data' (HDF5Data): sn-train feeds Input and Data layers; train a HDF5Data "
                        "net from Python (Net.train_step with a feed of its tops)") and "\n" not in err


def test_memory_data_has_caffes_shapes_and_is_fed():
    text = '''name: "mem"
layer { name: "data" type: "MemoryData" top: "data" top: "label"
        memory_data_param { batch_size: 3 channels: 2 height: 4 width: 5 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 4 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
'''
    net = Net(prototxt_spec(text, "mem.prototxt"))
    assert net.input_names == ["data", "label"]
    assert net.input_shape("data") == (3, 2, 4, 5) and net.input_shape("label") == (3,)
    x = np.random.default_rng(0).standard_normal((3, 2, 4, 5)).astype(np.float32)
    loss = net.forward_backward({"data": x, "label": np.array([0, 3, 1], np.float32)})
    assert np.isfinite(loss)
    with raises_one_line(SNError, match="input 'data' should have shape"):
        net.forward_backward({"data": x[:2], "label": np.zeros(3, np.float32)})


def test_filter_keeps_the_selected_items_and_zeroes_the_rest_with_their_gradients():
    rng = np.random.default_rng(0)
    layer, params = build("Filter", [(5, 3, 2), (5, 4), (5, 1)], n_tops=2)
    x, z = rng.standard_normal((5, 3, 2)), rng.standard_normal((5, 4))
    selector = np.array([[1.0], [0.0], [2.0], [0.0], [1.0]])
    x[1] = np.inf  # an unselected item's value never reaches the top
    y, w = forward(layer, [x, z, selector], params)
    keep = np.array([1, 0, 1, 0, 1], bool)
    np.testing.assert_array_equal(y[keep], x[keep])
    np.testing.assert_array_equal(w[keep], z[keep])
    assert not y[~keep].any() and not w[~keep].any()
    x[1] = 0.5
    gradcheck(layer, [x, z, selector], params)
    dy, dw = rng.standard_normal(y.shape), rng.standard_normal(w.shape)
    (dx, dz, dsel), _ = backward(layer, [x, z, selector], [y, w], [dy, dw], params)
    np.testing.assert_array_equal(dx, np.where(keep[:, None, None], dy, 0))
    np.testing.assert_array_equal(dz, np.where(keep[:, None], dw, 0))
    assert dsel is None  # the selector is never differentiated, as in Caffe


@pytest.mark.parametrize("shapes,tops,message", [
    ([(5, 3), (5, 2)], 1, "one value per item"),
    ([(5, 3), (4,)], 1, "the selector's 4 items"),
    ([(5, 3), (5,)], 2, "need 1 top"),
])
def test_filter_errors(shapes, tops, message):
    with raises_one_line(LayerError, match=message):
        build("Filter", shapes, n_tops=tops)


def test_filter_in_a_net_trains_alike_under_every_policy():
    text = '''name: "filtered"
input: "data" input_shape { dim: 6 dim: 4 }
input: "sel" input_shape { dim: 6 }
input: "label" input_shape { dim: 6 }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1" inner_product_param { num_output: 5 } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "filter" type: "Filter" bottom: "ip1" bottom: "label" bottom: "sel" top: "kept" top: "kept_label" }
layer { name: "ip2" type: "InnerProduct" bottom: "kept" top: "ip2" inner_product_param { num_output: 3 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "kept_label" top: "loss" }
'''
    spec = prototxt_spec(text, "filtered.prototxt")
    rng = np.random.default_rng(1)
    feeds = [{"data": rng.standard_normal((6, 4)).astype(np.float32),
              "sel": np.array([1, 0, 1, 1, 0, 1], np.float32),
              "label": rng.integers(0, 3, 6).astype(np.float32)} for _ in range(3)]

    def run(policy):
        net = Net(spec, optimizer=make_optimizer(SolverConfig(base_lr=0.1)), policy=policy)
        return [net.train_step(f, it) for it, f in enumerate(feeds)], net.param("ip1/weight").copy()

    base, w = run("baseline")
    assert math.isfinite(base[0])
    for policy in ("liveness", "superneurons"):
        losses, w2 = run(policy)
        assert losses == base
        np.testing.assert_array_equal(w2, w)


def test_recurrent_embed_and_parameter_layers_read_from_a_prototxt():
    # recurrent_param, embed_param and parameter_param: BVLC's caffe.proto fields 146, 137, 145
    text = '''name: "rnn"
input: "x" input_shape { dim: 5 dim: 2 }
input: "cont" input_shape { dim: 5 dim: 2 }
layer { name: "embed" type: "Embed" bottom: "x" top: "e"
        embed_param { input_dim: 10 num_output: 4 bias_term: false
                      weight_filler { type: "uniform" min: -0.1 max: 0.1 } } }
layer { name: "rnn" type: "RNN" bottom: "e" bottom: "cont" top: "h"
        recurrent_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } debug_info: false } }
layer { name: "table" type: "Parameter" top: "table" parameter_param { shape { dim: 6 dim: 3 } } }
'''
    graph = Graph(prototxt_spec(text, "rnn.prototxt"))
    shapes = {t.name: t.shape for t in graph.tensors.values() if t.kind == "param"}
    assert shapes["embed/weight"] == (10, 4) and "embed/bias" not in shapes
    # Caffe's RNN blobs: W_xh (3, 4), b_h, W_hh, W_ho, b_o
    assert sum(math.prod(s) for n, s in shapes.items() if n.startswith("rnn/")) == 3 * 4 + 3 + 9 + 9 + 3
    assert shapes["table/weight"] == (6, 3) and graph.tensors["h"].shape == (5, 2, 3)
    with raises_one_line(SpecError, match="expose_hidden is not supported"):
        Graph(prototxt_spec(text.replace("debug_info: false", "expose_hidden: true"), "rnn.prototxt"))
