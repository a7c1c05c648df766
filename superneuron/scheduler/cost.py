"""The cost model: how long each step of a schedule takes.

Without measurements a step's time is estimated from its layer's ``cost()`` (flops and bytes
moved) at a device's assumed rates (:class:`DeviceModel`), whichever takes longer, divided by
the chosen algorithm's relative ``speed``. runtime/profile.py times each distinct (layer type,
shapes, configuration, algorithm, phase) once on a backend instead (kernels run there, never
here); its table is cached as JSON under ``~/.cache/superneuron/`` (``$SN_CACHE_DIR``
overrides the folder), keyed by device and the network's shape signature, and
:class:`CostModel` prefers it where it has an entry. An algorithm that failed the table's
float64 check (runtime/profile.py) has an infinite time there, and the model leaves it out of
the layer's algorithms, so that no pass chooses it. The workspace pass ranks algorithms with
this model; sn-plan sums it into an estimated iteration time; the trace times its spans with
it.
"""

import hashlib
import json
import math
import os
import weakref
from dataclasses import dataclass

from .steps import (
    ACCUMULATE,
    ALLOC,
    ALLREDUCE,
    APPLY,
    BACKWARD,
    BARRIER,
    DECODE,
    ENCODE,
    FORWARD,
    FREE,
    KINDS,
    OFFLOAD,
    PREFETCH,
    RECOMPUTE,
    UPDATE,
    WAIT,
    WAIT_REDUCE,
    Encode,
)
from .timeline import Clock, Timeline


@dataclass(frozen=True)
class DeviceModel:
    """A device's assumed sustained rates: ``flops`` per second, ``bandwidth`` (device memory)
    and ``copy`` (host↔device, each direction) in bytes per second; ``fused_pass``: the part
    of a pass that it still takes run in the pass before it (a ReLU in its layer's: fuse.py;
    the reads of an Encode of a layer's own form in its Forward: encode.py)."""

    name: str
    flops: float
    bandwidth: float
    copy: float
    fused_pass: float = 0.0

    def seconds(self, flops, nbytes):
        """Time of work that is compute-bound or memory-bound, whichever takes longer."""
        return max(flops / self.flops, nbytes / self.bandwidth)


DEVICES = {
    # Measured once on the 2-core development machine: float32 1024² GEMM through NumPy ran
    # at ~230 GFLOP/s, an elementwise add over 128 MiB at ~47 GB/s (read + write). Layers
    # reach about half of either (im2col copies, small GEMMs, temporaries), hence these.
    # A "copy" to host memory on the CPU is a memcpy by the copy thread, ~5 GB/s on one core.
    # A ReLU in the pass of the layer before it costs about its own pass on the CPU at
    # CIFAR's map sizes (Scale at 32x16x32x32: 0.282 ms fused against 0.281 ms; on
    # 32x64x56x56 Scale's ReLU kept 0.24 of its pass and Eltwise's 0.73): no gain is counted.
    # NumPy writes a layer's encoded form after its forward, reading the operands again.
    "cpu": DeviceModel("cpu", flops=100e9, bandwidth=20e9, copy=5e9, fused_pass=1.0),
    # An H100-class GPU: what float32 convolutions sustain through cuDNN (well under the
    # 67 TFLOP/s peak without TF32) and about half of HBM3's 3.35 TB/s.
    # Copies: pinned memory over PCIe 5.0 x16 sustains ~20 GB/s each way in practice.
    # A fused ReLU is one kernel with its layer's: the same reads and writes, its flops more
    # (a BatchNorm's fused Scale: its writes more);
    # so is the encoded form a ReLU or a max pooling writes in its forward (cuda_kernels.py).
    "gpu": DeviceModel("h100", flops=20e12, bandwidth=1.5e12, copy=20e9, fused_pass=0.0),
}


@dataclass(frozen=True)
class Link:
    """The interconnect of data-parallel training: ``ranks`` taking part, and each link's
    ``bandwidth`` (bytes per second, each direction) and ``latency`` (seconds per message)."""

    ranks: int = 1
    bandwidth: float = 5e9
    latency: float = 5e-6

    def allreduce_seconds(self, nbytes):
        """A ring all-reduce of ``nbytes``: 2(N-1) steps, each sending N-th of the bytes over
        one link (reduce-scatter, then all-gather): 2(N-1)/N · bytes / bandwidth, plus 2(N-1)
        latencies; nothing for one rank."""
        n = self.ranks
        if n <= 1:
            return 0.0
        return 2 * (n - 1) / n * nbytes / self.bandwidth + 2 * (n - 1) * self.latency


