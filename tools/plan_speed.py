"""Time one `sn-plan` command in two source trees side by side: the trees alternate in blocks
(A B, B A, A B, ...: neither always runs first, after the other's caches), each run a fresh
process, its wall and user+system CPU seconds measured; the medians, and whether both trees
print the same plan (stdout, byte for byte).

    python tools/plan_speed.py --trees /tmp/main-before /work/wt/mine --repeats 3 \\
        --json benchmarks/plan_speed.json -- nets/resnet.yaml --set depth=2498 --batch 16 \\
        --device gpu --policy superneurons

The net file is read from each tree (paths are relative to it), and each tree's own code
runs (PYTHONPATH=TREE).
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time


def run_once(tree, args):
    """``(wall seconds, CPU seconds, stdout)`` of one ``sn-plan args`` run in ``tree``."""
    env = dict(os.environ, PYTHONPATH=tree)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "superneuron.cli.plan", *args], cwd=tree, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"sn-plan failed in {tree}:\n{done.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def git_head(tree):
    """The commit ``tree`` is checked out at (with ``+dirty`` if it has changes)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=tree,
                           capture_output=True, text=True)
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trees", nargs=2, required=True, metavar=("A", "B"), help="two source trees")
    p.add_argument("--repeats", type=int, default=3, help="runs in each tree (default 3)")
    p.add_argument("--json", help="write the runs and medians here")
    p.add_argument("plan_args", nargs=argparse.REMAINDER, help="after --: sn-plan's arguments")
    args = p.parse_args()
    plan_args = args.plan_args[1:] if args.plan_args[:1] == ["--"] else args.plan_args
    trees = [os.path.abspath(t) for t in args.trees]
    runs = {t: [] for t in trees}
    outputs = {}
    for k in range(args.repeats):
        for tree in (trees if k % 2 == 0 else trees[::-1]):
            wall, cpu, out = run_once(tree, plan_args)
            runs[tree].append({"wall_s": round(wall, 2), "cpu_s": round(cpu, 2)})
            outputs.setdefault(tree, out)
            print(f"run {k + 1} {tree}: wall {wall:.1f} s, cpu {cpu:.1f} s", flush=True)
    result = {
        "command": "sn-plan " + " ".join(plan_args),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end",
        "same_output": outputs[trees[0]] == outputs[trees[1]],
        "trees": [{"tree": t, "commit": git_head(t), "runs": runs[t],
                   "median_wall_s": statistics.median(r["wall_s"] for r in runs[t]),
                   "median_cpu_s": statistics.median(r["cpu_s"] for r in runs[t])} for t in trees],
    }
    for t in result["trees"]:
        print(f"{t['commit']:>14}  median wall {t['median_wall_s']:.1f} s, "
              f"cpu {t['median_cpu_s']:.1f} s  ({t['tree']})")
    print("same plan printed" if result["same_output"] else "THE TREES PRINT DIFFERENT PLANS")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
