"""tools/zoo_memory.py's figures are the planner's and the runtime's: one row of its table, on
FCN-8s at a small size, against planning.plan and a training step's measured peak."""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))
sys.path.insert(0, os.path.join(HERE, "caffe"))

import families  # noqa: E402
import zoo_memory  # noqa: E402

from superneuron.graph import Graph  # noqa: E402
from superneuron.net import Net  # noqa: E402
from superneuron.netfile.spec import prototxt_spec  # noqa: E402
from superneuron.planning import plan  # noqa: E402
from superneuron.train.optim import make_optimizer  # noqa: E402
from superneuron.train.solver_config import SolverConfig  # noqa: E402


def test_a_row_of_the_zoo_memory_table_is_the_planners_and_the_runs(tmp_path):
    text = families.fcn8s("input", size=24, batch=2, narrow=16)
    path = tmp_path / "fcn.prototxt"
    path.write_text(text)
    row = zoo_memory.net_row("FCN-8s small", str(path), "fcn.prototxt")
    spec = prototxt_spec(text, "fcn.prototxt")
    optimizer = make_optimizer(SolverConfig())  # sn-plan's default: SGD with momentum
    planned = plan(Graph(spec), "liveness", optimizer=optimizer)[1]
    assert row["liveness"]["peak_bytes"] == planned.peak_bytes
    assert row["baseline"]["peak_bytes"] > row["liveness"]["peak_bytes"] >= row["liveness"]["lower_bound_bytes"]
    opt = row["optimal"]
    assert opt["fits"] and opt["peak_bytes"] <= row["optimal_budget"]["bytes"]
    net = Net(spec, optimizer=make_optimizer(SolverConfig()), policy="liveness")
    rng = np.random.default_rng(0)
    label = rng.integers(0, 21, (2, 1, 24, 24)).astype(np.float32)
    label[:, :, :3] = 255
    net.train_step({"data": rng.standard_normal((2, 3, 24, 24)).astype(np.float32), "label": label}, 0)
    assert net.peak_bytes == planned.peak_bytes  # plan equals run
    assert "| FCN-8s small |" in zoo_memory.table([row])
