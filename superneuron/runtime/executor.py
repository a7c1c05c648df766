"""The Runtime: executes a Schedule's steps with every tensor a view into one Arena.

Each round is walked by an :class:`Execution`, a walker (scheduler/walk.py) whose memory and
copy steps are the base walker's, as in the Simulator, with real copies behind them, so it
makes the same allocator calls as the Simulator, in the same order, and the arena's peak is
the plan's; its compute steps run the layers' kernels. Resident tensors
(parameters, their gradients, optimiser state) are placed once at start-up; scheduled ones
are placed as the steps allocate them, each iteration anew.

Offloaded tensors go to a second arena in host memory (pinned on a GPU), through the
copy queues (runtime/copies.py): an Offload or a Prefetch starts a copy, a Wait
blocks until it is done. A step that touches a tensor whose copy is still running without a
Wait before it is a *stall*: the Runtime waits for the copy (results stay right) and counts
it in ``stalls``; a correct plan has none. ``blocked`` counts the Waits that really had to wait.

Data-parallel (a ``group`` of ranks, runtime/collective.py): an AllReduce packs its
gradients into its bucket (a tensor of the arena) and starts the bucket's sum over the ranks;
its WaitReduce waits for it and writes the ranks' average back into the gradients.
"""

import math

import numpy as np

from ..graph import storage_root
from ..layers import codecs, parallel
from ..layers.base import Context
from ..scheduler.liveness import Roots, step_roots
from ..scheduler.lower import ACCUM
from ..scheduler.simulate import replay
from ..scheduler.steps import OFFLOAD, UPDATE
from ..scheduler.walk import OFFLOADING, Copies, Walker
from .arena import Arena
from .copies import copies_for
from .host_update import HostUpdater


def rank_seed(seed, rank):
    """The seed of ``rank``'s dropout masks: ``seed`` itself on rank 0 (one rank trains as it
    always did), another for every other rank (each rank drops its own units, as in Caffe)."""
    return seed if rank == 0 else (int(seed) * 7_919 + int(rank) * 104_729 + 1) & (2**63 - 1)


def step_seed(seed, iteration, node_index):
    """The random seed of one layer in one iteration: the same whenever that step is re-run
    (recompute), different between layers and iterations."""
    return (int(seed) * 1_000_003 + int(iteration)) * 65_537 + int(node_index) & (2**63 - 1)


