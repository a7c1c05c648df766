"""Memory tables of the model zoo's large-activation families: FCN-8s (voc-fcn8s, as
tests/caffe/families.py writes it, with Input layers of 500x500 images and label maps) at batch
1, 2 and 4, the coco_caption LSTM language model unrolled over 100 time steps of 100 streams
(its HDF5Data fed from a file made here), and with ``--more``, PSPNet-50 at 473x473 (its deploy
file with a per-pixel loss added), SegNet and SegNet-basic at CamVid's 360x480, batch 4 as
their files have it. Each figure is what

    sn-plan NET.prototxt --policy P [--memory B] [--data synthetic:CxHxW] --json

prints for one training iteration (SGD with momentum, sn-plan's default), run in this process
(``superneuron.cli.plan.main``) on the files this tool writes into a temporary folder. ``optimal``
is planned under a budget: superneurons' peak for that net (so the table says what optimal does
with the memory superneurons needs), or, when it does not fit there, liveness's peak.

    python tools/zoo_memory.py [--json benchmarks/zoo_memory.json] [--batches 1,2,4] [--steps 100]
"""

import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "caffe"))

import families  # noqa: E402

from superneuron.cli.plan import main as sn_plan_main  # noqa: E402
from superneuron.report import human_bytes  # noqa: E402

POLICIES = ("baseline", "liveness", "superneurons", "optimal")


def sn_plan(path, policy, budget=None, extra=()):
    """sn-plan's ``--json`` figures for ``path`` under ``policy`` (and ``--memory budget``)."""
    argv = [path, "--policy", policy, "--json", *extra] + (["--memory", str(budget)] if budget else [])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = sn_plan_main(argv)
    if status not in (0, 3):  # 3: planned, but it does not fit the budget
        sys.exit(f"sn-plan {' '.join(argv)}: exit status {status}")
    return json.loads(out.getvalue())


def net_row(name, path, file_name, extra=()):
    """Every policy's figures for one net; optimal's under the budget the module's doc says."""
    row = {"net": name, "command": " ".join(["sn-plan", file_name, "--policy P", *extra, "--json"])}
    for policy in POLICIES[:3]:
        row[policy] = sn_plan(path, policy, extra=extra)
    for source in ("superneurons", "liveness"):
        budget = row[source]["peak_bytes"]
        plan = sn_plan(path, "optimal", budget, extra)
        if plan["fits"]:
            break
    row["optimal"] = plan
    row["optimal_budget"] = {"bytes": budget, "from": f"the peak of {source}"}
    return row


def write_sentences(folder, steps, streams, vocab=8801):
    """One HDF5 file of ``steps`` x ``streams`` words and its list, for the LSTM's HDF5Data."""
    import h5py
    rng = np.random.default_rng(0)
    os.makedirs(os.path.join(folder, "train"), exist_ok=True)
    path = os.path.join(folder, "train", "chunk0.h5")
    with h5py.File(path, "w") as f:
        f["cont_sentence"] = (rng.random((steps, streams)) > 0.1).astype(np.float32)
        f["input_sentence"] = rng.integers(0, vocab, (steps, streams)).astype(np.float32)
        f["target_sentence"] = rng.integers(0, vocab, (steps, streams)).astype(np.float32)
    with open(os.path.join(folder, "train", "hdf5_chunk_list.txt"), "w") as f:
        f.write(path + "\n")


def table(rows):
    head = ["net", *POLICIES, "optimal's budget", "learnable"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["net"]] + [human_bytes(r[p]["peak_bytes"]) for p in POLICIES]
        cells += [f"{human_bytes(r['optimal_budget']['bytes'])} ({r['optimal_budget']['from']})",
                  f"{r['baseline']['learnable_params']:,}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write every figure to this file")
    ap.add_argument("--batches", default="1,2,4", help="FCN-8s batch sizes")
    ap.add_argument("--size", type=int, default=500, help="FCN-8s image side")
    ap.add_argument("--steps", type=int, default=100, help="LSTM time steps")
    ap.add_argument("--streams", type=int, default=100, help="LSTM streams (the file's batch)")
    ap.add_argument("--more", action="store_true", help="also PSPNet-50 at 473, SegNet and SegNet-basic at 360x480")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for batch in (int(b) for b in args.batches.split(",")):
            name = f"voc-fcn8s_{args.size}_b{batch}.prototxt"
            path = os.path.join(tmp, name)
            with open(path, "w") as f:
                f.write(families.fcn8s("input", args.size, batch))
            rows.append(net_row(f"FCN-8s {args.size}x{args.size}, batch {batch}", path, name))
        write_sentences(tmp, args.steps, args.streams)
        name = f"lstm_language_model_T{args.steps}.prototxt"
        path = os.path.join(tmp, name)
        with open(path, "w") as f:  # its TEST Accuracy as lrcn.prototxt writes it (families.py says why)
            f.write(families.lstm_language_model(tmp, steps=args.steps, accuracy_block="accuracy_param"))
        rows.append(net_row(f"LSTM LM, {args.steps} steps x {args.streams} streams", path, name))
        if args.more:
            path = os.path.join(tmp, "pspnet50_ADE20K_473.prototxt")
            with open(path, "w") as f:
                f.write(families.pspnet50(loss=True))
            rows.append(net_row("PSPNet-50 473x473, batch 1", path, "pspnet50_ADE20K_473.prototxt"))
            path = os.path.join(tmp, "segnet_train.prototxt")
            with open(path, "w") as f:
                f.write(families.segnet())
            rows.append(net_row("SegNet 360x480, batch 4", path, "segnet_train.prototxt",
                                ("--data", "synthetic:3x360x480")))
            path = os.path.join(tmp, "segnet_basic_train.prototxt")
            with open(path, "w") as f:
                f.write(families.segnet_basic())
            rows.append(net_row("SegNet-basic 360x480, batch 4", path, "segnet_basic_train.prototxt",
                                ("--data", "synthetic:3x360x480")))
    print(table(rows))
    if args.json:
        meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                "machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPUs".strip(),
                "command": "python tools/zoo_memory.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                "python": platform.python_version()}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
