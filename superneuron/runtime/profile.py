"""Kernel timing: each distinct layer kernel of a graph timed once on a backend, and the
host↔device copy bandwidth, for the cost model (scheduler/cost.py reads the table; only the
runtime runs kernels). Tables are cached as JSON under cost.cache_dir()."""

import json
import os
import time

import numpy as np

from ..layers.base import Context, fill
from ..scheduler.cost import cache_path, cached_table, entries


def measure_costs(graph, backend, repeats=2, train=True):
    """``{key: seconds}``: each distinct (layer type, shapes, algorithm, phase) of ``graph``
    timed on ``backend`` (the best of ``repeats`` runs after one to warm up), on arrays of
    its own (measuring is done once, before any arena exists)."""
    rng = np.random.default_rng(0)
    table = {}
    for key, (layer, phase, algo) in entries(graph, train).items():
        run = _kernel(layer, phase, algo, backend, rng, train)
        best = float("inf")
        for k in range(repeats + 1):
            backend.synchronize()
            start = time.perf_counter()
            run()
            backend.synchronize()
            if k:  # the first run warms caches and compiles kernels
                best = min(best, time.perf_counter() - start)
        table[key] = best
    if train:
        table["copy"] = measure_copy_bandwidth(backend)
    return table


def measure_copy_bandwidth(backend, nbytes=32 << 20, repeats=3):
    """Bytes per second of a host→device copy of ``nbytes`` on ``backend`` (the best of
    ``repeats``); on the CPU, a copy between two blocks of memory, as the copy thread makes."""
    host = backend.host_bytes(nbytes)  # pinned on a GPU, as the offload's host arena
    host[...] = 1
    device = backend.xp.empty(nbytes, np.uint8)
    best = float("inf")
    for _ in range(repeats):
        backend.synchronize()
        start = time.perf_counter()
        backend.copy_from_host(device, host)
        backend.synchronize()
        best = min(best, time.perf_counter() - start)
    return nbytes / max(best, 1e-9)


def _kernel(layer, phase, algo, backend, rng, train):
    """A function running ``layer``'s ``phase`` with ``algo`` on arrays made for it (labels
    are zeros, a valid class; the backward's inputs come from one forward)."""
    xp = backend.xp

    def array(shape, label=False):
        host = np.zeros(shape, layer.dtype) if label else rng.standard_normal(shape).astype(layer.dtype)
        dev = xp.empty(shape, layer.dtype)
        backend.copy_from_host(dev, host)
        return dev

    def ctx(a):
        """A fresh Context per run (its scratch carving starts over) on one workspace."""
        ws = xp.empty(max(a.workspace, 1), np.uint8)
        return lambda: Context(xp, train=train, workspace=ws, algo=a.name, backend=backend)

    specs = layer.param_specs()
    bottoms = [array(s, i in layer.LABEL_BOTTOMS) for i, s in enumerate(layer.bottom_shapes)]
    tops = [array(s) for s in layer.top_shapes]
    params = {p.name: array(p.shape) for p in specs}
    for p in specs:  # fillers give state buffers (variances) sane values
        backend.copy_from_host(params[p.name], fill(rng, p.shape, p.filler, p.fan_in, p.fan_out, layer.dtype))
    if phase == "forward":
        fctx = ctx(algo)
        return lambda: layer.forward(fctx(), bottoms, tops, params)
    layer.forward(ctx(layer.algorithms("forward")[0])(), bottoms, tops, params)
    b_in, t_in = layer.backward_operands(bottoms, tops)
    top_grads = [array(s) for s in layer.top_shapes]
    bottom_grads = [None if i in layer.LABEL_BOTTOMS else array(s) for i, s in enumerate(layer.bottom_shapes)]
    param_grads = {p.name: array(p.shape) for p in specs if p.learnable}
    bctx = ctx(algo)
    return lambda: layer.backward(bctx(), b_in, t_in, top_grads, bottom_grads, params, param_grads)


def load_or_measure(graph, backend, device_name=None, train=True):
    """``(table, path, measured)``: the cached table of ``graph`` on this device, measuring
    and writing it (to a temporary file, then renamed) when there is none. ``device_name``
    (default: the backend's model, Backend.device_model) names the cache."""
    device_name = device_name or backend.device_model()
    path = cache_path(graph, device_name, train)
    table = cached_table(graph, device_name, train)
    if table is not None:
        return table, path, False
    table = measure_costs(graph, backend, train=train)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"device": device_name, "costs": table}, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return table, path, True
