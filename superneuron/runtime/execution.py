"""One round of a schedule on the Runtime's arena: :class:`Execution`, the walker
(scheduler/walk.py) whose memory and copy steps are the base walker's, as in the Simulator,
with real copies behind them (:class:`_Copies`), so it makes the same allocator calls as the
Simulator, in the same order, and the arena's peak is the plan's; its compute steps run the
layers' kernels. A step that touches a tensor whose copy is still running without a Wait
before it is a *stall*: it waits for the copy and counts it in ``runtime.stalls``.

Data-parallel (a ``group`` of ranks, runtime/collective.py): an AllReduce packs its
gradients into its bucket (a tensor of the arena) and starts the bucket's sum over the ranks;
its WaitReduce waits for it and writes the ranks' average back into the gradients.
"""

from ..layers import codecs
from ..layers.base import Context
from ..layers.norm import ScaleAfter
from ..scheduler.liveness import Roots, step_roots
from ..scheduler.steps import OFFLOAD
from ..scheduler.walk import OFFLOADING, Copies, Walker
from .copies import copies_for


def step_seed(seed, iteration, node_index):
    """The random seed of one layer in one iteration: the same whenever that step is re-run
    (recompute), different between layers and iterations."""
    return (int(seed) * 1_000_003 + int(iteration)) * 65_537 + int(node_index) & (2**63 - 1)


class Execution(Walker):
    """One round of a schedule on a Runtime (executor.py): the walker whose compute steps run
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
        after = [self.graph.nodes[n] for n in step.fused or ()]  # what its pass runs after it
        ctx.relu = bool(after) and after[-1].layer.type == "ReLU"  # in place on the last top
        if after and after[0].layer.type == "Scale":  # a BatchNorm's Scale (Layer.fuses_scale)
            scale = after[0]
            ctx.scale = ScaleAfter(scale.layer, {k: view(t) for k, t in scale.params.items()}, view(scale.tops[0]))
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
