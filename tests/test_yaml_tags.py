"""A YAML tag YAML's safe schema does not define is an error at its file, line and column, in a
net file, a solver file and a ``--set`` value alike: never executed, never silently dropped
(before, ``!!python/object/apply:...`` on a list left the list and planned under it)."""

import pytest
from one_line import cli_error

from superneuron.cli.plan import main as plan_main
from superneuron.errors import SpecError
from superneuron.netfile.spec import load_spec, parse_overrides
from superneuron.train.solver_config import load_solver

NET = """
name: t
input: {data: [2, 3, 4, 4], label: [2]}
layers:
  - {name: fc, type: InnerProduct, bottom: data, top: fc, num_output: 3}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
"""

HOSTILE = [  # (text put in place of the net's name, the tag as reported)
    ("!!python/object/apply:os.mkdir [{marker}]", "!!python/object/apply:os.mkdir"),
    ("!!python/object/new:str [x]", "!!python/object/new:str"),
    ("!!python/name:os.system ''", "!!python/name:os.system"),
    ("!!python/tuple [a, b]", "!!python/tuple"),
    ("!mytag t", "!mytag"),
    ("!mytag {a: 1}", "!mytag"),
    ("!<tag:example.com,2024:x> t", "tag:example.com,2024:x"),
    ("!!set {t: null}", "!!set"),
    ("!!omap [{t: 1}]", "!!omap"),
]


def position(text, needle):
    """``line:col`` (1-based) of ``needle``'s first occurrence in ``text``."""
    before = text[:text.index(needle)]
    return f"{before.count(chr(10)) + 1}:{len(before) - before.rfind(chr(10))}"


@pytest.mark.parametrize("value, tag", HOSTILE)
def test_a_tag_outside_the_safe_schema_in_a_net_file(value, tag, tmp_path):
    marker = tmp_path / "executed"
    text = NET.replace("name: t", "name: " + value.replace("{marker}", str(marker)), 1).lstrip()
    path = tmp_path / "net.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    [problem] = info.value.problems
    at = position(text, value.split()[0])
    assert problem.startswith(f"{path}:{at}: invalid YAML: tag '{tag}' is not allowed"), problem
    assert not marker.exists()


def test_a_tag_deep_inside_and_behind_an_alias(tmp_path):
    text = (NET.lstrip() + "solver: {base_lr: &lr !!float 0.1, lr_policy: fixed}\n"
            "x: &a [1, [2, !!python/bytes YQ==]]\ny: *a\n")
    path = tmp_path / "net.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.problems == [f"{path}:{position(text, '!!python/bytes')}: invalid YAML: tag "
                                   f"'!!python/bytes' is not allowed (only plain values, lists and mappings, "
                                   f"as YAML's safe schema reads them: no !!python/... or custom !tags)"]


def test_the_safe_schemas_own_tags_still_read(tmp_path):
    text = NET.replace("name: t", "name: !!str t").replace("num_output: 3", "num_output: !!int '3'")
    text = text.replace("layers:", "layers: !!seq").lstrip()
    path = tmp_path / "net.yaml"
    path.write_text(text)
    spec = load_spec(path)
    assert spec.name == "t" and spec.layers[1].cfg["num_output"] == 3


def test_sn_plan_says_it_in_one_line(tmp_path, capsys):
    path = tmp_path / "net.yaml"
    path.write_text(NET.replace("bottom: [fc, label]", "bottom: !!python/object/apply:os.getcwd [fc, label]").lstrip())
    line = cli_error(capsys, plan_main, [path])
    assert f"{path}:" in line and "tag '!!python/object/apply:os.getcwd' is not allowed" in line


def test_a_tag_in_a_solver_file(tmp_path):
    path = tmp_path / "solver.yaml"
    text = "base_lr: 0.1\nlr_policy: fixed\nstepvalue: !!python/object/apply:os.system [[echo]]\n"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_solver(str(path))
    assert str(info.value).startswith(f"{path}:3:12: invalid YAML: tag '!!python/object/apply:os.system'")
    path.write_text("base_lr: !foo 0.1\n")
    with pytest.raises(SpecError, match=r"solver.yaml:1:10: invalid YAML: tag '!foo' is not allowed"):
        load_solver(str(path))


def test_a_tag_in_a_set_value():
    with pytest.raises(SpecError, match=r"--set 'depth=!!python/tuple \[1\]': the value is not valid YAML "
                                        r"\(tag '!!python/tuple' is not allowed"):
        parse_overrides(["depth=!!python/tuple [1]"])