class Runtime:
    """Runs schedules of one graph on one backend, in one arena of ``capacity`` bytes.

    ``schedules`` are the schedules it will run (they share the resident layout); the arena
    holds ``capacity`` bytes and the host arena of offloaded tensors ``host_capacity`` (by
    default what the schedules need). ``group``: the ranks of data-parallel training
    (runtime/collective.py), or None; ``sync_bn``: BatchNorm pools the statistics of every
    rank's batch.
    """

    def __init__(self, schedules, backend, capacity, seed=0, host_capacity=None, group=None, sync_bn=False):
        self.group = group
        self.sync_bn = group if sync_bn and group is not None else None
        self.backend, self.xp, self.seed = backend, backend.xp, seed
        first = schedules[0]
        self.graph = first.graph
        self.tensors = dict(first.tensors)
        for s in schedules[1:]:
            assert s.resident == first.resident, "schedules of one runtime share resident tensors"
            self.tensors.update(s.tensors)
        self.arena = Arena(capacity, backend)
        if host_capacity is None:
            host_capacity = max(replay(s).host.high_water for s in schedules)
        self.host = Arena(host_capacity, backend, host=True)
        # parameter offload: the masters live on the host (the update's workspace too, which
        # only a training schedule has)
        host_resident = list(dict.fromkeys(t for s in schedules for t in s.host_resident))
        for name in host_resident:
            self.host.place_resident(name, self.tensors[name].nbytes)
        self.copies = None             # the copy queues, made on the first copy
        self.memory = None             # the Execution (walker) of the last round run
        self.stalls = self.blocked = 0
        # skip the Update of an iteration whose loss is not finite (one host sync, at the first
        # Update step, unless the update skips itself on the device; off: none, and a NaN loss
        # then updates the parameters)
        self.finite_losses = True
        self.syncs_inside = None       # backend.host_sync's reasons before the last round's end
        self._labels_checked = set()   # the layers whose fed labels were checked on the host
        self.outside = None            # backend.Allocations of the last run
        self.host_peak = 0
        self.resident = {}
        for name in first.resident:
            self.arena.place_resident(name, self.tensors[name].nbytes)
        for name in first.resident + host_resident:
            info = self.tensors[name]
            arena = self.arena if name in self.arena.resident else self.host
            self.resident[name] = arena.view(name, info.shape, info.dtype)
            self.resident[name][...] = 0
        self.host_update = bool(host_resident)  # the optimiser updates on the host
        self.peak_bytes = self.arena.resident_end
        self.arena_bytes = self.arena.resident_end
        self._entries = None  # the optimiser's view of the parameters, made on first update
        self.updater = None   # the host-side optimiser under parameter offload (host_update.py)
        self.schedule = first  # the schedule of the last run: its tensors say what aliases what

    def view(self, name, freed_ok=False):
        """The array of tensor ``name`` (resident, or scheduled and currently placed; with
        ``freed_ok``, also where it was last placed in the last run)."""
        if name in self.resident and name not in self.arena.offsets:
            return self.resident[name]  # (a host-resident parameter's device copy is placed)
        tensors = self.schedule.tensors if name in self.schedule.tensors else self.tensors
        info = tensors[name]
        return self.arena.view(storage_root(tensors, name), info.shape, info.dtype, freed_ok)

    def run(self, schedule, feed, iteration=0, optimizer=None, watch=None):
        """Execute one iteration of ``schedule``; ``feed`` maps input tops to host arrays.

        Returns the scalar outputs (losses, accuracies) by layer name, as floats. When a loss
        is non-finite the Update step is skipped: the parameters stay as they were, so that the
        iteration can be re-run to find where it went wrong (under parameter offload, updates
        that began during the backward are done by then). ``watch(node, tops)``, if given, is
        called after every Forward step (diagnosis only).

        A schedule of ``rounds`` K > 1 (Caffe's iter_size) takes ``feed`` as a sequence of K
        feeds: its steps run once per feed, each round from an empty arena (the same allocator
        calls as the plan's one round), with dropout masks of its own, and its Update only in
        the last; the outputs are then their means over the rounds (the loss Caffe shows)."""
        rounds = schedule.rounds
        feeds = [feed] if rounds == 1 else list(feed)
        assert len(feeds) == rounds, f"a schedule of {rounds} rounds takes {rounds} feeds, got {len(feeds)}"
        arena = self.arena
        self.schedule = schedule
        totals, finite = {}, True
        with self.backend.watch_allocations() as outside, parallel.numpy_settings():
            for k, one in enumerate(feeds):
                self._labels_checked = self._check_labels(one)
                arena.reset(schedule.offsets)
                self.host.reset()
                outputs = self._run_steps(schedule, one, iteration, optimizer, watch, k, finite)
                finite = finite and all(math.isfinite(outputs[n.name]) for n in self.graph.losses
                                        if n.name in outputs)
                for name, value in outputs.items():
                    totals[name] = totals.get(name, 0.0) + value
                self.peak_bytes = max(self.peak_bytes, arena.peak_bytes)
                self.arena_bytes = max(self.arena_bytes, arena.high_water)
                self.host_peak = max(self.host_peak, self.host.high_water)
        self.outside = outside  # what the array library allocated beside the arena
        return totals if rounds == 1 else {name: total / rounds for name, total in totals.items()}

    def _run_steps(self, schedule, feed, iteration, optimizer, watch, round_=0, finite=True):
        """One round of ``schedule`` (``round_`` of its rounds; ``finite``: the losses of the
        rounds before were finite): its outputs."""
        last = round_ == schedule.rounds - 1
        update = next((s for s in schedule.steps if s.kind == UPDATE), None) if last else None
        if self.host_update and update is not None:
            if self.updater is None:
                self.updater = HostUpdater()
            self.update_entries(optimizer)
            ws = self.view(update.workspace) if update.workspace else None
            # the last round of several: each gradient's sum is finished where it lands
            accums = self._accums() if schedule.rounds > 1 else None
            self.updater.begin(optimizer, iteration, self._entries_by_grad, ws, accums)
        self.memory = execution = Execution(self, schedule, feed, (iteration, round_), optimizer, watch, finite)
        syncs_before = self.backend.syncs.copy()
        execution.run(schedule)
        assert not execution.pending, f"copies never waited for: {sorted(execution.pending)}"
        assert not execution.reducing, f"all-reduces never waited for: {sorted(execution.reducing)}"
        # what made the host wait for the device before the iteration's end (see finite_losses)
        self.syncs_inside = self.backend.syncs - syncs_before
        if self.group is not None:
            self.group.settle(f"the all-reduces of iteration {iteration}")
        self.backend.host_sync("the outputs, at the end of the iteration")
        return {name: float(value) for name, value in execution.outputs.items()}

    def _finite_losses(self, outputs, optimizer):
        """Whether every loss computed so far is finite: True or False, read back from the
        device (the one host sync inside an iteration, at its first Update), or, where the
        optimiser skips itself on the device (Optimizer.guards_on_device: the one-kernel SGD on
        a GPU), a device flag it reads, and no sync. True when ``finite_losses`` is off."""
        if not self.finite_losses:
            return True
        losses = [outputs[n.name] for n in self.graph.losses]
        if losses and optimizer.guards_on_device(self.xp):
            return self.xp.isfinite(sum(losses[1:], losses[0]))  # NaN or ±inf in any: in the sum
        self.backend.host_sync("the losses' finiteness, before the update")
        return all(math.isfinite(float(v)) for v in losses)

    def _accums(self):
        """Each parameter gradient's accumulator (resident: on the device, or on the host under
        parameter offload), by the gradient's name."""
        return {g: self.resident[g + ACCUM] for n in self.graph.nodes for g in n.param_grads.values()}

    def _accumulate(self, round_, rounds):
        """The Accumulate step of round ``round_``: the first round's gradients are copied into
        the accumulators, the next ones' added to them, and in the last round the sum goes back
        into the gradients, which the update reads (it scales them by 1 / rounds, Caffe's
        Normalize). Under parameter offload both live on the host, where the gradients have
        landed (the Waits before this step); there the last round's sums are made as each
        gradient lands, by the host updater."""
        xp = self.xp
        if self.host_update:
            if round_ == rounds - 1:
                return  # host_update.HostUpdater adds each sum in before that parameter's update
            self.backend.synchronize()  # the Waits ordered the device: the host reads them now
            xp = np
        for g, acc in self._accums().items():
            grad = self.resident[g]
            if round_ == 0:
                xp.copyto(acc, grad)
            elif round_ < rounds - 1:
                acc += grad
            else:
                grad += acc

    def _check_labels(self, feed):
        """Check the labels fed on the host (where they are NumPy) for every layer that reads
        labels straight from the feed; the names of those layers, whose forward then need not
        read them back from the device."""
        checked, graph = set(), self.graph
        fed = {top: name for n in graph.inputs for top, name in zip(n.tops, n.layer.tops)}
        split = {top: n.bottoms[0] for n in graph.nodes if n.layer.type == "Split" for top in n.tops}
        for node in graph.nodes:
            check = getattr(node.layer, "check_labels", None)
            if check is None or len(node.bottoms) < 2:
                continue
            source = node.bottoms[1]
            while source in split:  # a fan-out's copy of the fed labels
                source = split[source]
            labels = feed.get(fed.get(source))
            if isinstance(labels, np.ndarray) and check(labels):
                checked.add(node.name)
        return checked

    def update_entries(self, optimizer):
        """``(param, grad, [state], lr_mult, decay_mult)`` for every learnable parameter."""
        if self._entries is None:
            self._entries_by_grad = {}
            for node in self.graph.nodes:
                specs = node.param_specs
                for k, g in node.param_grads.items():
                    t = node.params[k]
                    state = [self.resident[f"{t}.{optimizer.state_name(j)}"] for j in range(optimizer.slots)]
                    # None: a gradient with no host place of its own (parameter offload's diet):
                    # the host updater is handed its host copy when it lands
                    self._entries_by_grad[g] = (self.resident[t], self.resident.get(g), state,
                                                specs[k].lr_mult, specs[k].decay_mult)
            self._entries = list(self._entries_by_grad.values())
        return self._entries

    def _entries_of(self, step, optimizer):
        """The optimiser's entries of an Update step: of the gradients it names (scheduled ones,
        right after their Backward: scheduler/update.py, placed where the arena has them now),
        or of every gradient."""
        entries = self.update_entries(optimizer)
        if not step.grads:
            return entries
        by_grad = self._entries_by_grad
        return [(by_grad[g][0], self.view(g), *by_grad[g][2:]) for g in step.grads]

    def optimizer_update(self, optimizer, iteration, step, scratch):
        """The optimiser's update of the parameters of Update ``step`` on the device."""
        optimizer.update(self.xp, iteration, self._entries_of(step, optimizer), scratch)

    def to_host(self, name):
        """A NumPy copy of tensor ``name`` (after a run, where it was last placed)."""
        return np.asarray(self.backend.to_host(self.view(name, freed_ok=True)))


