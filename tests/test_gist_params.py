"""``gist+params`` (issue 15): parameter offload with the stashes kept encoded. The parameters,
their gradients and the optimiser state live on the host (params.py), and the feature maps kept
across the forward/backward turn are kept encoded on the device (encode.py).

Checked: the encodings are gist's, the device keeps gist's stash bytes and the resident
region of ``liveness+params``, the host holds what ``liveness+params`` puts there (the
encoded stashes stay on the device), plan equals run for device and host bytes, losses,
gradients and trained parameters are baseline's bit for bit on the nets the gist tests use,
and sn-plan, sn-train and the policy names take it."""

import glob
import json

import numpy as np
import pytest
from one_line import raises_one_line
from test_encode import RELU_POOL, _trained, encoded
from test_memory_passes import CHAIN, assert_same_results, check_copies, graph_of, tiny

from superneuron.errors import SNError
from superneuron.options import PlanOptions
from superneuron.scheduler.encode import summary
from superneuron.scheduler.lower import lower
from superneuron.scheduler.policy import apply_policy, passes_of
from superneuron.scheduler.simulate import simulate

GRAPHS = {"tiny": tiny, "chain": lambda: graph_of(CHAIN), "relu_pool": lambda: graph_of(RELU_POOL)}


@pytest.mark.parametrize("placement", ["dynamic", "planned"])
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_plan_equals_run_with_encodings_and_parameters_on_the_host(name, placement):
    g = GRAPHS[name]()
    s = apply_policy(lower(g), "gist+params", placement=placement)
    gist, params = (apply_policy(lower(g), p, placement=placement) for p in ("gist", "liveness+params"))
    assert encoded(s) and encoded(s) == encoded(gist)
    check_copies(s)  # every parameter is back and waited for before a step reads it
    runtime, plan = assert_same_results(g, s)[:2]
    assert (runtime.peak_bytes, runtime.arena_bytes) == (plan.peak_bytes, plan.arena_bytes)
    assert runtime.host_peak == plan.host_bytes > 0 and runtime.stalls == 0
    # the parameters left the device as under liveness+params; the stashes are gist's
    assert plan.resident_bytes == simulate(params).resident_bytes < simulate(gist).resident_bytes
    assert summary(s)["stash_bytes"] == summary(gist)["stash_bytes"] < summary(params)["stash_bytes"]
    assert plan.host_bytes == simulate(params).host_bytes
    assert plan.peak_bytes <= min(simulate(gist).peak_bytes, simulate(params).peak_bytes)


@pytest.mark.parametrize("path", sorted(glob.glob("tests/nets/*.yaml")))
def test_gist_params_trains_bit_for_bit_as_baseline_on_the_test_nets(path):
    """Two training iterations (momentum: the host optimiser's state matters) of every net in
    tests/nets: baseline's losses and weights bit for bit, the plan's device and host peaks
    those of the run, the stashes those of gist and the host bytes those of liveness+params."""
    base, base_losses = _trained(path, "baseline")
    net, losses = _trained(path, "gist+params")
    assert losses == base_losses and all(np.isfinite(base_losses))
    for name in base.param_names:
        np.testing.assert_array_equal(net.param(name), base.param(name), err_msg=name)
    plan = net.plans["train"]
    assert net.peak_bytes == plan.peak_bytes and net.runtime.host_peak == plan.host_bytes > 0
    gist, params = _trained(path, "gist")[0], _trained(path, "liveness+params")[0]
    assert summary(net.schedules["train"])["stash_bytes"] == summary(gist.schedules["train"])["stash_bytes"]
    assert plan.host_bytes == params.plans["train"].host_bytes
    assert plan.resident_bytes == params.plans["train"].resident_bytes
    assert plan.peak_bytes <= min(gist.plans["train"].peak_bytes, params.plans["train"].peak_bytes)


def test_sn_plan_and_sn_train_take_gist_params(capsys, tmp_path):
    from superneuron.cli.plan import main as plan_main
    from superneuron.cli.train import main as train_main
    net = "tests/nets/digits_bn.yaml"
    figures = {}
    for args in (["--policy", "gist+params"], ["--policy", "gist", "--offload-params"], ["--policy", "gist"],
                 ["--policy", "liveness+params"]):
        assert plan_main([net, "--json"] + args) == 0
        figures[" ".join(args)] = json.loads(capsys.readouterr().out)
    ours = figures["--policy gist+params"]
    assert ours["policy"] == "gist+params" and figures["--policy gist --offload-params"] == ours
    assert {t["codec"] for t in ours["encoded"]["tensors"]} == {"argmax", "sign"}
    assert ours["encoded"]["stash_bytes"] == figures["--policy gist"]["encoded"]["stash_bytes"]
    assert ours["host_bytes"] == figures["--policy liveness+params"]["host_bytes"] > 0
    assert ours["peak_bytes"] < figures["--policy gist"]["peak_bytes"]
    log = tmp_path / "run.jsonl"
    assert train_main([net, "--iters", "2", "--display", "1", "--test-interval", "0", "--policy", "gist+params",
                       "--log", str(log)]) == 0
    records = [json.loads(line) for line in open(log) if '"loss"' in line and "test_loss" not in line]
    assert records and records[-1]["peak_bytes"] == ours["peak_bytes"]


def test_the_policies_with_parameter_offload_name_gist_params():
    assert passes_of("gist", offload_params=True)[0].__name__ == "offload_params"
    with raises_one_line(SNError, match=r"with parameter offload: .*gist\+params"):
        PlanOptions.of("baseline+params")
