"""Net: the Python API. Load a network from YAML, read and set parameters by ``layer/param``
name, run forward and backward on given arrays, read the loss, any top and every gradient.

    net = superneuron.load_net("nets/lenet.yaml", batch=16)
    net.set_param("conv1/weight", w)
    loss = net.forward_backward({"data": x, "label": y})
    g = net.grad("conv1/weight")          # NumPy arrays, copied from the device
    top = net.blob("pool1")
"""

import dataclasses

import numpy as np

from .backend import get_backend
from .errors import SNError
from .graph import Graph
from .layers.fillers import fill
from .limits import host_memory_bytes
from .netfile.rules import net_states
from .netfile.spec import load_spec
from .options import PlanOptions
from .planning import min_memory, plan
from .report import overflow_line
from .runtime.executor import Runtime, rank_seed
from .runtime.graphs import IterationGraph
from .runtime.profile import load_or_measure
from .scheduler.cost import LINKS, CostModel, cached_table
from .scheduler.simulate import compute_step, overflow_at, simulate
from .scheduler.state import like
from .scheduler.steps import ACCUMULATE, APPLY, UPDATE
from .sizes import human_bytes


class Net:
    """A network built from a NetSpec, placed in one arena on a backend, planned under
    ``options`` (an options.PlanOptions, or a policy's name) with the fields ``settings``
    names changed (keywords, checked once by options.PlanOptions.of; an unknown one is an
    SNError naming the closest):

    ``memory`` (or ``budget``) caps the arena, in bytes or as text (``"5MiB"``); by default it
    is sized from the plan. ``policy`` and ``placement`` choose the memory passes and the
    allocator (scheduler.policy); without ``policy``, ``auto`` under ``memory`` (the fastest
    schedule that fits it, as ``sn-train --memory``), else ``baseline``. Every policy computes
    the same results as ``baseline``, but under the others a tensor freed early may be
    overwritten before :meth:`blob` reads it. Each step runs the fastest algorithm whose
    workspace fits ``memory`` and, where a layer has a choice, ``workspace_limit`` bytes
    (scheduler/workspace.py). Policies that offload keep at most ``host_memory`` bytes on the
    host; ``offload_params`` keeps the parameters there. ``device``: ``'cpu'``, ``'gpu'`` or a
    backend.Backend; ``dtype``: ``'float32'`` or ``'float64'``. ``lossy``: the lossy encodings
    a policy that encodes may keep stashes in (``('fp16',)``: ``--lossy fp16``).
    ``solver_seconds``: the time limit of the optimal policy's solver. ``cuda_graph``: on a GPU,
    :meth:`train_step` captures one training iteration as a CUDA graph after a warm-up and
    replays it (runtime/graphs.py); where that cannot be done, :attr:`graph_line` says why and
    the iterations run as without it.

    ``optimizer`` (an optim.Optimizer) adds its state to the resident region and lets
    :meth:`train_step` update the parameters. ``costs`` times the steps for the passes that
    weigh them: a scheduler.cost.CostModel, a measured table, ``"measure"`` (time this net's
    kernels on the device now, or read the cached table: what ``sn-train --profile`` does), or
    None: the cached table of this net on the device if there is one, else estimates.
    ``group``: the ranks of data-parallel training (runtime/collective.py; None: one rank),
    whose gradients are averaged in buckets of ``bucket_bytes`` (scheduler/allreduce.py); each
    rank has its own dropout masks, and the same initial parameters (the same ``seed``); with
    ``sync_bn``, BatchNorm normalises by the statistics of every rank's batch together.
    """

    def __init__(self, spec, options=None, optimizer=None, costs=None, group=None, seed=0, **settings):
        device = settings.get("device")
        if device is not None and not isinstance(device, str):  # a Backend
            settings["device"] = device.name
        if group is not None:
            settings["ranks"] = group.size
        options = self.options = PlanOptions.of(options, **settings)
        memory, host_memory = options.budget, options.host_memory
        self.spec = spec
        self.backend = get_backend(options.device) if device is None or isinstance(device, str) else device
        self.graph = Graph(spec, dtype=np.dtype(options.dtype), kernels=self.backend.kernels())
        self.optimizer = optimizer
        self.seed = seed
        self.group = group
        costs = self.costs = self._cost_model(costs)  # kept: sn-train estimates the run's time
        self.schedules, self.plans = {}, {}
        for k in ("train", "test"):
            self.schedules[k], self.plans[k] = plan(self.graph, options, cost=costs, optimizer=optimizer,
                                                    train=k == "train")
        test = like(self.schedules["test"], self.schedules["train"])  # the resident layout they share
        if test is not self.schedules["test"]:
            self.schedules["test"], self.plans["test"] = test, simulate(test)
        needed = max(p.arena_bytes for p in self.plans.values())
        if memory is not None and needed > memory:
            k = "train" if self.plans["train"].arena_bytes > memory else "test"
            schedule, over = self.schedules[k], self.plans[k]
            line = overflow_line(overflow_at(schedule, over, memory), over.peak_bytes,
                                 compute_step(schedule, over.peak_step), memory)
            raise SNError(f"{line} (policy {self.policy})")
        host = max(p.host_bytes for p in self.plans.values())
        if host_memory is not None and host > host_memory:
            raise SNError(f"needs {human_bytes(host)} of host memory for offloaded tensors; "
                          f"--host-memory {human_bytes(host_memory)} (policy {self.policy})")
        self.runtime = self._runtime(memory or needed, host, seed)
        self.graphs = IterationGraph(self.runtime, self.schedules["train"]) if options.cuda_graph else None
        self._init_params(seed)
        self.outputs = {}  # scalar tops (losses, accuracies) of the last run, by layer name

    @property
    def policy(self):
        """The policy planned, as users write it (``superneurons+params``)."""
        return self.options.name

    @property
    def graph_line(self):
        """Where the CUDA graph of the training iteration stands, one line (``cuda graph: off
        (CPU backend)``), or None without ``cuda_graph``."""
        return None if self.graphs is None else self.graphs.line

    @property
    def ranks(self):
        return self.options.ranks

    @property
    def sync_bn(self):
        return self.options.sync_bn

    def _runtime(self, capacity, host, seed):
        """The Runtime and its arenas; SNError, before anything is allocated where it can be told,
        when they cannot be had (on the CPU both must fit this machine's memory)."""
        total = host_memory_bytes()
        on_host = host + (capacity if self.backend.name == "cpu" else 0)
        if total is not None and on_host > total:
            raise SNError(f"the arena needs {human_bytes(on_host)} of host memory, more than this "
                          f"machine's {human_bytes(total)}: a smaller --batch or net, or a policy that "
                          f"needs less")
        try:
            rank = 0 if self.group is None else self.group.rank
            return Runtime(list(self.schedules.values()), self.backend, capacity=capacity,
                           seed=rank_seed(seed, rank), host_capacity=host, group=self.group,
                           sync_bn=self.sync_bn)
        except MemoryError:  # cupy's OutOfMemoryError is one too
            raise SNError(f"cannot allocate the arena of {human_bytes(capacity)} on {self.backend.name}"
                          + (f" and {human_bytes(host)} on the host" if host else "")
                          + ": not enough memory") from None

    def _cost_model(self, costs):
        name = self.backend.name
        self.costs_rejected = []  # the algorithms a measured table's float64 check rejected
        if costs == "measure":
            costs, _, _, self.costs_rejected = load_or_measure(self.graph, self.backend)
        elif costs is None:
            costs = cached_table(self.graph, self.backend.device_model())  # keyed by the GPU's model
        self.costs_measured = isinstance(costs, dict) and bool(costs)
        if isinstance(costs, CostModel):
            return costs
        link = dataclasses.replace(LINKS[name], ranks=self.ranks)  # the all-reduces' estimate
        return CostModel(name, costs, link=link)

    # -- parameters -----------------------------------------------------------------------
    def _init_params(self, seed):
        rng = np.random.default_rng(seed)
        for node in self.graph.nodes:
            for k, p in node.param_specs.items():
                value = fill(rng, p.shape, p.filler, p.fan_in, p.fan_out, self.graph.dtype)
                self.backend.copy_from_host(self.runtime.resident[node.params[k]], value)

    @property
    def param_names(self):
        """Every parameter and state buffer, as ``layer/param``, in layer order."""
        return [t for n in self.graph.nodes for t in n.params.values()]

    @property
    def kept_names(self):
        """The parameters and state buffers a snapshot keeps: all but the scratch a forward
        leaves its own iteration (ParamSpec.kept)."""
        return [t for n in self.graph.nodes for k, t in n.params.items() if n.param_specs[k].kept]

    @property
    def learnable_names(self):
        """The parameters the optimiser updates (they have gradients)."""
        return [n.params[k] for n in self.graph.nodes for k in n.param_grads]

    def param(self, name):
        """A NumPy copy of parameter ``layer/param``."""
        self._check_param(name)
        return self.runtime.to_host(name)

    def set_param(self, name, value):
        """Overwrite parameter ``layer/param`` with ``value`` (same shape)."""
        self._check_param(name)
        dst = self.runtime.resident[name]
        value = np.asarray(value)
        if value.shape != dst.shape:
            raise SNError(f"parameter '{name}' has shape {dst.shape}, got {value.shape}")
        self.backend.copy_from_host(dst, value.astype(dst.dtype))

    def grad(self, name):
        """A NumPy copy of the gradient of parameter ``layer/param`` after a backward. Where an
        optimiser updates parameter by parameter as the gradients are done (parameter offload's
        host diet; the update in the backward of ``optimal`` and ``auto``) no gradient outlives
        its update, so there is none to read: SNError."""
        self._check_param(name)
        grad = name + ".grad"
        steps = self.schedules["train"].steps
        if any(s.kind == APPLY and s.tensor == grad for s in steps):
            raise SNError(f"the gradient of '{name}' is not kept under policy {self.policy}: the host-side "
                          "update consumes each gradient as it lands (a Net without an optimiser keeps them)")
        if any(s.kind == UPDATE and grad in s.grads for s in steps) and grad not in self.runtime.resident:
            raise SNError(f"the gradient of '{name}' is not kept under policy {self.policy}: each parameter "
                          "is updated right after its backward, and its gradient's memory is reused (a Net "
                          "without an optimiser keeps them)")
        return self.runtime.to_host(grad)

    def _check_param(self, name):
        if name not in self.graph.tensors or self.graph.tensors[name].kind not in ("param", "state"):
            import difflib
            close = difflib.get_close_matches(name, self.param_names, n=1)
            raise SNError(f"no parameter '{name}'" + (f"; did you mean '{close[0]}'?" if close else ""))

    # -- running --------------------------------------------------------------------------
    @property
    def input_names(self):
        """The tops fed from outside, in order (e.g. ``['data', 'label']``)."""
        return [t for n in self.graph.inputs for t in n.tops]

    def input_shape(self, name):
        return self.graph.tensors[name].shape

    @property
    def batch(self):
        """The batch size: the first dimension of the first input."""
        return self.input_shape(self.input_names[0])[0]

    @property
    def classes(self):
        """The classes its SoftmaxWithLoss scores (the channels of its first bottom), or its
        MultiBoxLoss's ``num_classes`` (SSD: the background one of them), or None without one."""
        for node in self.graph.nodes:
            if node.layer.type == "MultiBoxLoss":
                return node.layer.cfg["num_classes"]
            if node.layer.type == "SoftmaxWithLoss":  # the classes lie on its axis (2 for a sequence)
                return self.graph.tensors[node.bottoms[0]].shape[node.layer.cfg["axis"]]
        return None

    phase = "TEST"  # what forward() runs unless told: Caffe's phase of the net (load_net sets it)

    def forward(self, feed, train=None):
        """Run a forward pass in training mode if ``train``, else test mode (by default: the
        net's ``phase``); returns the scalar outputs (losses, accuracies) by layer name."""
        if train is None:
            train = self.phase == "TRAIN"
        schedule = self.schedules["train" if train else "test"]
        if train:  # one round of the training steps, whatever the iter_size
            schedule = schedule.forward_part(rounds=1)
        self.outputs = self.runtime.run(schedule, self._feed(feed), iteration=0)
        return self.outputs

    def forward_backward(self, feed, iteration=0):
        """Forward and backward in training mode (one batch, whatever the iter_size: the
        gradients are that batch's); returns the total weighted loss."""
        schedule = self.schedules["train"]
        schedule = schedule.replace([s for s in schedule.steps if s.kind not in (ACCUMULATE, UPDATE)], rounds=1)
        self.outputs = self.runtime.run(schedule, self._feed(feed), iteration=iteration)
        return self.loss

    @property
    def iter_size(self):
        """Batches one training iteration takes (its optimiser's ``iter_size``; 1 without one)."""
        return self.schedules["train"].rounds

    def train_step(self, feed, iteration):
        """One training iteration (forward, backward, update); returns the total loss. A
        non-finite loss leaves the parameters as they were (see :meth:`first_non_finite`).
        With ``iter_size`` K > 1, ``feed`` is a list of K feeds: the gradients of the K batches
        are summed, the update scales them by 1 / K, and the loss and outputs are the means
        over the K batches (Caffe's gradient accumulation)."""
        assert self.optimizer is not None, "Net was built without an optimizer"
        if self.graphs is not None:
            self.outputs = self.graphs.step(self._feeds(feed), iteration, self.optimizer)
            return self.loss
        self.outputs = self.runtime.run(self.schedules["train"], self._feeds(feed), iteration=iteration,
                                       optimizer=self.optimizer)
        return self.loss

    def first_non_finite(self, feed, iteration):
        """The first node, in execution order, whose top holds a NaN or an infinity in a
        training-mode forward of ``feed`` at ``iteration`` (the same dropout masks; with
        ``iter_size`` > 1, ``feed`` is the iteration's list of feeds, checked in order), or
        None. For diagnosis: it checks every top, which a training step never pays for."""
        xp, found = self.backend.xp, []

        def watch(node, tops):
            if not found and not all(bool(xp.isfinite(t).all()) for t in tops):
                found.append(node)

        schedule = self.schedules["train"]
        schedule = schedule.forward_part()
        self.runtime.run(schedule, self._feeds(feed), iteration=iteration, watch=watch)
        return found[0] if found else None

    @property
    def loss(self):
        """The total weighted loss of the last run (of the losses in its phase)."""
        return sum(n.loss_weight * self.outputs[n.name] for n in self.graph.losses if n.name in self.outputs)

    def blob(self, name):
        """A NumPy copy of top ``name`` after the last run: as in pycaffe, the blob's last value,
        so ``conv1`` on a chain conv1 → BatchNorm → Scale → ReLU, all in place, is the ReLU's
        output (the graph names the earlier in-place versions ``conv1@bn1`` and the like,
        which this reads when given them)."""
        if name not in self.graph.tensors or self.graph.tensors[name].kind != "data":
            raise SNError(f"no top '{name}'")
        return self.runtime.to_host(self._last_version(name))

    def _last_version(self, name):
        """The graph's name of the last in-place version of top ``name`` (``name`` itself when
        no layer writes it in place)."""
        if "@" in name:
            return name
        last = name
        for node in self.graph.nodes:
            for top in node.tops:
                if top.split("@", 1)[0] == name:
                    last = top
        return last

    def _feeds(self, feed):
        """A training iteration's feed checked: one feed, or with ``iter_size`` K > 1 a list of K."""
        k = self.iter_size
        if k == 1:
            return self._feed(feed)
        if isinstance(feed, dict) or len(feed) != k:
            raise SNError(f"iter_size {k}: a training step takes a list of {k} feeds, one per batch")
        return [self._feed(one) for one in feed]

    def _feed(self, feed):
        out = {}
        for name in self.input_names:
            if name not in feed:
                raise SNError(f"feed lacks input '{name}' (inputs: {', '.join(self.input_names)})")
            value = feed[name]
            if not hasattr(value, "shape"):  # NumPy arrays, and CuPy ones as they are
                value = np.asarray(value)
            shape = self.input_shape(name)
            if value.shape != shape:
                raise SNError(f"input '{name}' should have shape {shape}, got {value.shape}")
            out[name] = value
        return out

    # -- memory ---------------------------------------------------------------------------
    @property
    def peak_bytes(self):
        """The arena's real peak so far: resident plus the most scheduled bytes live at once."""
        return self.runtime.peak_bytes

    @property
    def host_bytes(self):
        """The most host memory offloaded tensors have taken at once so far."""
        return self.runtime.host_peak

    def min_memory(self):
        """The smallest ``memory`` (bytes) under which this net's plans, the training iteration
        and the test forward, fit under its policy, placement, workspace limit, host memory and
        cost model: at that many bytes both fit, at one byte less they do not both fit (see
        planning.min_memory for what holds beyond that)."""
        return min_memory(self.graph, self.options, phases=(True, False), cost=self.costs,
                          optimizer=self.optimizer)

    @property
    def arena_bytes(self):
        return self.runtime.arena.capacity


