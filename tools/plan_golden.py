"""Golden outputs of the planner, to check that a refactoring changes no plan, byte for byte.

    python tools/plan_golden.py /tmp/golden-main            # capture
    python tools/plan_golden.py --compare /tmp/golden-main  # capture again and compare

For every net in ``nets/`` and ``tests/nets/`` (at their own sizes: planning runs no kernel),
every policy (each preset, and each with ``+params``), both placements and three budgets
(none; halfway between the lower bound and the liveness peak, where offload acts as a cache
and the workspace pass has to choose; half the lower bound, which does not fit), it keeps
``sn-plan --json`` and ``sn-plan --layers --steps`` (stdout and exit status); then an
``sn-depth`` scan of every policy (CPU cost model, a small budget), its timings left out.
The budgets are computed at capture and read back from the golden folder when comparing, so
both runs plan the same questions. ``--compare`` prints each file that differs with its
first differing line, and exits 1 if any does.
"""

import argparse
import contextlib
import glob
import io
import json
import os
import re
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from superneuron.cli import depth as depth_cli  # noqa: E402
from superneuron.cli import plan as plan_cli  # noqa: E402

PRESETS = ("baseline", "liveness", "recompute", "offload", "superneurons")
POLICIES = PRESETS + tuple(f"{p}+params" for p in PRESETS if p != "baseline")
PLACEMENTS = ("dynamic", "planned")
# (file, extra arguments): deep nets at a small depth, so the whole capture takes minutes
NETS = [("nets/lenet.yaml", []), ("nets/alexnet.yaml", []), ("nets/vgg16.yaml", []),
        ("nets/googlenet.yaml", []), ("nets/resnet.yaml", ["--set", "depth=50"]),
        ("nets/resnet_cifar.yaml", ["--set", "depth=20"])]
NETS += [(os.path.relpath(p, ROOT), []) for p in sorted(glob.glob(os.path.join(ROOT, "tests", "nets", "*.yaml")))]
DEPTH_ARGS = ["--memory", "300MiB", "--batch", "2", "--size", "64", "--host-memory", "1GiB",
              "--max-depth", "400", "--json"]
TIMING = re.compile(r"\(?\d+\.\d+ s\b\)?")  # wall times, which differ from run to run


def call(main, argv):
    """``(exit status, stdout, stderr)`` of a CLI's ``main(argv)`` run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def budgets_of(net, extra):
    """``{'none': None, 'mid': bytes, 'tiny': bytes}`` for a net (from its liveness plan)."""
    rc, out, _ = call(plan_cli.main, [net, *extra, "--policy", "liveness", "--json"])
    if rc != 0:
        return {"none": None}
    info = json.loads(out)
    low, peak = info["lower_bound_bytes"], info["peak_bytes"]
    return {"none": None, "mid": (low + peak) // 2, "tiny": low // 2}


def capture(folder, budgets=None):
    """Write every output into ``folder``; the budgets used (computed unless given)."""
    os.makedirs(folder, exist_ok=True)
    budgets = budgets or {}
    os.chdir(ROOT)
    for net, extra in NETS:
        name = os.path.splitext(os.path.basename(net))[0] + ("_" + "_".join(extra[1::2]) if extra else "")
        if net not in budgets:
            budgets[net] = budgets_of(net, extra)
        for policy in POLICIES:
            for placement in PLACEMENTS:
                for label, budget in budgets[net].items():
                    argv = [net, *extra, "--policy", policy, "--placement", placement]
                    if budget is not None:
                        argv += ["--memory", str(budget)]
                    base = os.path.join(folder, f"{name}__{policy}__{placement}__{label}")
                    rc, out, err = call(plan_cli.main, argv + ["--json"])
                    _write(base + ".json", f"rc {rc}\n{out}{err}")
                    rc, out, err = call(plan_cli.main, argv + ["--layers", "--steps"])
                    _write(base + ".txt", f"rc {rc}\n{out}{err}")
        print(f"  {name}", file=sys.stderr)
    rc, out, err = call(depth_cli.main, DEPTH_ARGS)
    data = json.loads(out)
    for key in [k for k in data if k == "seconds" or (k.endswith("_seconds") and k != "est_seconds")]:
        del data[key]
    _write(os.path.join(folder, "depth.json"), f"rc {rc}\n{json.dumps(data, indent=1)}\n{TIMING.sub('', err)}")
    with open(os.path.join(folder, "budgets.json"), "w") as f:
        json.dump(budgets, f, indent=1)
    return budgets


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def compare(golden):
    """Capture anew with ``golden``'s budgets and report every file that differs."""
    with open(os.path.join(golden, "budgets.json")) as f:
        budgets = json.load(f)
    fresh = tempfile.mkdtemp(prefix="plan-golden-")
    capture(fresh, budgets)
    names = sorted(set(os.listdir(golden)) | set(os.listdir(fresh)))
    differ = 0
    for name in names:
        a, b = os.path.join(golden, name), os.path.join(fresh, name)
        if not (os.path.exists(a) and os.path.exists(b)):
            print(f"{name}: only in {'golden' if os.path.exists(a) else 'the new capture'}")
            differ += 1
            continue
        with open(a) as f, open(b) as g:
            x, y = TIMING.sub("", f.read()), TIMING.sub("", g.read())
        if x != y:
            differ += 1
            lx, ly = x.splitlines(), y.splitlines()
            k = next((i for i, (p, q) in enumerate(zip(lx, ly)) if p != q), min(len(lx), len(ly)))
            print(f"{name}: line {k + 1}\n  golden: {lx[k] if k < len(lx) else '<end>'}\n"
                  f"  now:    {ly[k] if k < len(ly) else '<end>'}")
    print(f"{len(names)} files, {differ} differ (new capture in {fresh})")
    return 1 if differ else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", nargs="?", help="where to capture")
    p.add_argument("--compare", metavar="DIR", help="capture anew and compare with DIR")
    args = p.parse_args()
    if args.compare:
        return compare(args.compare)
    if not args.folder:
        p.error("give a folder to capture into, or --compare DIR")
    capture(args.folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
