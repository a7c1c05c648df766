"""Plant a realistic bug, run the tests, and say whether they caught it.

    python tools/plants.py                 # every plant, each against the whole suite
    python tools/plants.py bn_stats_on_recompute -- tests/test_plan_equals_run.py

Each plant is a one-line edit of the source. The edit is made in a copy of the repository in a
temporary folder, never in this tree, so nothing can be left planted; pytest runs there with
``-x`` (the first failure is enough) and the tool prints CAUGHT with the first failing test, or
MISSED. An edit whose text is no longer in the source is reported as STALE (the code moved:
update the plant).
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name → (file, text to find, replacement, what the bug is)
PLANTS = {
    "snapshot_in_place": (
        "superneuron/train/snapshot.py", 'tmp = path + ".tmp"', "tmp = path",
        "a snapshot written in place: no temporary file, so a failed write destroys the last snapshot"),
    "liveness_frees_early": (
        "superneuron/scheduler/liveness.py", "ends.setdefault(b, []).append(r)",
        "ends.setdefault(max(a, b - 1), []).append(r)",
        "liveness frees each tensor one step before its last use"),
    "recompute_new_dropout_mask": (
        "superneuron/layers/activation.py", "mask = ctx.uniform(ctx.scratch(shape, self.dtype))",
        "mask = ctx.uniform(ctx.scratch(shape, self.dtype), salt=int(ctx.recompute))",
        "a recomputed Dropout draws a new mask"),
    "bn_stats_on_recompute": (
        "superneuron/layers/norm.py",
        "        if ctx.recompute:\n            self._normalize(ctx, x, y, params)",
        "        if False:\n            self._normalize(ctx, x, y, params)",
        "a recomputed BatchNorm runs its training forward again: its running statistics updated twice"),
    "workspace_ignores_live_bytes": (
        "superneuron/scheduler/workspace.py", "room = None if free_at is None else free_at - live[i]",
        "room = None if free_at is None else free_at",
        "the workspace choice ignores the bytes live at the step (only the budget)"),
    "copy_not_waited": (
        "superneuron/runtime/executor.py", "            runtime.blocked += 1\n        copy.wait()",
        "            runtime.blocked += 1", "a Wait step returns without waiting for its copy"),
    "dropout_scaled_wrong": (
        "superneuron/layers/activation.py", "mask *= 1.0 / (1.0 - p)", "mask *= 1.0 - p",
        "Dropout scales the kept units by 1-p instead of 1/(1-p)"),
    "dropout_unregistered": (
        "superneuron/layers/activation.py", "@register\nclass Dropout", "class Dropout",
        "the Dropout layer stops registering"),
}


def copy_tree(dst):
    ignore = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache")
    for name in ("superneuron", "tests", "nets", "tools", "benchmarks"):
        if os.path.isdir(os.path.join(ROOT, name)):
            shutil.copytree(os.path.join(ROOT, name), os.path.join(dst, name), ignore=ignore)
    for name in ("pyproject.toml", "setup.cfg", "README.md"):
        if os.path.exists(os.path.join(ROOT, name)):
            shutil.copy(os.path.join(ROOT, name), dst)


def run_plant(name, tests, workers):
    path, old, new, what = PLANTS[name]
    with tempfile.TemporaryDirectory(prefix=f"plant-{name}-") as tmp:
        copy_tree(tmp)
        target = os.path.join(tmp, path)
        text = open(target).read()
        if text.count(old) != 1:
            return "STALE", f"{path}: the text to replace is found {text.count(old)} times"
        with open(target, "w") as f:
            f.write(text.replace(old, new))
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--no-header", "-rf"]
        if workers:
            cmd += ["-n", str(workers)]
        env = dict(os.environ, PYTHONPATH=tmp)
        done = subprocess.run(cmd + tests, cwd=tmp, env=env, capture_output=True, text=True)
        failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
        if done.returncode == 0:
            return "MISSED", what
        return "CAUGHT", (failed[0] if failed else done.stdout.strip().splitlines()[-1]) + f"  ({what})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plants", nargs="*", help=f"plants to try (default: all): {', '.join(PLANTS)}")
    parser.add_argument("-n", "--workers", default="2", help="pytest-xdist workers (0: none)")
    parser.epilog = "Tests to run (default: all) go after --."
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    tests = argv[cut + 1:] or ["tests"]
    unknown = [p for p in args.plants if p not in PLANTS]
    if unknown:
        parser.error(f"unknown plant {', '.join(unknown)}; known: {', '.join(PLANTS)}")
    missed = 0
    for name in args.plants or PLANTS:
        verdict, detail = run_plant(name, tests, int(args.workers))
        missed += verdict != "CAUGHT"
        print(f"{verdict:7} {name}: {detail}", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