def load_net(path, overrides=None, batch=None, phase="TEST", dropout=None, stages=(), level=0, **kw):
    """Load ``path`` (YAML) with ``--set``-style ``overrides`` and ``batch``; see :class:`Net`
    for the other keywords (``memory="5MiB"``, ``policy="gist"``, ``dtype``, ``optimizer``, ...).

    ``phase`` is Caffe's: what :meth:`Net.forward` runs by default, ``'TEST'`` (the layers of
    the TEST phase, Dropout passing everything, BatchNorm with its running statistics) or
    ``'TRAIN'`` (the TRAIN layers, Dropout dropping, BatchNorm with the batch's statistics).
    ``dropout`` overrides the phase for Dropout layers: None (as the phase says), True (drop in
    both: Monte-Carlo dropout) or False (never: a deterministic training step). ``dtype`` is
    ``'float32'`` or ``'float64'`` for the activations, parameters and gradients. ``stages``
    and ``level``: Caffe's NetState, which chooses the layers whose include/exclude rules name
    stages or levels (pycaffe's ``caffe.Net(file, phase, stages=[...], level=N)``)."""
    phase = str(phase).upper()
    if phase not in ("TRAIN", "TEST"):
        raise SNError(f"phase must be 'TRAIN' or 'TEST', got {phase!r}")
    if dropout not in (None, True, False):
        raise SNError(f"dropout must be None, True or False, got {dropout!r}")
    states = net_states(stages, level) if stages or level else None
    net = Net(load_spec(path, overrides=overrides, batch=batch, states=states), **kw)
    net.phase = phase
    for node in net.graph.nodes:
        if node.layer.type in ("Dropout", "MultiHeadAttention"):  # the second: its attention dropout
            node.layer.enabled = dropout
    return net