class Execution(Walker):
    """One round of a schedule on a :class:`Runtime`: the walker whose compute steps run
    kernels on the arena's views; its memory and copy steps are the base walker's, on the
    runtime's arena and host arena, with real copies (:class:`_Copies`). Before any step but an
    Alloc or a Wait, a copy still running on what it touches is waited for and counted as a
    stall. ``outputs``: the scalar outputs by layer name; ``reducing``: bucket → the handle of
    its all-reduce under way."""

    def __init__(self, runtime, schedule, feed, when, optimizer, watch, finite):
        iteration, round_ = when  # the iteration, and the round of it (iter_size)
        self.runtime, self.graph, self.schedule, self.feed = runtime, runtime.graph, schedule, feed
        self.view, self.iteration, self.optimizer, self.watch = runtime.view, iteration, optimizer, watch
        self.round, self.last, self.finite = round_, round_ == schedule.rounds - 1, finite
        self.draw = iteration * schedule.rounds + round_  # each round its own dropout masks
        self.roots = Roots.of(schedule)  # kept with the schedule: its memos serve every iteration
        self.outputs, self.reducing = {}, {}
        self.losses_finite = None  # found at the first Update (Runtime._finite_losses)
        super().__init__(schedule.tensors, runtime.arena, runtime.host, _Copies(runtime))

    # -- stalls: a copy still running on what a step touches ---------------------------------
    def _settle(self, names):
        """Wait for any copy still running on ``names`` (a stall: the plan should have put a
        Wait before the step)."""
        pending = self.pending
        for name in names:
            if name in pending:
                self.runtime.stalls += 1
                self.wait_for(name, planned=False)

    def _settle_roots(self, step):
        if self.pending:
            self._settle(step_roots(self.schedule, step, self.roots))

    def free(self, step):
        if self.pending:
            self._settle((step.tensor,))
        super().free(step)

    def offload(self, step):
        if self.pending:
            self._settle((step.tensor,))
        super().offload(step)

    def prefetch(self, step):
        if self.pending:
            self._settle((step.tensor,))
        super().prefetch(step)

    def apply(self, step):
        self._settle_roots(step)
        super().apply(step)

    # -- compute steps: kernels ---------------------------------------------------------------
    def compute(self, step):
        raise AssertionError(f"the Runtime has no meaning for a {step.kind} step")

    def forward(self, step, recompute=False):
        """A layer's forward into its tops (with its own encoded form, or the in-place ReLU on
        its top, in the same pass); a loss's value is an output."""
        self._settle_roots(step)
        node = self.graph.nodes[step.node]
        view = self.view
        ctx = self._context(step, node, self.draw, self.schedule.train, recompute, self.feed)
        ctx.relu = step.fused is not None  # the in-place ReLU after it, in its pass
        if step.encoded is not None:  # its own encoded form, written in the same pass
            ctx.encoded = view(step.encoded)
        if not node.layer.ALIAS_TOPS:
            params = {k: view(t) for k, t in node.params.items()}
            node.layer.forward(ctx, [view(b) for b in node.bottoms], [view(t) for t in node.tops], params)
        if recompute:
            return
        if node.layer.top_shapes == [()]:
            # kept on the device (its top may be freed): read back once, at the end
            self.outputs[node.name] = view(node.tops[0]).copy()
        if self.watch is not None:
            self.watch(node, [view(t) for t in node.tops])

    def recompute(self, step):
        """The forward again, for the backward: no output, no watch."""
        self.forward(step, recompute=True)

    def backward(self, step):
        self._settle_roots(step)
        node, view = self.graph.nodes[step.node], self.view
        if step.encoded is not None:  # it reads an encoded form instead of its bottoms and tops
            bottoms, tops = [None] * len(node.bottoms), [None] * len(node.tops)
        else:
            bottoms, tops = node.layer.backward_operands(node.bottoms, node.tops, view)
        top_grads = [None if g is None else view(g) for g in node.top_grads]
        if node.loss_weight:
            top_grads[0][...] = node.loss_weight
        bottom_grads = [None if g is None else view(g) for g in node.bottom_grads]
        params = {k: view(t) for k, t in node.params.items()}
        param_grads = {k: view(g) for k, g in node.param_grads.items()}
        ctx = self._context(step, node, self.draw, True, False, None)
        if step.encoded is not None:
            ctx.encoded = view(step.encoded)
        node.layer.backward(ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads)
        if self.reducing:
            self.runtime.group.progress()

    def accumulate(self, step):
        self._settle_all(step)
        self.runtime._accumulate(self.round, self.schedule.rounds)

    def update(self, step):
        """The optimiser's update, in the last round only, and not after a non-finite loss
        (NaN gradients would make every parameter NaN and hide the cause); under parameter
        offload the host updater's, once the gradients' copies have landed."""
        self._settle_all(step)
        runtime = self.runtime
        if not self.last:
            return  # the rounds before the last only accumulate
        if runtime.host_update:
            runtime.backend.synchronize()
            runtime.updater.finish()
            return
        if self.losses_finite is None:  # True, False, or a device flag (Runtime._finite_losses)
            self.losses_finite = runtime._finite_losses(self.outputs, self.optimizer) if self.finite else False
        if self.losses_finite is False:
            return
        ctx = self._context(step, None, self.iteration, True, False, None)
        flag = {} if self.losses_finite is True else {"finite": self.losses_finite}  # the update reads it
        self.optimizer.update(runtime.xp, self.iteration, runtime._entries_of(step, self.optimizer), ctx.scratch,
                              **flag)

    def _settle_all(self, step):
        """An Update or Accumulate that names no gradients reads every parameter and gradient."""
        if not step.grads:
            self._settle(list(self.pending))
        else:
            self._settle_roots(step)

    def encode(self, step):
        """A layer's own form through the layer (what its backward reads), a tensor's through
        the codecs (scheduler/encode.py)."""
        self._settle_roots(step)
        ctx = self._context(step, None, self.draw, True, False, None)
        if step.source is None:
            node = self.graph.nodes[step.node]
            bottoms, tops = node.layer.backward_operands(node.bottoms, node.tops, self.view)
            node.layer.encode(ctx, step.codec, bottoms, tops, self.view(step.tensor))
        else:
            codecs.encode(ctx, step.codec, self.view(step.source), self.view(step.tensor))

    def decode(self, step):
        self._settle_roots(step)
        ctx = self._context(step, None, self.draw, True, False, None)
        codecs.decode(ctx, step.codec, self.view(step.tensor), self.view(step.source))

    def allreduce(self, step):
        """Pack the gradients of ``step``'s bucket into it and start its sum over the ranks."""
        self._settle_roots(step)
        bucket, at = self.view(step.tensor), 0
        for g in step.grads:
            grad = self.view(g)
            bucket[at:at + grad.size] = grad.reshape(-1)
            at += grad.size
        self.reducing[step.tensor] = self.runtime.group.start(bucket)

    def waitreduce(self, step):
        """Wait for the bucket's sum, then write the ranks' average into its gradients."""
        self._settle_roots(step)
        group = self.runtime.group
        group.wait(self.reducing.pop(step.tensor), f"the all-reduce of {step.tensor} in iteration {self.iteration}")
        bucket, at = self.view(step.tensor), 0
        bucket /= group.size
        for g in step.grads:
            grad = self.view(g)
            grad[...] = bucket[at:at + grad.size].reshape(grad.shape)
            at += grad.size

    def _context(self, step, node, iteration, train, recompute, feed):
        runtime = self.runtime
        ws = self.view(step.workspace) if step.workspace else None
        return Context(runtime.xp, train=train, recompute=recompute, workspace=ws, algo=step.algorithm,
                       seed=step_seed(runtime.seed, iteration, -1 if node is None else node.index),
                       feed=feed, backend=runtime.backend, ranks=runtime.sync_bn,
                       labels_checked=node is not None and node.name in runtime._labels_checked)


