"""A long training on the CPU, sampled as it goes: is memory flat, is time per iteration flat,
are the snapshot files bounded? Not run by CI (it takes hours at full length).

    nice -n 19 python tools/long_run.py --iters 20000 --minutes 45 --threads 1 \\
        --json benchmarks/long_run_cpu.json

Trains nets/resnet_cifar.yaml (depth 20 by default, small batch and image side) on synthetic
CIFAR-shaped data with SGD + momentum through the Trainer, as sn-train does, writing a snapshot
every ``--snapshot-minutes`` into a scratch folder that keeps ``--snapshot-keep`` of them. Every
``--every`` iterations it records the process's resident memory (VmRSS, /proc/self/status; the
high-water mark VmHWM beside it), the arena's real peak and size, the mean seconds of an
iteration over those iterations, the mean loss, and the count and bytes of the snapshot files
in the folder. The JSON is rewritten at each sample, so a run stopped early (``--minutes``, a
kill) leaves its curve; its ``summary`` compares the first sample after warm-up with the last.
``--versus-fresh N`` then times N blocks of iterations of the trained net beside a new one
built the same way in this process, alternated (trained, new, new, trained), and records the
median ratio of their times: 1.0 when nothing in the run slowed its iterations, whatever the
machine's load meanwhile (the wall clock alone cannot tell load from slowdown on a shared
machine). ``--plot FILE.png`` draws the curve (resident memory, the arena's peak, time per iteration and
the snapshot files against the iteration) at the end; ``--replot JSON --plot FILE.png`` draws
an earlier run's without training.
"""

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

NET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "nets", "resnet_cifar.yaml")


def proc_status_kib(field):
    """A ``kB`` field of /proc/self/status (VmRSS, VmHWM), or None where there is no /proc."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_bytes():
    """This process's resident memory now (the high-water mark where /proc is missing)."""
    kib = proc_status_kib("VmRSS")
    return kib * 1024 if kib is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def folder_files(folder):
    files = [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".npz")]
    return len(files), sum(os.path.getsize(f) for f in files)


def plot(record, png):
    """Draw ``record``'s samples into ``png``: four panels sharing the iteration axis."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = record["samples"]
    iters = [s["iter"] for s in samples]
    panels = [("resident memory (MiB)", [s["rss_bytes"] / 2**20 for s in samples]),
              ("arena peak (MiB)", [s["arena_peak_bytes"] / 2**20 for s in samples]),
              ("ms per iteration", [s["ms_per_iter"] for s in samples]),
              ("CPU ms per iteration", [s.get("cpu_ms_per_iter", float("nan")) for s in samples]),
              ("snapshot files", [s["snapshot_files"] for s in samples])]
    fig, axes = plt.subplots(len(panels), 1, sharex=True, figsize=(7, 9.5))
    for ax, (label, values) in zip(axes, panels):
        ax.plot(iters, values, marker=".", linewidth=1)
        ax.set_ylabel(label, fontsize=8)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("iteration")
    axes[0].set_title(f"{record['net']}, {record['date']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def versus_fresh(trained, args, blocks, iters):
    """``{ratio_cpu, ratio_wall, ...}``: ``blocks`` blocks of ``iters`` iterations of the
    ``trained`` Trainer's net against a new one's, in the order trained, new, new, trained, each
    block's CPU and wall seconds; the ratios are trained / new, their medians over the blocks."""
    import statistics

    folder = tempfile.mkdtemp(prefix="sn-long-run-fresh-")
    try:
        fresh = build(args, folder)

        def block(trainer, n):
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(n):
                x, y = trainer.train_loader.next()
                trainer.net.train_step({trainer.inputs[0]: x, trainer.inputs[1]: y}, trainer.iteration)
                trainer.iteration += 1
            return time.process_time() - cpu, time.perf_counter() - wall

        block(fresh, 5)  # its first iterations plan, allocate and warm up
        ratios_cpu, ratios_wall = [], []
        for _ in range(blocks):
            a1, b1, b2, a2 = block(trained, iters), block(fresh, iters), block(fresh, iters), block(trained, iters)
            ratios_cpu.append((a1[0] + a2[0]) / (b1[0] + b2[0]))
            ratios_wall.append((a1[1] + a2[1]) / (b1[1] + b2[1]))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"blocks": blocks, "iters_per_block": iters, "order": "trained, new, new, trained",
            "ratio_cpu_median": round(statistics.median(ratios_cpu), 4),
            "ratio_wall_median": round(statistics.median(ratios_wall), 4),
            "ratios_cpu": [round(r, 4) for r in ratios_cpu], "ratios_wall": [round(r, 4) for r in ratios_wall]}


