"""The transformer tables of benchmarks/README.md (GPT-2 small and ViT-B/16 on the H100 cost
model), for one source tree or several side by side: each cell is one `sn-plan ... --json`
run in a subprocess whose PYTHONPATH is that tree, so that two checkouts (before and after a
change) are planned by the same commands in one run. Budgets are ½, ⅓ and ¼ of each tree's
own liveness peak, as the issue states them.

    python tools/transformer_table.py [--tree DIR ...] [--nets gpt,vit] [--json FILE]
"""

import argparse
import json
import os
import subprocess
import sys

NETS = {
    "gpt": ("GPT-2 small", "nets/gpt.yaml",
            "--set layers=12 --set d_model=768 --set heads=12 --set seq=1024 --set batch=8"),
    "vit": ("ViT-B/16 at 224²", "nets/vit.yaml",
            "--set source=synthetic --set size=224 --set patch=16 --set layers=12 --set d_model=768 "
            "--set heads=12 --set classes=1000 --set batch=32"),
}
FRACTIONS = (("½", 2), ("⅓", 3), ("¼", 4))


def sn_plan(tree, path, sets, policy, memory=None):
    """sn-plan's --json figures for one cell, planned by the code in ``tree``; None where the
    plan does not fit (sn-plan's one-line error instead)."""
    argv = [sys.executable, "-m", "superneuron.cli.plan", path, *sets.split(), "--device", "gpu",
            "--policy", policy, "--json"]
    if memory is not None:
        argv += ["--memory", str(memory)]
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    figures = json.loads(done.stdout)
    return figures if figures.get("fits", True) else {"error": "does not fit", **figures}


def rows_of(tree, key):
    """The table's rows for net ``key`` planned by ``tree``: liveness, then optimal at each
    fraction of liveness's peak."""
    _, path, sets = NETS[key]
    live = sn_plan(tree, path, sets, "liveness")
    rows = [("liveness", "–", live)]
    for name, k in FRACTIONS:
        budget = live["peak_bytes"] // k
        rows.append((f"optimal {name}", budget, sn_plan(tree, path, sets, "optimal", budget)))
    return live, rows


def cell(figures, live):
    if "error" in figures:
        return f"{figures['error']} (lower bound {live['lower_bound_bytes']} B)"
    if figures is live:
        return (f"{figures['peak_bytes']} B, {figures['est_seconds'] * 1e3:.2f} ms "
                f"(lower bound {live['lower_bound_bytes']} B)")
    return (f"{figures['peak_bytes']} B, {figures['est_seconds'] * 1e3:.2f} ms, "
            f"x{figures['est_seconds'] / live['est_seconds']:.4f}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", action="append", help="a source tree (default: this one); repeatable")
    p.add_argument("--nets", default="gpt,vit")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    trees = args.tree or [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    out = {}
    for key in args.nets.split(","):
        title = NETS[key][0]
        tables = {tree: rows_of(tree, key) for tree in trees}
        out[key] = {tree: [(r, b, f) for r, b, f in rows] for tree, (_, rows) in tables.items()}
        print(f"\n{title}: peak, est. time (H100 model), x liveness; budgets: each tree's liveness peak / k")
        print("| policy | " + " | ".join(f"{t}: budget | {t}" for t in trees) + " |")
        print("|---|" + "---|---|" * len(trees))
        for i in range(1 + len(FRACTIONS)):
            cells = []
            for tree in trees:
                live, rows = tables[tree]
                name, budget, figures = rows[i]
                cells += [str(budget), cell(figures, live)]
            print(f"| {tables[trees[0]][1][i][0]} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
