"""Which of two suspects makes ResNet-18's weight gradients on the GPU differ from float64:
stale arena bytes, or cuDNN engines that are not exact float32 sums.

    python tools/grad_diag.py [--device gpu] [--net nets/resnet.yaml] [--json OUT.json]

The net test (tests/test_net.py: ResNet-18 at 64x64, batch 2, against PyTorch in float64)
runs several ways, each parameter's gradient error recorded (max |ours - float64|, relative
to the largest float64 value, the net test's measure):

- ``as_is``: the engines cuDNN ranks first, as every run uses;
- ``deterministic``: non-deterministic engines left out (``SN_DETERMINISTIC=1``); run twice,
  and the two runs compared bit for bit (``repeatable``);
- ``exact``: FFT, Winograd and reduced-precision engines left out (``SN_CUDNN_EXACT=1``);
- ``stale_nan``: as is, with the arena's scheduled region filled with NaN first: a kernel
  that reads bytes nothing wrote this iteration turns its gradient NaN.

The JSON is written after each way (a cut-off run keeps what finished), with a ``verdict``
naming the cause (:func:`verdict`).
"""

import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

MODES = {"as_is": {}, "exact": {"SN_CUDNN_EXACT": "1"}, "deterministic": {"SN_DETERMINISTIC": "1"},
         "stale_nan": {}}  # in the order they run: a cut-off run keeps the first
TOLERANCE = 1e-4  # tests/test_net.py's float32 tolerance for this net (F32_TOLERANCE)


def errors(net, feed, ref_grads):
    """``{parameter: max |ours - ref| / max(max |ref|, 1e-3)}`` after one forward-backward."""
    net.forward_backward(feed)
    out = {}
    for name in net.learnable_names:
        r, g = ref_grads[name], net.grad(name)
        out[name] = float(np.abs(g - r).max() / max(np.abs(r).max(), 1e-3))
    return out


def run_mode(mode, path, device, policy):
    """One way of running the net test: ``{errors, worst, convolutions[, repeatable]}``."""
    import torch
    from test_net import feed_for, small_net
    from torch_ref import run_torch
    saved = {k: os.environ.get(k) for k in ("SN_DETERMINISTIC", "SN_CUDNN_EXACT")}
    os.environ.update({"SN_DETERMINISTIC": "0", "SN_CUDNN_EXACT": "0", **MODES[mode]})
    try:
        net = small_net(path, device=device, policy=policy)
        feed = feed_for(net)
        _, ref_grads, _ = run_torch(net, feed, dtype=torch.float64)
        ref_grads = {k: v.detach().numpy() if hasattr(v, "detach") else np.asarray(v) for k, v in ref_grads.items()}
        if mode == "stale_nan":
            arena = net.runtime.arena
            arena.buffer[arena.resident_end:] = 0xFF  # every float32 there a NaN
        errs = errors(net, feed, ref_grads)
        out = {"policy": policy, "convolutions": net.backend.convolutions(), "errors": errs,
               "worst": max(errs.values()), "non_finite": sorted(k for k, v in errs.items() if not np.isfinite(v))}
        if mode == "deterministic":
            first = {n: net.grad(n).copy() for n in net.learnable_names}
            net.forward_backward(feed)
            out["repeatable"] = all(np.array_equal(first[n], net.grad(n)) for n in net.learnable_names)
        return out
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def verdict(result, tolerance=TOLERANCE):
    """One line naming the cause from the modes that ran: stale bytes when the NaN-filled
    arena turns a gradient NaN; the inexact engines when leaving out FFT/Winograd brings the
    error within float32 rounding; non-deterministic engines likewise; else what is left."""
    def worst(mode):
        r = result.get(mode)
        return None if r is None else r["worst"]
    stale = result.get("stale_nan")
    if stale is not None and (stale["non_finite"] or not np.isfinite(stale["worst"])):
        return f"stale arena bytes: {', '.join(stale['non_finite'][:5]) or 'a gradient'} read memory nothing wrote"
    as_is = worst("as_is")
    if as_is is None:
        return "not run"
    if as_is <= tolerance:
        off = sorted(k.split("@", 1)[1] for k, r in result.items()
                     if k.startswith("as_is@") and not r["worst"] <= tolerance)
        if off:
            return f"a policy's own error: {', '.join(off)} beyond {tolerance:g}, the plain run within it"
        return f"no error: every gradient within float32 rounding ({as_is:.2e} <= {tolerance:g})"
    for mode, cause in (("exact", "FFT, Winograd or reduced-precision engines"),
                        ("deterministic", "non-deterministic engines")):
        w = worst(mode)
        if w is not None and w <= tolerance:
            return f"{cause}: {as_is:.2e} as is, {w:.2e} without them"
    return f"neither suspect: {as_is:.2e} as is, and no filter brings it within {tolerance:g}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="gpu", choices=("cpu", "gpu"))
    ap.add_argument("--net", default="nets/resnet.yaml")
    ap.add_argument("--policy", default="liveness")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--also", default="recompute,superneurons,optimal",
                    help="policies run as is after the modes (the gradients under every policy)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    result = {"net": args.net, "device": args.device, "tolerance": TOLERANCE}
    runs = [(mode, mode, args.policy) for mode in args.modes.split(",")]
    runs += [(f"as_is@{p}", "as_is", p) for p in args.also.split(",") if p]
    for key, mode, policy in runs:
        result[key] = r = run_mode(mode, args.net, args.device, policy)
        result["verdict"] = verdict(result)
        print(f"{key:22s} worst {r['worst']:.3e}  {r['convolutions']}"
              + (f"  repeatable {r['repeatable']}" if "repeatable" in r else ""), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    print(result["verdict"])


if __name__ == "__main__":
    main()
