"""The README's Python API example runs as written, its test command is the one CI runs, and its
first command trains with the base install alone (tests/test_install.py checks that it can)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_python_api_example_runs(monkeypatch):
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Python API\n\n```python\n(.*?)```", text, re.S).group(1)
    monkeypatch.chdir(ROOT)
    scope = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert scope["g"].shape == scope["net"].param("conv1/weight").shape
    assert scope["loss"] > 0 and "loss" in scope["scores"]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = "pip install -e '.[test]' && pytest -q -n auto"
    assert command in readme and command in ci
    assert "pip install -e . && sn-train nets/lenet.yaml" in readme  # no test extra to train
    assert "pip install -e '.[test]' && sn-train" not in readme
