"""An empty or blank value of any option of any tool is an error naming the option and what it
takes (its choices, or the policies, data sources... its help lists), never the default
(``--policy ""`` meant baseline) and never a file named by spaces (``--trace " "`` wrote one)."""

import os

import pytest
from one_line import one_line

from superneuron.cli import convert, depth, make_lmdb, plan, train
from superneuron.scheduler.policy import POLICIES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "nets", "tiny.yaml")
TOOLS = {  # the tool, and a command line it accepts, to which one blank option is added
    "sn-plan": (plan, [TINY]),
    "sn-train": (train, [TINY, "--iters", "1"]),
    "sn-depth": (depth, [TINY, "--memory", "1GiB", "--batch", "2"]),
    "sn-convert": (convert, [os.path.join(ROOT, "tests", "caffe", "lenet_train_test.prototxt")]),
    "sn-make-lmdb": (make_lmdb, ["digits.npz", "out"]),
}


def cli_error(capsys, main, argv):
    """Run ``main(argv)``; assert exit status 2 (ours or argparse's) and one line on stderr."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    out, err = capsys.readouterr()
    assert code == 2, f"exit {code}\nstdout: {out}\nstderr: {err}"
    return one_line(err)


def options(tool):
    """Every option of ``tool`` that takes a value, with its argparse action."""
    module, _ = TOOLS[tool]
    return [(a.option_strings[-1], a) for a in module.build_parser()._actions
            if a.option_strings and a.nargs != 0 and a.option_strings[-1] != "--help"]


CASES = [(tool, opt, blank) for tool in TOOLS for opt, _ in options(tool) for blank in ("", "  ")]


@pytest.mark.parametrize("tool, option, blank", CASES)
def test_a_blank_value_of_any_option_is_one_line_naming_it(tool, option, blank, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written here, not even a file named "  "
    module, argv = TOOLS[tool]
    line = cli_error(capsys, module.main, argv + [option, blank])
    assert option in line, line
    action = dict(options(tool))[option]
    if action.choices:  # argparse's own "invalid choice", or ours: both list them
        assert all(str(c) in line for c in action.choices), line
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("tool", ["sn-plan", "sn-train"])
def test_an_empty_policy_lists_the_policies(tool, capsys):
    module, argv = TOOLS[tool]
    line = cli_error(capsys, module.main, argv + ["--policy", ""])
    assert line.startswith("error: --policy is empty; expected P (memory policy: ")
    assert all(p in line for p in POLICIES)


def test_an_empty_data_source_lists_the_sources(capsys):
    line = cli_error(capsys, train.main, [TINY, "--data", " "])
    assert line.startswith("error: --data is empty; expected SRC (data source: digits, synthetic, FILE.npz")


def test_an_empty_network_file(capsys):
    line = cli_error(capsys, plan.main, [""])
    assert line.startswith("error: NET.yaml is empty; expected NET.yaml (network file")