class _Copies(Copies):
    """The copies of a Runtime's run, for its Execution: each starts on the backend's copy
    queues between the arena and the host arena, and a Wait that really has to wait counts in
    ``runtime.blocked``; a gradient's copy landing lets the host optimiser update it."""

    def __init__(self, runtime):
        self.runtime = runtime

    def start(self, name, nbytes, kind):
        runtime = self.runtime
        device = runtime.arena.view(name, (nbytes,), "uint8")
        host = runtime.host.view(name, (nbytes,), "uint8")
        if runtime.copies is None:
            runtime.copies = copies_for(runtime.backend)
        if kind == OFFLOAD:
            return runtime.copies.start(host, device, "d2h")
        return runtime.copies.start(device, host, "h2d")

    def wait(self, name, copy, what, planned):
        runtime = self.runtime
        if planned and not copy.done():
            runtime.blocked += 1
        copy.wait()
        updater = runtime.updater
        if what == OFFLOADING and updater is not None and updater.active and name in updater.entries:
            # a parameter's gradient: its update can start, from its host copy
            info = runtime.tensors[name]
            updater.landed(name, copy, runtime.host.view(name, info.shape, info.dtype))

    def applied(self, name):
        updater = self.runtime.updater
        if updater is not None and updater.active:
            updater.applied(name)
