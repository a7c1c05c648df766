"""The memory tables of benchmarks/README.md (which the README's headline figures link to) come
out of the commands printed beside them: for the fast rows (AlexNet), each `sn-plan` command
written there is run (`--json`) and every cell of the row in all three tables is compared with
what the file says."""

import contextlib
import importlib.util
import io
import json
import pathlib
import re

import pytest

from superneuron.cli.plan import main as sn_plan

ROOT = pathlib.Path(__file__).resolve().parent.parent
FAST = ("AlexNet",)


def plan_table_tool():
    spec = importlib.util.spec_from_file_location("plan_table", ROOT / "tools" / "plan_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def memory_section():
    text = (ROOT / "benchmarks" / "README.md").read_text()
    start = text.index("## Memory of one training iteration")
    return text[start:text.index("\n## ", start + 1)]


def readme_rows(section, net):
    """The cells of ``net``'s row in each table of ``section``, in order."""
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith(f"| {net} |")]


def run_sn_plan(argv, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert sn_plan([*argv, "--json"]) in (0, 3)
    return json.loads(out.getvalue())


@pytest.mark.parametrize("net", FAST)
def test_memory_tables_match_the_commands_they_print(net, monkeypatch):
    section = memory_section()
    found = re.search(rf"^- {re.escape(net)}: `(sn-plan [^`]*--policy P[^`]*)`$", section, re.M)
    assert found, f"no command for {net} in the memory section of benchmarks/README.md"
    tool = plan_table_tool()
    figures = {p: run_sn_plan(found.group(1).replace("--policy P", f"--policy {p}").split()[1:], monkeypatch)
               for p in tool.POLICIES}
    rows = readme_rows(section, net)
    assert len(rows) == 3, rows
    assert rows[0] == tool.placement_row(net, figures)
    assert rows[1] == tool.policy_row(net, figures)
    assert rows[2] == tool.time_row(net, figures)


def test_memory_section_states_the_arena_beside_the_peak():
    """The arena sn-train allocates is in the tables beside the peak, and the text's figure for
    how much larger it is on ResNet-50 is the table's."""
    section = memory_section()
    rows = readme_rows(section, "ResNet-50")
    headers = readme_rows(section, "net")[1]
    column = headers.index("superneurons arena (/ peak)")
    ratio = float(re.search(r"\((\d\.\d+)\)", rows[1][column]).group(1))
    assert ratio > 1.05
    text = " ".join(section.split())
    assert f"{100 * (ratio - 1):.1f} % on ResNet-50" in text and "larger than the peak" in text