# What --link defaults to, by device: on the CPU, MPI between processes of one machine
# (shared memory, about a memcpy); on GPUs, NVLink between the GPUs of one node (H100: 450 GB/s
# each way nominal, of which NCCL's ring sustains about a third).
LINKS = {"cpu": Link(bandwidth=5e9, latency=5e-6), "gpu": Link(bandwidth=150e9, latency=10e-6)}


def _no_seconds(schedule, step):
    """Memory and copy steps take no time on the compute stream."""
    return 0.0


def phase_of(step):
    """The layer phase a compute step runs: a recompute is a forward."""
    return "backward" if step.kind == BACKWARD else "forward"


def estimate(layer, phase, algo, device):
    """Estimated seconds of ``layer``'s ``phase`` (``forward``, ``backward``, or ``recompute``:
    its forward run again, Cost.rec_*) with Algo ``algo`` on DeviceModel ``device``."""
    cost = layer.cost()
    if phase == "backward":
        base = device.seconds(cost.bwd_flops, cost.bwd_bytes)
    elif phase == RECOMPUTE and (cost.rec_flops is not None or cost.rec_bytes is not None):
        base = device.seconds(cost.fwd_flops if cost.rec_flops is None else cost.rec_flops,
                              cost.fwd_bytes if cost.rec_bytes is None else cost.rec_bytes)
    else:
        base = device.seconds(cost.fwd_flops, cost.fwd_bytes)
    return base / max(algo.speed, 1e-9)


def entry_key(layer, algo_name, phase):
    """The measured table's key of one (layer type, shapes, configuration, algorithm, phase)."""
    cfg = hashlib.sha1(json.dumps(layer.cfg, sort_keys=True, default=str).encode()).hexdigest()[:10]
    shapes = "x".join(str(list(s)) for s in layer.bottom_shapes)
    return f"{layer.type}|{shapes}|{layer.dtype.name}|{cfg}|{algo_name}|{phase}"


