"""superneuron against PyTorch on one GPU, side by side in one run.

    python tools/bench_gpu.py [--nets resnet50,resnet101,vgg16] [--batch 64] [--iters 20]
                              [--policies liveness,superneurons] [--tf32]
                              [--max-batch-budget 16GiB] [--depth-budget 12GiB]
                              [--cuda-graph liveness] [--json benchmarks/gpu_h100.json]

Speed: each net trains (SGD with momentum, synthetic data already on the device, 224x224)
under each policy and in PyTorch eager (torchvision's model, ``cudnn.benchmark = True``), after
warm-up iterations, timed with CUDA events; images per second, the peak device bytes (ours: the
arena's real peak; PyTorch: ``torch.cuda.max_memory_allocated``) and the ratios to PyTorch.
``--cuda-graph P,...``: those policies again with ``sn-train --cuda-graph`` (``P+cuda_graph``
in the JSON: its line, the iterations replayed, and its speed against P's, run just before).
Both run in the same math mode: full float32 (TF32 off in cuDNN and cuBLAS), or TF32 in both
with ``--tf32``.

Largest batch: ResNet-50's largest batch that trains in ``--max-batch-budget`` (ours by
bisection on plans, then one real iteration with the arena capped there; PyTorch by bisection
on real iterations under ``set_per_process_memory_fraction``).

Deepest ResNet: with ``--depth-budget``, the deepest bottleneck ResNet (stages 3, 8, n, 3) at
batch 16: ours from ``sn-depth``'s planner, then two real iterations with the arena capped at
the budget; PyTorch by bisection on real iterations under the same cap.

Link: first, the host link's bandwidth as the runtime's copies see it (``link`` in the JSON,
GB/s): host→device and device→host alone and each while the other runs, beside the cost
model's figure, which the plans that offload most depend on.
"""

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

NETS = {  # ours (file, --set) and torchvision's constructor
    "resnet50": ("nets/resnet.yaml", {"depth": 50}, "resnet50"),
    "resnet101": ("nets/resnet.yaml", {"depth": 101}, "resnet101"),
    "resnet152": ("nets/resnet.yaml", {"depth": 152}, "resnet152"),
    "vgg16": ("nets/vgg16.yaml", {}, "vgg16"),
}


def solver():
    from superneuron.train.optim import make_optimizer
    from superneuron.train.solver_config import SolverConfig
    return make_optimizer(SolverConfig(type="SGD", base_lr=0.01, momentum=0.9, weight_decay=5e-4))


def device_batch(batch, size, classes=1000, seed=0):
    import cupy
    rng = cupy.random.default_rng(seed)
    # the labels on the host, as a data source gives them: checked there when fed, so that the
    # loss layers read nothing back from the device (a batch of labels is 256 bytes to copy)
    return {"data": rng.standard_normal((batch, 3, size, size), dtype=cupy.float32),
            "label": cupy.asnumpy(rng.integers(0, classes, batch).astype(cupy.float32))}


def time_ours(net, feed, iters, warmup):
    """Seconds per training iteration of ``net`` (CUDA events), after ``warmup`` iterations."""
    import cupy
    for it in range(warmup):
        net.train_step(feed, it)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for it in range(iters):
        net.train_step(feed, warmup + it)
    end.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / 1e3 / iters


def ours(name, batch, policy, iters, warmup, size=224, **settings):
    """One net timed under ``policy``; ``settings``: Net's (``memory``, ``costs``, ``cuda_graph``)."""
    from superneuron.net import Net
    from superneuron.netfile.spec import load_spec
    path, overrides, _ = NETS[name]
    t0 = time.perf_counter()
    net = Net(load_spec(path, overrides=dict(overrides, size=size), batch=batch), device="gpu",
              policy=policy, optimizer=solver(), **settings)
    setup = time.perf_counter() - t0
    seconds = time_ours(net, device_batch(batch, size), iters, warmup)
    plan = net.plans["train"]
    algos = sorted({s.algorithm for s in net.schedules["train"].steps if s.algorithm})
    return {"policy": policy, "seconds": seconds, "images_per_second": batch / seconds,
            "peak_bytes": net.peak_bytes, "planned_peak_bytes": plan.peak_bytes,
            "arena_bytes": net.runtime.arena.capacity, "host_bytes": net.host_bytes,
            "stalls": net.runtime.stalls, "setup_seconds": setup, "algorithms": algos,
            # Waits whose copy had not finished (from the copies' events), over the timed runs
            "blocked": net.runtime.blocked, "syncs_inside": dict(net.runtime.syncs_inside or {}),
            "fused_update": bool(net.optimizer._fused), "fused_missing": net.optimizer.fused_missing,
            "outside_allocations": net.runtime.outside.count,
            "outside_bytes": net.runtime.outside.bytes,
            "cuda_graph": net.graph_line, "graph_replays": net.graphs.replays if net.graphs else 0}


