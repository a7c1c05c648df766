"""Kernel timing: each distinct layer kernel of a graph timed once on a backend, and the
host↔device copy bandwidth, for the cost model (scheduler/cost.py reads the table; only the
runtime runs kernels). Where a layer offers a choice of algorithms, each is also checked once
against the layer's reference algorithm run in float64 on the host, on the same inputs; one
whose error is beyond float32 rounding is rejected (the cost model never offers it). Tables
and their checks are cached as JSON under cost.cache_dir()."""

import collections
import json
import math
import os
import time

import numpy as np

from ..layers.base import Context
from ..layers.fillers import fill
from ..scheduler.cost import CACHE_FORMAT, cache_path, cached, entries, rejections, table_of
from .copies import copies_for

# How far from float64 an algorithm may be: max |error| / max |exact| over each output
# (:func:`relative_error`), the worst output. tests/test_gpu.py holds every cuDNN engine to
# FLOOR (TF32 misses by about 1e-3, a wrong engine by percents); tests/test_winograd.py holds
# Winograd to a multiple of im2col's own float32 rounding (F(4x4, 3x3), the loosest: ROUNDING
# times), which grows with the size of the sums. An algorithm passes within the larger of
# FLOOR and ROUNDING times the reference algorithm's own float32 error on the same inputs.
FLOOR = 2e-5
ROUNDING = 15.0

Profile = collections.namedtuple("Profile", "table path measured rejected")
Profile.__doc__ = """What :func:`load_or_measure` gives: the measured ``table`` (cost.table_of),
the cache file's ``path``, whether it was ``measured`` now (else read), and the algorithms
``rejected`` by the float64 check: ``[(layer name, algorithm, phase, error, tolerance)]``."""


def measure_costs(graph, backend, repeats=2, train=True):
    """``{key: seconds}``: each distinct (layer type, shapes, algorithm, phase) of ``graph``
    timed on ``backend`` (the best of ``repeats`` runs after one to warm up), on arrays of
    its own (measuring is done once, before any arena exists)."""
    rng = np.random.default_rng(0)
    table = {}
    for key, (layer, phase, algo) in entries(graph, train).items():
        run = _Operands(layer, phase, backend, rng, train).runner(algo)
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


def check_algorithms(graph, backend, train=True):
    """``{key: (error, tolerance)}`` for each algorithm of every layer phase of ``graph`` with
    a choice of algorithms: run once on ``backend`` on random inputs, its outputs (tops; the
    gradients of a backward) against the layer's reference algorithm run in float64 on the
    host with NumPy on the same inputs (:func:`relative_error`; tolerance: see FLOOR). A layer
    that draws random numbers (Dropout) is not checked."""
    rng = np.random.default_rng(1)
    groups = {}  # (layer, phase) → [(key, algo)]: a layer's algorithms share its inputs
    for key, (layer, phase, algo) in entries(graph, train).items():
        groups.setdefault((layer, phase), []).append((key, algo))
    out = {}
    for (layer, phase), algos in groups.items():
        if len(algos) < 2 or layer.draws(train):
            continue
        ops = _Operands(layer, phase, backend, rng, train)
        exact = ops.reference(np.float64)
        errors = {key: worst_error(ops.outputs(algo), exact) for key, algo in algos}
        tolerance = FLOOR
        if not max(errors.values()) <= FLOOR:  # the reference's own rounding here, then
            tolerance = max(FLOOR, ROUNDING * worst_error(ops.reference(layer.dtype), exact))
        out.update((key, (error, tolerance)) for key, error in errors.items())
    return out


def relative_error(got, exact):
    """max |got - exact| / max |exact| (infinite where ``got`` is not finite; the absolute
    error where ``exact`` is all zeros)."""
    if exact.size == 0:
        return 0.0
    error = float(np.abs(got.astype(np.float64) - exact).max())
    scale = float(np.abs(exact).max())
    if error != error:  # NaN: an output the algorithm did not write
        return math.inf
    return error / scale if scale else error


def worst_error(outputs, exact):
    """The largest :func:`relative_error` of ``outputs`` against ``exact`` (lists, in order)."""
    return max((relative_error(g, e) for g, e in zip(outputs, exact, strict=True)), default=0.0)