class CostModel:
    """Step times on ``device`` (a DeviceModel or a name in :data:`DEVICES`), from the measured
    ``table`` (runtime/profile.py's ``measure_costs``) where it has the entry, else estimated;
    all-reduces over ``link`` (a :class:`Link`; default: the device's, with one rank)."""

    def __init__(self, device="gpu", table=None, link=None):
        self.device = DEVICES[device] if isinstance(device, str) else device
        self.table = table or {}
        self._rejects = math.inf in self.table.values()  # algorithms the float64 check rejected
        self.link = link or LINKS["cpu" if self.device.name == "cpu" else "gpu"]
        # layer → {(phase, algo, speed): seconds; (RECOMPUTE, algo, speed): the recomputation's
        # share of the forward (recompute_seconds)}
        self._estimates = weakref.WeakKeyDictionary()
        self._algorithms = weakref.WeakKeyDictionary()  # layer → {phase: [Algo]}
        self._seconds = self._seconds_table()

    def algorithms(self, layer, phase):
        """``layer.algorithms(phase)``, memoised per layer and phase in this model (a plan's
        Context holds it: no module keeps it). A layer's shapes are fixed once its graph is
        built, so its algorithms are too, and planning a deep net asks for them hundreds of
        thousands of times (a convolution works its workspaces out anew on each call). The
        list is shared: callers must not change it. An algorithm the measured table rejects
        (an infinite time: it failed the float64 check) is left out, unless all are."""
        memo = self._algorithms.get(layer)
        if memo is None:
            memo = self._algorithms[layer] = {}
        algos = memo.get(phase)
        if algos is None:
            algos = layer.algorithms(phase)
            if self.device.name != "cpu":  # a host kernel is no choice on a GPU (Algo.host_only)
                algos = [a for a in algos if not a.host_only] or algos
            if len(algos) > 1 and self._rejects:
                algos = [a for a in algos if self.table.get(entry_key(layer, a.name, phase)) != math.inf] or algos
            memo[phase] = algos
        return algos

    def algo_seconds(self, layer, phase, algo):
        """Seconds of ``layer``'s ``phase`` with Algo ``algo``."""
        if len(self.table) > ("copy" in self.table):  # a table with layer entries: its key
            measured = self.table.get(entry_key(layer, algo.name, phase))
            if measured is not None:
                return measured
        # estimates are memoised: a plan asks for each step's time several times
        memo = self._estimates.get(layer)
        if memo is None:
            memo = self._estimates[layer] = {}
        key = (phase, algo.name, algo.speed)
        seconds = memo.get(key)
        if seconds is None:
            seconds = memo[key] = estimate(layer, phase, algo, self.device)
        return seconds

    def recompute_seconds(self, layer, algo):
        """Seconds of ``layer``'s forward with Algo ``algo`` run again as a Recompute: the
        forward's (measured or estimated) in the proportion of the two estimates, where the
        layer recomputes with less work (Cost.rec_*: BatchNorm from its saved statistics)."""
        forward = self.algo_seconds(layer, "forward", algo)
        memo = self._estimates.setdefault(layer, {})
        key = (RECOMPUTE, algo.name, algo.speed)
        share = memo.get(key)
        if share is None:
            whole = estimate(layer, "forward", algo, self.device)
            share = memo[key] = estimate(layer, RECOMPUTE, algo, self.device) / whole if whole > 0 else 1.0
        return forward * share

    def fused_seconds(self, layer, writes=0):
        """Seconds ``layer`` adds run in the pass of the layer before it (fuse.py), writing
        ``writes`` bytes of new memory (a ReLU in place: none; a BatchNorm's Scale: its top)
        from values in hand: its flops at the device's rate, its writes at its bandwidth, or the
        device's ``fused_pass`` of its own time, whichever is more."""
        own = self.algo_seconds(layer, "forward", self.algorithms(layer, "forward")[0])
        return max(layer.cost().fwd_flops / self.device.flops, writes / self.device.bandwidth,
                   self.device.fused_pass * own)

    def encoded_seconds(self, schedule, step):
        """Seconds the Forward ``step`` adds writing its layer's own encoded form in its pass
        (encode.py): the form's bytes, and the device's ``fused_pass`` of the operands an Encode
        of its own would read again."""
        reads, writes = KINDS[ENCODE].uses(schedule.graph, Encode(step.encoded, None, node=step.node))
        size = schedule.tensors
        return (sum(size[t].nbytes for t in writes)
                + self.device.fused_pass * sum(size[t].nbytes for t in reads)) / self.device.bandwidth

    def copy_seconds(self, nbytes):
        """Seconds of one host↔device copy of ``nbytes`` (measured bandwidth where the table
        has it, under the key ``copy``)."""
        return nbytes / self.table.get("copy", self.device.copy)

    def step_seconds(self, schedule, step):
        """Seconds of one step on the compute stream; memory and copy steps take none there
        (copies run on their own streams: see :meth:`timeline`)."""
        return self._seconds[step.kind](schedule, step)

    def _seconds_table(self):
        """kind → ``(schedule, step) → seconds`` on the compute stream, one entry per kind of
        steps.KINDS (a kind missing here fails: test_walk.py)."""
        nothing = _no_seconds
        return {FORWARD: self._layer_seconds, BACKWARD: self._layer_seconds, RECOMPUTE: self._layer_seconds,
                UPDATE: self._update_seconds, ACCUMULATE: self._accumulate_seconds,
                ENCODE: self._coding_seconds, DECODE: self._coding_seconds,
                ALLREDUCE: self._bucket_seconds, WAIT_REDUCE: self._bucket_seconds,
                ALLOC: nothing, FREE: nothing, OFFLOAD: nothing, PREFETCH: nothing, WAIT: nothing, APPLY: nothing,
                BARRIER: nothing}

    def _layer_seconds(self, schedule, step):
        """A layer's pass with its algorithm, and what it runs in the same pass (a fused ReLU,
        its own encoded form)."""
        layer = schedule.graph.nodes[step.node].layer
        phase = phase_of(step)
        algos = self.algorithms(layer, phase)
        algo = next((a for a in algos if a.name == step.algorithm), algos[0])
        if step.kind == RECOMPUTE:
            seconds = self.recompute_seconds(layer, algo)
        else:
            seconds = self.algo_seconds(layer, phase, algo)
        for n in step.fused or ():  # a ReLU in place on what is in hand, or a Scale onto new memory
            after = schedule.graph.nodes[n]
            seconds += self.fused_seconds(after.layer, 0 if after.layer.type == "ReLU"
                                          else sum(schedule.tensors[t].nbytes for t in after.tops))
        if step.encoded is not None and step.kind == FORWARD:
            seconds += self.encoded_seconds(schedule, step)
        return seconds

    def _update_seconds(self, schedule, step):
        """Reads params, grads and state, writes params and state."""
        if step.grads:  # those of its gradients, each the shape of its parameter and states
            slots = schedule.optimizer.slots if schedule.optimizer is not None else 0
            nbytes = sum(schedule.tensors[g].nbytes for g in step.grads) * (2 + slots)
        else:
            nbytes = sum(schedule.tensors[t].nbytes for t in schedule.resident)
        return 3 * nbytes / self.device.bandwidth

    def _accumulate_seconds(self, schedule, step):
        """Reads each gradient and its accumulator, writes one."""
        nbytes = sum(schedule.tensors[t].nbytes for t in schedule.resident + schedule.host_resident
                     if schedule.tensors[t].kind == "accum")
        return 3 * nbytes / self.device.bandwidth

    def _coding_seconds(self, schedule, step):
        """Memory-bound: reads what it reads, writes what it writes."""
        reads, writes = KINDS[step.kind].uses(schedule.graph, step)
        return sum(schedule.tensors[t].nbytes for t in (*reads, *writes)) / self.device.bandwidth

    def _bucket_seconds(self, schedule, step):
        """Packs (unpacks) the bucket's gradients: reads and writes it."""
        return 2 * schedule.tensors[step.tensor].nbytes / self.device.bandwidth

    def timeline(self, schedule):
        """The estimated :class:`Timeline` of one iteration: compute steps one after another
        on the compute stream, Offloads queued on a device→host stream and Prefetches on a
        host→device stream, each starting when issued or when its stream is free, and a Wait
        holding the compute stream until its tensor's copy is done; an AllReduce queued on the
        network after it packs its bucket, and its WaitReduce holding the compute stream until
        it is done (the *exposed* communication; the rest overlaps). ``spans`` says when each
        step ran on which stream (what sn-plan's trace draws). A schedule of several rounds
        (iter_size) runs its steps once per round and its Update once: the figures count them
        so, while ``starts`` and ``spans`` draw one round. (The walk is :class:`Clock`'s.)"""
        clock = Clock(self, schedule)
        clock.run(schedule)
        k, update = schedule.rounds, clock.update_seconds
        return Timeline(k * (clock.now - update) + update, k * clock.stall, k * clock.recompute_seconds,
                        k * clock.copied, clock.starts, clock.spans, k * clock.communication, k * clock.exposed)

    def iteration_seconds(self, schedule):
        """Estimated seconds of one iteration (see :meth:`timeline`)."""
        return self.timeline(schedule).seconds


