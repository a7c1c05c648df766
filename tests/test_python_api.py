"""The Python API as a first door (issue 31): the same options value, defaults and checks as
the command-line tools, sizes as text, and ``superneuron.train.optim`` reachable after ``import
superneuron``."""

import os
import subprocess
import sys

import numpy as np
import pytest
from one_line import raises_one_line

import superneuron
from superneuron import planning
from superneuron.cli.common import options_from_args
from superneuron.cli.train import build_parser
from superneuron.errors import SNError
from superneuron.netfile.spec import load_spec
from superneuron.options import PlanOptions
from superneuron.sizes import parse_size

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "nets", "tiny.yaml")


def test_optim_is_reachable_after_import_superneuron():
    # a fresh interpreter: within the test session some other test may have imported it already
    code = ("import superneuron; "
            "print(superneuron.train.optim.make_optimizer({'type': 'Adam', 'base_lr': 0.001}).cfg.type)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Adam"


def test_memory_as_text_caps_the_arena_as_the_cli_reads_it():
    net = superneuron.load_net(TINY, memory="5MiB")
    assert net.options.budget == parse_size("5MiB") == 5 << 20
    assert net.arena_bytes == 5 << 20


def test_memory_without_a_policy_means_auto_as_sn_train_does():
    net = superneuron.load_net(TINY, memory="5MiB")
    assert net.policy == "auto"
    # the two doors build the same value: sn-train's flags and load_net's keywords
    assert options_from_args(build_parser().parse_args([TINY, "--memory", "5MiB"])) == net.options
    assert superneuron.load_net(TINY).policy == "baseline"  # no budget: every tensor all iteration


def test_the_doors_share_their_defaults():
    args = build_parser().parse_args([TINY])
    assert options_from_args(args) == PlanOptions() == superneuron.load_net(TINY).options


@pytest.mark.parametrize("keywords, message", [
    ({"memroy": "5MiB"}, "unknown option 'memroy'; did you mean 'memory'?"),
    ({"memory": "lots"}, "bad size 'lots'"),
    ({"memory": -1}, "must not be negative"),
    ({"policy": "lifeness"}, "unknown policy 'lifeness'; known: baseline, liveness"),
    ({"policy": "baseline+params"}, "not offered with baseline"),
    ({"placement": "static"}, "unknown placement 'static'; known: dynamic, planned"),
    ({"solver_seconds": 0}, "must be a number of seconds more than 0"),
    ({"memory": "5MiB", "budget": 1 << 20}, "not both"),
])
def test_bad_keywords_are_one_line_errors(keywords, message):
    with raises_one_line(SNError, match=message):
        superneuron.load_net(TINY, **keywords)


def test_the_options_value_is_taken_whole():
    spec = load_spec(TINY)
    options = PlanOptions.of("superneurons+params", placement="planned")
    assert (options.policy, options.offload_params) == ("superneurons", True)
    by_value = planning.plan(spec, options)[0]
    by_keywords = planning.plan(spec, "superneurons", offload_params=True, placement="planned")[0]
    assert by_value.policy == by_keywords.policy == "superneurons+params"
    assert [s.describe(by_value.graph) for s in by_value.steps] == \
        [s.describe(by_keywords.graph) for s in by_keywords.steps]
    net = superneuron.Net(spec, options)
    assert net.policy == "superneurons+params" and net.plans["train"].peak_bytes > 0


def test_a_net_planned_by_the_value_trains_as_one_planned_by_keywords():
    # policy invariance through both doors: the same losses, bit for bit
    feed = {"data": np.random.default_rng(0).standard_normal((4, 3, 8, 8)).astype(np.float32),
            "label": np.arange(4) % 5}
    losses = []
    for net in (superneuron.load_net(TINY, options=PlanOptions("gist", placement="planned"), dropout=False),
                superneuron.load_net(TINY, policy="baseline", dropout=False)):
        losses.append(net.forward_backward(feed))
    assert losses[0] == losses[1]