def measure_copy_bandwidth(backend, nbytes=32 << 20, repeats=3):
    """Bytes per second the cost model counts for one host↔device copy (``copy``, either
    direction): the slower direction of :func:`measure_link`."""
    link = measure_link(backend, nbytes, repeats, both=False)
    return min(link["h2d"], link["d2h"])


def measure_link(backend, nbytes=32 << 20, repeats=3, both=True):
    """``{"h2d", "d2h", "both"}``: bytes per second of the runtime's own copies (copies_for:
    CUDA streams between the device and pinned host memory on a GPU, the copy threads on the
    CPU) of ``nbytes``, host→device alone, device→host alone, and (where ``both``) each
    direction while the other runs (the slower of the two), the best of ``repeats``."""
    copies = copies_for(backend)
    host, device = backend.host_bytes(2 * nbytes), backend.empty_bytes(2 * nbytes)
    host[...] = 1
    halves = {"h2d": (device[:nbytes], host[:nbytes]), "d2h": (host[nbytes:], device[nbytes:])}

    def rate(directions):
        best = float("inf")
        for _ in range(repeats):
            backend.synchronize()
            start = time.perf_counter()
            started = [copies.start(*halves[d], d) for d in directions]
            for copy in started:
                copy.sync()
            best = min(best, time.perf_counter() - start)
        return nbytes / max(best, 1e-9)
    try:
        link = {"h2d": rate(("h2d",)), "d2h": rate(("d2h",))}
        if both:
            link["both"] = rate(("h2d", "d2h"))
        return link
    finally:
        copies.close()


class _Operands:
    """The arrays ``layer``'s ``phase`` runs on, made on ``backend`` (random values; labels
    are zeros, a valid class; the backward's inputs come from one forward with the default
    algorithm), and host copies of its inputs for a reference run."""

    def __init__(self, layer, phase, backend, rng, train):
        self.layer, self.phase, self.backend, self.train = layer, phase, backend, train
        xp = backend.xp

        def array(shape, label=False):
            host = np.zeros(shape, layer.dtype) if label else rng.standard_normal(shape).astype(layer.dtype)
            dev = xp.empty(shape, layer.dtype)
            backend.copy_from_host(dev, host)
            return dev

        specs = layer.param_specs()
        self.bottoms = [array(s, i in layer.LABEL_BOTTOMS) for i, s in enumerate(layer.bottom_shapes)]
        self.tops = [array(s) for s in layer.top_shapes]
        self.params = {p.name: array(p.shape) for p in specs}
        for p in specs:  # fillers give state buffers (variances) sane values
            backend.copy_from_host(self.params[p.name], fill(rng, p.shape, p.filler, p.fan_in, p.fan_out, layer.dtype))
        if phase == "forward":
            self.inputs = (self.bottoms, self.params)
            return
        layer.forward(self.context(layer.algorithms("forward")[0])(), self.bottoms, self.tops, self.params)
        self.b_in, self.t_in = layer.backward_operands(self.bottoms, self.tops)
        self.top_grads = [array(s) for s in layer.top_shapes]
        self.bottom_grads = [None if i in layer.LABEL_BOTTOMS else array(s)
                             for i, s in enumerate(layer.bottom_shapes)]
        self.param_grads = {p.name: array(p.shape) for p in specs if p.learnable}
        self.inputs = (self.b_in, self.t_in, self.top_grads, self.params)

    def context(self, algo):
        """A fresh Context per run (its scratch carving starts over) on one workspace."""
        ws = self.backend.xp.empty(max(algo.workspace, 1), np.uint8)
        return lambda: Context(self.backend.xp, train=self.train, workspace=ws, algo=algo.name, backend=self.backend)

    def runner(self, algo):
        """A function running the phase with Algo ``algo``."""
        ctx, layer = self.context(algo), self.layer
        if self.phase == "forward":
            return lambda: layer.forward(ctx(), self.bottoms, self.tops, self.params)
        return lambda: layer.backward(ctx(), self.b_in, self.t_in, self.top_grads, self.bottom_grads,
                                      self.params, self.param_grads)

    def _written(self, ops=None):
        """What the phase writes, in order: the tops, or the bottoms' and parameters' gradients."""
        ops = ops or self
        if self.phase == "forward":
            return list(ops.tops)
        return [g for g in ops.bottom_grads if g is not None] + [ops.param_grads[k] for k in sorted(ops.param_grads)]

    def outputs(self, algo):
        """Host copies of the outputs of one run with ``algo``, its inputs as first made and its
        outputs NaN before it (an algorithm that leaves some unwritten fails the check)."""
        if not hasattr(self, "host_inputs"):  # the inputs as made, before any run changes state
            self.host_inputs = _mapped(self.backend.to_host, self.inputs)
        _mapped(lambda dev, host: self.backend.copy_from_host(dev, host), self.inputs, self.host_inputs)
        for out in self._written():
            out.fill(np.nan)
        self.runner(algo)()
        return [self.backend.to_host(out) for out in self._written()]

    def reference(self, dtype):
        """The outputs of the layer's reference algorithm (its default on the host) run in
        ``dtype`` on the host with NumPy, on the inputs of :meth:`outputs`."""
        layer = self.layer
        if not hasattr(self, "host_inputs"):
            self.host_inputs = _mapped(self.backend.to_host, self.inputs)
        twin = type(layer)(layer.name, layer.bottoms, layer.tops, layer.cfg, dtype=dtype)
        twin.source_file = layer.source_file
        twin.top_shapes = [tuple(s) for s in twin.setup(list(layer.bottom_shapes))]
        twin.bottom_shapes = list(layer.bottom_shapes)
        algo = twin.algorithms(self.phase)[0]
        ctx = Context(np, train=self.train, workspace=np.empty(max(algo.workspace, 1), np.uint8), algo=algo.name)
        inputs = _mapped(lambda a: a.astype(dtype), self.host_inputs)
        ops = _HostOperands(twin, inputs, self.phase)
        if self.phase == "forward":
            twin.forward(ctx, ops.bottoms, ops.tops, ops.params)
        else:
            twin.backward(ctx, ops.b_in, ops.t_in, ops.top_grads, ops.bottom_grads, ops.params, ops.param_grads)
        return [out.astype(np.float64) for out in self._written(ops)]