def as_model(costs):
    """A CostModel from ``costs``: a CostModel, a measured table (dict), or None (estimates)."""
    if isinstance(costs, CostModel):
        return costs
    return CostModel(table=costs)


def step_seconds(schedule, step, model=None):
    """Seconds of ``step`` under ``model`` (default: the GPU estimate)."""
    return (model or CostModel()).step_seconds(schedule, step)


# -- measured tables -----------------------------------------------------------------------------

def entries(graph, train=True):
    """``{key: (layer, phase, algo)}`` for every distinct measurable kernel of ``graph``."""
    out = {}
    for node in graph.nodes:
        layer = node.layer
        if layer.ALIAS_TOPS or not node.bottoms:  # Split does nothing; inputs copy a feed
            continue
        phases = ("forward", "backward") if train and node.backward else ("forward",)
        for phase in phases:
            for algo in layer.algorithms(phase):
                out.setdefault(entry_key(layer, algo.name, phase), (layer, phase, algo))
    return out


# The cache files' format: 2 added each algorithm's float64 check ("checks"); a file of another
# format (or none: the first) is measured again, never trusted unchecked.
CACHE_FORMAT = 2


def cache_dir():
    """Where measured tables are kept: ``$SN_CACHE_DIR``, else ``~/.cache/superneuron``."""
    return os.environ.get("SN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "superneuron")


def cache_path(graph, device_name, train=True):
    """The cache file of ``graph``'s table on ``device_name``: named by a hash of its keys."""
    sig = hashlib.sha1("\n".join(sorted(entries(graph, train))).encode()).hexdigest()[:16]
    return os.path.join(cache_dir(), f"costs-{device_name}-{sig}.json")


def cached(graph, device_name, train=True):
    """The cache file of ``graph`` on ``device_name``, read (``{"format", "device", "costs":
    {key: seconds}, "checks": {key: [error, tolerance]}}``), or None where there is none or it
    is of another :data:`CACHE_FORMAT`."""
    path = cache_path(graph, device_name, train)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        data = json.load(f)
    return data if data.get("format") == CACHE_FORMAT else None


def rejections(data):
    """``{key: (error, tolerance)}``: the algorithms of a cache file's ``data`` whose float64
    check failed (an error that is not within its tolerance: NaN or infinite too)."""
    return {k: (e, t) for k, (e, t) in data.get("checks", {}).items() if not e <= t}


def table_of(data):
    """The measured table of a cache file's ``data``: its times, an infinite one for each
    algorithm it rejects (:class:`CostModel` then never offers it)."""
    return {**data["costs"], **dict.fromkeys(rejections(data), math.inf)}


def cached_table(graph, device_name, train=True):
    """The measured table of ``graph`` on ``device_name`` if one is cached, else None."""
    data = cached(graph, device_name, train)
    return None if data is None else table_of(data)
