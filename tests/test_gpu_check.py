"""The GPU check script (tools/gpu_check.sh) on the CPU, its commands replaced by a stub
(SN_CHECK_DRY_RUN): the stages run in their order, only the GPU test files are collected with a
per-test deadline, a stage cut at its limit keeps the JSON it had written, and no more than six
files are left; the per-test deadline plugin (tools/pytest_deadline.py) fails a test that runs
too long and goes on; tools/grad_diag.py's verdict names the cause from the ways it ran."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))

STUB = textwrap.dedent("""\
    import json, os, sys, time
    args = sys.argv[1:]
    with open(sys.argv[0] + ".calls", "a") as f:
        f.write(json.dumps(args + ["PYTHONPATH=" + os.environ.get("PYTHONPATH", "")]) + "\\n")
    def out(flag):
        for i, a in enumerate(args):
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
            if a == flag:
                return args[i + 1]
    if "pytest" in args:
        open(out("--junitxml"), "w").write('<testsuites><testsuite tests="3" failures="1" errors="0" '
                                           'skipped="1"></testsuite></testsuites>')
    elif "tools/bench_gpu.py" in args:
        json.dump({"nets": {"resnet50": {"liveness": 1.0}}}, open(out("--json"), "w"))
        time.sleep(60)  # the next net never ends: the stage is cut
    elif "superneuron.cli.depth" in args:
        print(json.dumps({"results": []}))
    else:
        json.dump({"done": args[0]}, open(out("--json"), "w"))
""")


def test_a_cut_stage_keeps_its_json_and_the_stages_run_in_order(tmp_path):
    stub = tmp_path / "stub.py"
    stub.write_text(STUB)
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), SN_CHECK_DRY_RUN="1", SN_CHECK_SECONDS="30",
               SN_CHECK_PYTHON=f"{sys.executable} {stub}")
    done = subprocess.run(["bash", "tools/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    log = (out / "log.txt").read_text()
    order = re.findall(r"^== (.+?) \(at most", log, re.M)
    assert order == ["GPU tests", "gradient diagnosis", "speed benchmark", "measured optimal table",
                     "sn-depth --verify"]
    assert re.search(r"== speed benchmark: exit 124 after \d+ s, cut at its limit", log)
    assert json.loads((out / "bench_gpu.json").read_text())["nets"]["resnet50"]  # written before the cut
    assert json.loads((out / "depth_verify.json").read_text()) == {"results": []}
    assert sorted(os.listdir(out)) == ["bench_gpu.json", "depth_verify.json", "gpu_tests.xml", "grad_diag.json",
                                       "log.txt", "optimal_measured.json"]
    calls = [json.loads(line) for line in (tmp_path / "stub.py.calls").read_text().splitlines()]
    pytest_args = calls[0]
    assert {"-m", "gpu", "--deadline", "-rfE", "--tb=short", "--durations=15"} <= set(pytest_args)
    assert "pytest_deadline" in pytest_args  # found in tools/, by its own name
    assert os.path.join(os.path.abspath(ROOT), "tools") in pytest_args[-1].split("=", 1)[1].split(":")
    files = [a for a in pytest_args if a.startswith("tests/")]
    assert "tests/test_gpu.py" in files and "tests/test_floors.py" not in files
    for f in files:
        assert "pytest.mark.gpu" in open(os.path.join(ROOT, f)).read()
    bench = calls[2]
    assert bench[bench.index("--gpu-tests-xml") + 1] == str(out / "gpu_tests.xml")


def test_the_deadline_fails_a_slow_test_and_the_run_goes_on(tmp_path):
    (tmp_path / "test_slow.py").write_text(textwrap.dedent("""\
        import time
        def test_slow():
            time.sleep(30)
        def test_quick():
            pass
    """))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "tools"))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                           "pytest_deadline", "--deadline", "1", str(tmp_path / "test_slow.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=25)
    assert "1 failed, 1 passed" in done.stdout, done.stdout
    assert "over the 1 s deadline" in done.stdout


def test_bench_reads_the_gpu_tests_counts(tmp_path):
    from bench_gpu import test_counts
    xml = tmp_path / "t.xml"
    xml.write_text('<testsuites><testsuite tests="10" failures="2" errors="1" skipped="3"/></testsuites>')
    assert test_counts(str(xml)) == {"passed": 4, "failed": 3, "skipped": 3}
    assert "missing" in test_counts(str(tmp_path / "none.xml"))


def _mode(worst, non_finite=()):
    return {"worst": worst, "non_finite": list(non_finite)}


@pytest.mark.parametrize("result, cause", [
    ({"as_is": _mode(0.03), "stale_nan": _mode(float("nan"), ["res2a/weight"])}, "stale arena bytes"),
    ({"as_is": _mode(0.03), "deterministic": _mode(0.03), "exact": _mode(2e-5), "stale_nan": _mode(0.03)},
     "FFT, Winograd or reduced-precision engines"),
    ({"as_is": _mode(0.03), "deterministic": _mode(3e-5), "exact": _mode(0.03)}, "non-deterministic engines"),
    ({"as_is": _mode(0.03), "deterministic": _mode(0.03), "exact": _mode(0.03)}, "neither suspect"),
    ({"as_is": _mode(2e-5), "as_is@recompute": _mode(3e-5)}, "no error"),
    ({"as_is": _mode(2e-5), "as_is@superneurons": _mode(0.03)}, "a policy's own error: superneurons"),
])
def test_the_diagnosis_names_the_cause(result, cause):
    from grad_diag import verdict
    assert verdict(result).startswith(cause)