class _HostOperands:
    """A host layer's operands for :meth:`_Operands.reference`: ``inputs`` as
    :attr:`_Operands.inputs` orders them, and zeroed outputs."""

    def __init__(self, layer, inputs, phase):
        def zeros(shape):
            return np.zeros(shape, layer.dtype)
        self.tops = [zeros(s) for s in layer.top_shapes]
        if phase == "forward":
            self.bottoms, self.params = inputs
            return
        self.b_in, self.t_in, self.top_grads, self.params = inputs
        self.bottom_grads = [None if i in layer.LABEL_BOTTOMS else zeros(s) for i, s in enumerate(layer.bottom_shapes)]
        self.param_grads = {p.name: zeros(p.shape) for p in layer.param_specs() if p.learnable}


def _mapped(f, inputs, *others):
    """``f`` over every array of ``inputs`` (lists and dicts of arrays, None kept), with the
    matching arrays of ``others``: the same structure."""
    def one(x, *ys):
        if isinstance(x, dict):
            return {k: one(v, *(y[k] for y in ys)) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [one(v, *(y[i] for y in ys)) for i, v in enumerate(x)]
        return None if x is None else f(x, *ys)
    return one(inputs, *others)


def load_or_measure(graph, backend, device_name=None, train=True):
    """The :class:`Profile` of ``graph`` on this device: its cached table, else one measured
    and checked now (:func:`measure_costs`, :func:`check_algorithms`) and written (to a
    temporary file, then renamed). ``device_name`` (default: the backend's model,
    Backend.device_model) names the cache."""
    device_name = device_name or backend.device_model()
    path = cache_path(graph, device_name, train)
    data = cached(graph, device_name, train)
    measured = data is None
    if measured:
        data = {"format": CACHE_FORMAT, "device": device_name, "costs": measure_costs(graph, backend, train=train),
                "checks": check_algorithms(graph, backend, train=train)}
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    kernels = entries(graph, train)
    rejected = [(kernels[k][0].name, kernels[k][2].name, kernels[k][1], e, t)
                for k, (e, t) in sorted(rejections(data).items()) if k in kernels]
    return Profile(table_of(data), path, measured, rejected)