def build(args, folder):
    from superneuron.data.batches import Loader
    from superneuron.data.sources import open_source, source_config
    from superneuron.layers import parallel
    from superneuron.net import load_net
    from superneuron.train.optim import make_optimizer
    from superneuron.train.solver_config import SolverConfig
    from superneuron.train.trainer import Trainer

    parallel.set_threads(args.threads)
    solver = SolverConfig(type="SGD", base_lr=0.05, momentum=0.9, weight_decay=1e-4, max_iter=args.iters,
                          display=0, snapshot=0, lr_policy="step", stepsize=max(1, args.iters // 3), gamma=0.1)
    net = load_net(NET, overrides={"depth": args.depth, "size": args.size}, batch=args.batch,
                   optimizer=make_optimizer(solver), seed=0, phase="TRAIN", policy=args.policy)
    cfg = source_config("synthetic", {"batch_size": args.batch})
    cfg.update(channels=3, size=args.size, classes=10, samples=args.samples)
    train_set, _ = open_source(cfg)
    loader = Loader(train_set, args.batch, shuffle=True, seed=0)
    trainer = Trainer(net, solver, loader, None, snapshot_dir=folder)
    trainer.snapshot_keep = args.snapshot_keep
    return trainer


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--minutes", type=float, default=0, help="stop after this long (0: run all --iters)")
    p.add_argument("--depth", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=16, help="image side")
    p.add_argument("--samples", type=int, default=2048, help="synthetic training samples")
    p.add_argument("--policy", default="liveness")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--every", type=int, default=100, help="sample every N iterations")
    p.add_argument("--snapshot-minutes", type=float, default=3.0)
    p.add_argument("--snapshot-keep", type=int, default=3)
    p.add_argument("--json", default="benchmarks/long_run_cpu.json")
    p.add_argument("--versus-fresh", type=int, default=0, metavar="N",
                   help="at the end, N alternated blocks of the trained net against a new one")
    p.add_argument("--block-iters", type=int, default=50, help="iterations a --versus-fresh block")
    p.add_argument("--plot", metavar="PNG", help="draw the curve into this file at the end")
    p.add_argument("--replot", metavar="JSON", help="draw an earlier run's JSON (with --plot) and stop")
    args = p.parse_args(argv)
    if args.replot:
        if not args.plot:
            p.error("--replot needs --plot PNG")
        with open(args.replot) as f:
            plot(json.load(f), args.plot)
        return

    folder = tempfile.mkdtemp(prefix="sn-long-run-")
    trainer = build(args, folder)
    net = trainer.net
    samples, window = [], {"seconds": 0.0, "loss": 0.0, "n": 0, "cpu": time.process_time()}
    state = {"last_snapshot": time.monotonic(), "snapshots": 0}
    started = time.monotonic()
    record = {
        "command": "python tools/long_run.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared), {platform.python_version()}",
        "net": f"resnet{args.depth}_cifar, batch {args.batch}, {args.size}x{args.size}, policy {net.policy}",
        "threads": args.threads, "snapshot_minutes": args.snapshot_minutes, "snapshot_keep": args.snapshot_keep,
        "samples": samples,
    }

    def save():
        if len(samples) >= 3:
            warm, last = samples[1], samples[-1]  # the first window holds the warm-up iteration
            record["summary"] = {
                "iterations": last["iter"], "minutes": round(last["minutes"], 1),
                "rss_growth_after_warmup_MiB": round((last["rss_bytes"] - warm["rss_bytes"]) / 2**20, 2),
                "arena_peak_change_bytes": last["arena_peak_bytes"] - warm["arena_peak_bytes"],
                "ms_per_iter_first_last": [warm["ms_per_iter"], last["ms_per_iter"]],
                "cpu_ms_per_iter_first_last": [warm.get("cpu_ms_per_iter"), last.get("cpu_ms_per_iter")],
                "max_snapshot_files": max(s["snapshot_files"] for s in samples),
                "snapshots_written": state["snapshots"],
            }
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(record, f, indent=1)
        os.replace(tmp, args.json)

    def on_event(event):
        if event["kind"] != "iter":
            return
        window["seconds"] += event["seconds"]
        window["loss"] += event["loss"]
        window["n"] += 1
        now = time.monotonic()
        if now - state["last_snapshot"] >= args.snapshot_minutes * 60:
            trainer.snapshot()
            state["snapshots"] += 1
            state["last_snapshot"] = now
        if event["iter"] % args.every == 0:
            files, nbytes = folder_files(folder)
            samples.append({
                "iter": event["iter"], "minutes": round((now - started) / 60, 2),
                "rss_bytes": rss_bytes(), "rss_hwm_bytes": (proc_status_kib("VmHWM") or 0) * 1024,
                "arena_peak_bytes": net.peak_bytes, "arena_bytes": net.arena_bytes,
                "ms_per_iter": round(1000 * window["seconds"] / window["n"], 2),
                # the process's CPU time (snapshots included): on a shared machine the wall
                # clock follows the others' load, this follows this process's work
                "cpu_ms_per_iter": round(1000 * (time.process_time() - window["cpu"]) / window["n"], 2),
                "loss": round(window["loss"] / window["n"], 4),
                "snapshot_files": files, "snapshot_bytes": nbytes})
            window.update(seconds=0.0, loss=0.0, n=0, cpu=time.process_time())
            print(json.dumps(samples[-1]), flush=True)
            save()
        if args.minutes and now - started >= args.minutes * 60:
            raise KeyboardInterrupt  # the trainer snapshots and returns, as on Ctrl-C

    try:
        trainer.run(on_event)
        if args.versus_fresh:
            record["versus_fresh"] = versus_fresh(trainer, args, args.versus_fresh, args.block_iters)
            print(json.dumps(record["versus_fresh"]), flush=True)
    finally:
        save()
        shutil.rmtree(folder, ignore_errors=True)
        if args.plot and samples:
            plot(record, args.plot)
    print(json.dumps(record.get("summary", {})))


if __name__ == "__main__":
    main()