def torch_model(name, depth_blocks=None):
    import torchvision
    if depth_blocks is not None:
        from torchvision.models.resnet import Bottleneck, ResNet
        return ResNet(Bottleneck, depth_blocks).cuda()
    return getattr(torchvision.models, NETS[name][2])().cuda()


def time_torch(model, batch, iters, warmup, size=224):
    import torch
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(batch, 3, size, size, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def pytorch(name, batch, iters, warmup):
    import torch
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = torch_model(name)
    seconds = time_torch(model, batch, iters, warmup)
    peak = torch.cuda.max_memory_allocated()
    del model
    torch.cuda.empty_cache()
    return {"seconds": seconds, "images_per_second": batch / seconds, "peak_bytes": peak}


def bisect(fits, lo, hi):
    """The largest n in [lo, hi] with ``fits(n)``, given ``fits(lo)``."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def torch_fits(make, batch, budget):
    import torch
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(budget / torch.cuda.get_device_properties(0).total_memory)
    model = None
    try:
        model = make()
        time_torch(model, batch, 1, 1)
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        model = None
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0)


def plan_fits(name, batch, policy, budget, kernels, overrides=None):
    from superneuron.graph import Graph
    from superneuron.netfile.spec import load_spec
    from superneuron.planning import plan
    path, base, _ = NETS[name]
    graph = Graph(load_spec(path, overrides=dict(overrides or base, size=224), batch=batch),
                  kernels=kernels)
    return plan(graph, policy, budget=budget, device="gpu", optimizer=solver())[1].arena_bytes <= budget


def max_batch(policies, budget, kernels):
    out = {}
    for policy in policies:
        b = bisect(lambda n, p=policy: plan_fits("resnet50", n, p, budget, kernels), 1, 4096)
        real = ours("resnet50", b, policy, iters=1, warmup=1, memory=budget)
        out[policy] = {"batch": b, "peak_bytes": real["peak_bytes"],
                       "planned_peak_bytes": real["planned_peak_bytes"]}
        print(f"  max batch, {policy}: {b} (real peak {real['peak_bytes'] / 2**30:.2f} GiB)", flush=True)
    b = bisect(lambda n: torch_fits(lambda: torch_model("resnet50"), n, budget), 1, 4096)
    out["pytorch"] = {"batch": b}
    print(f"  max batch, pytorch: {b}", flush=True)
    return out


def deepest(policies, budget, batch):
    """Deepest bottleneck ResNet (3, 8, n, 3) at ``batch`` in ``budget``: ours from
    ``sn-depth --verify --device gpu`` (planned, then two real iterations), PyTorch's by
    bisection on real iterations."""
    import subprocess
    cmd = ["sn-depth", "--memory", budget, "--batch", str(batch), "--policies", ",".join(policies),
           "--verify", "--device", "gpu", "--json"]
    print("  " + " ".join(cmd), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    out = {"sn_depth": json.loads(done.stdout) if done.returncode in (0, 3) else done.stderr}
    print(f"  sn-depth: {out['sn_depth']}", flush=True)
    n = bisect(lambda k: torch_fits(lambda: torch_model(None, [3, 8, k, 3]), batch, budget), 1, 2000)
    out["pytorch"] = {"depth": 3 * (3 + 8 + n + 3) + 2}
    print(f"  deepest, pytorch: depth {out['pytorch']['depth']}", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="resnet50,resnet101,vgg16")
    ap.add_argument("--policies", default="liveness,superneurons,superneurons@0.33",
                    help="policies to run; POLICY@F caps the arena at F times PyTorch's peak")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--tf32", action="store_true", help="TF32 convolutions in both (default: neither)")
    ap.add_argument("--max-batch-budget", default=None, help="e.g. 16GiB: ResNet-50's largest batch")
    ap.add_argument("--depth-budget", default=None, help="e.g. 12GiB: the deepest ResNet at batch 16")
    ap.add_argument("--measure", action="store_true",
                    help="time every layer's algorithms on this GPU first (sn-train --profile), "
                         "as cudnn.benchmark does for PyTorch")
    ap.add_argument("--cuda-graph", default="",
                    help="policies (of --policies, without @) to time again with --cuda-graph, e.g. liveness")
    ap.add_argument("--json", default=None)
    ap.add_argument("--gpu-tests-xml", default=None,
                    help="pytest's JUnit XML of the GPU tests: their counts go in as gpu_tests")
    args = ap.parse_args()
    os.environ["SN_TF32"] = "1" if args.tf32 else "0"
    import cupy
    import torch

    from superneuron.errors import SNError
    from superneuron.report import human_bytes, parse_size
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = args.tf32
    if args.tf32:
        os.environ["CUPY_TF32"] = "1"
    policies = args.policies.split(",")
    plain = [p for p in policies if "@" not in p]
    graphed = [p for p in args.cuda_graph.split(",") if p]
    result = {"device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
              "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "cupy": cupy.__version__, "python": platform.python_version(),
              "math": "tf32" if args.tf32 else "fp32", "batch": args.batch, "nets": {}}
    if args.gpu_tests_xml:
        result["gpu_tests"] = test_counts(args.gpu_tests_xml)
    print(f"{result['device']}, batch {args.batch}, {result['math']}", flush=True)
    result["link"] = link()
    save(args.json, result)
    for name in args.nets.split(","):
        row = {"pytorch": pytorch(name, args.batch, args.iters, args.warmup)}
        ref = row["pytorch"]
        print(f"{name:10s} pytorch      {ref['images_per_second']:7.1f} img/s  "
              f"peak {human_bytes(ref['peak_bytes'])}", flush=True)
        for policy in policies:
            base, _, share = policy.partition("@")  # superneurons@0.33: a third of PyTorch's peak
            memory = int(float(share) * ref["peak_bytes"]) if share else None
            try:
                r = ours(name, args.batch, base, args.iters, args.warmup, memory=memory,
                         costs="measure" if args.measure else None)
            except SNError as e:  # the budget is under the net's largest step
                row[policy] = {"policy": base, "memory_budget": memory, "fits": False, "why": str(e)}
                print(f"{name:10s} {policy:12s} does not fit: {e}", flush=True)
                continue
            r["memory_budget"] = memory
            r["speed_vs_pytorch"] = r["images_per_second"] / ref["images_per_second"]
            r["peak_vs_pytorch"] = r["peak_bytes"] / ref["peak_bytes"]
            row[policy] = r
            result["nets"][name] = row
            save(args.json, result)  # after each policy: a cut-off run keeps what it has
            print(f"{name:10s} {policy:12s} {r['images_per_second']:7.1f} img/s  peak "
                  f"{human_bytes(r['peak_bytes'])} (plan {human_bytes(r['planned_peak_bytes'])}) "
                  f"host {human_bytes(r['host_bytes'])}  x{r['speed_vs_pytorch']:.2f} speed, "
                  f"x{r['peak_vs_pytorch']:.2f} peak  stalls {r['stalls']}  outside "
                  f"{r['outside_allocations']} allocs / {human_bytes(r['outside_bytes'])}  "
                  f"setup {r['setup_seconds']:.1f}s", flush=True)
            if policy in graphed:  # the same again through a CUDA graph, right after it
                g = ours(name, args.batch, base, args.iters, args.warmup, cuda_graph=True,
                         costs="measure" if args.measure else None)
                g["speed_vs_pytorch"] = g["images_per_second"] / ref["images_per_second"]
                g["speed_vs_uncaptured"] = g["images_per_second"] / r["images_per_second"]
                row[policy + "+cuda_graph"] = g
                save(args.json, result)
                print(f"{name:10s} {policy + '+cuda_graph':12s} {g['images_per_second']:7.1f} img/s  "
                      f"x{g['speed_vs_uncaptured']:.2f} against {policy} without; {g['cuda_graph']}, "
                      f"{g['graph_replays']} replays", flush=True)
        result["nets"][name] = row
        save(args.json, result)
    if args.max_batch_budget:
        from superneuron.backend import get_backend
        kernels = get_backend("gpu").kernels()
        result["max_batch"] = {"budget": args.max_batch_budget,
                               **max_batch(plain, parse_size(args.max_batch_budget), kernels)}
        save(args.json, result)
    if args.depth_budget:
        result["deepest"] = {"budget": args.depth_budget,
                             **deepest(plain, args.depth_budget, 16)}
    save(args.json, result)


def link():
    """The host link as the runtime's copies see it (runtime/profile.py measure_link: pinned
    memory, the copy streams), 256 MiB each way alone and both at once, in GB/s, beside the
    H100 cost model's figure (``copy``), which the quarter-budget plans of issue 34 hinge on."""
    from superneuron.backend import get_backend
    from superneuron.runtime.profile import measure_link
    from superneuron.scheduler.cost import DEVICES
    rates = {k: round(v / 1e9, 2) for k, v in measure_link(get_backend("gpu"), 256 << 20, 5).items()}
    rates["model"] = DEVICES["gpu"].copy / 1e9
    print(f"link (GB/s): host->device {rates['h2d']}, device->host {rates['d2h']}, each while the "
          f"other runs {rates['both']}; the cost model counts {rates['model']}", flush=True)
    return rates


def test_counts(path):
    """``{passed, failed, skipped}`` from pytest's JUnit XML at ``path`` (errors count as
    failed), or ``{"missing": path}`` when it cannot be read."""
    import xml.etree.ElementTree as ET
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        return {"missing": f"{path}: {e}"}
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {k: sum(int(x.get(k, 0)) for x in suites) for k in ("tests", "failures", "errors", "skipped")}
    failed = total["failures"] + total["errors"]
    return {"passed": total["tests"] - failed - total["skipped"], "failed": failed, "skipped": total["skipped"]}


def save(path, result):
    """Write ``result`` as JSON to ``path`` (after each part, so a cut-off run keeps what it has)."""
    if path:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
