"""The README's Python API example runs as written, its test command is the one CI runs, and its
first command trains with the base install alone (tests/test_install.py checks that it can)."""

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def python_example():
    """The README's Python example: the first ```python block of its "Python API" section."""
    text = (ROOT / "README.md").read_text()
    return re.search(r"## Python API\n.*?```python\n(.*?)```", text, re.S).group(1)


def test_python_api_example_runs_as_written_in_a_fresh_interpreter():
    # as a user runs it: nothing imported before (`superneuron.train.optim` must be reachable after
    # `import superneuron` alone), from the repository's folder
    done = subprocess.run([sys.executable, "-c", python_example()], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_python_api_example_runs(monkeypatch):
    block = python_example()
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
