"""Data-parallel training: the gradients' all-reduce across ranks as steps of the plan (as
PyTorch DDP and Horovod bucket it).

The parameter gradients are grouped into buckets in the order the backward produces them
(the last layer's first), each bucket closed once it holds ``Context.bucket_bytes`` or the
backward ends. A bucket is a tensor of kind ``bucket`` in the arena, so liveness, placement
and the Simulator count it like any other; the pass inserts, right after the backward step
that writes a bucket's last gradient, ``AllReduce(bucket)`` (its gradients are packed into it
and its reduction starts, overlapping the rest of the backward) and, just before the Update
(or, with iter_size, the Accumulate) that reads them, ``WaitReduce(bucket)`` (the reduction
has ended; the ranks' average is written back into the gradients). Each bucket is allocated
right before its AllReduce and freed right after its WaitReduce, which is where liveness puts
it too.

Under parameter offload (``+params``) the gradients go to the host as soon as they are
reduced: each bucket is waited for once the next one has started (the last before the
Update), and params.py copies its gradients to the host after its WaitReduce. So the device
holds at most two buckets' gradients at once, and the host optimiser still overlaps the backward.
"""

from ..graph.tensors import TensorInfo
from ..options import DEFAULT_BUCKET_BYTES
from .steps import BACKWARD, COMMUNICATION, FORWARD, FREE, RESIDENT_ONLY, Alloc, AllReduce, Free, WaitReduce


def buckets_of(schedule, bucket_bytes=DEFAULT_BUCKET_BYTES):
    """``[(index of the backward step that writes its last gradient, [gradients])]``: the
    buckets of ``schedule``'s parameter gradients, in the order the backward writes them, each
    closed once it holds ``bucket_bytes`` (a gradient larger than that has one of its own)."""
    graph, tensors = schedule.graph, schedule.tensors
    last_writer = {}  # a gradient two layers share is complete after the later of them
    for i, step in enumerate(schedule.steps):
        if step.kind == BACKWARD:
            for g in graph.nodes[step.node].param_grads.values():
                last_writer[g] = i
    complete = {}
    for g, i in last_writer.items():
        complete.setdefault(i, []).append(g)
    out, current, size = [], [], 0
    for i in sorted(complete):
        for g in complete[i]:
            current.append(g)
            size += tensors[g].nbytes
        if size >= bucket_bytes:
            out.append((i, current))
            current, size = [], 0
    if current:
        out.append((max(complete), current))
    return out


def allreduce(schedule, context):
    """The pass: ``schedule`` with its gradients all-reduced across ``context.ranks`` ranks in
    buckets of ``context.bucket_bytes`` (no change for one rank or a test schedule)."""
    if context.ranks <= 1 or not schedule.train:
        return schedule
    found = buckets_of(schedule, context.bucket_bytes)
    if not found:
        return schedule
    eager = context.offload_params  # see the module's docstring
    tensors = dict(schedule.tensors)
    dtype = schedule.graph.dtype
    issue = {}  # backward step index → the buckets it completes
    for k, (i, grads) in enumerate(found):
        name = f"bucket:{k}"  # a colon, as workspaces' names: no layer's top is called so
        elements = sum(tensors[g].nbytes for g in grads) // dtype.itemsize
        tensors[name] = TensorInfo(name, (elements,), dtype, "bucket")
        issue.setdefault(i, []).append((name, grads))
    out, due, started = [], [], []
    for i, step in enumerate(schedule.steps):
        if due and step.kind != FREE:  # after the backward's own Frees (its workspace): the
            out += _issue(due, started, eager)  # bucket need not sit beside the workspace
            due = []
        if step.kind in RESIDENT_ONLY:  # with iter_size, each round's average is what it sums
            out += [s for bucket in started for s in _wait(*bucket)]
            started = []
        out.append(step)
        due += issue.get(i, ())
    out += _issue(due, started, eager)
    out += [s for bucket in started for s in _wait(*bucket)]  # no Update (forward_backward): at the end
    return schedule.replace(out, tensors=tensors)


def _issue(due, started, eager):
    """The steps that start the buckets ``due`` (``started`` grows by them); under ``eager``,
    each one started waits for the one before it."""
    out = []
    for name, grads in due:
        out += [Alloc(name), AllReduce(name, grads)]
        if eager and started:
            out += _wait(*started.pop())
        started.append((name, grads))
    return out


def _wait(name, grads):
    return [WaitReduce(name, grads), Free(name)]


def collective_order(schedule, sync_bn=False):
    """The steps of ``schedule`` that make collectives, in the order it runs them, as
    ``(kind, bucket or layer)``: each bucket's AllReduce and WaitReduce, and with synchronised
    BatchNorm (``sync_bn``) each BatchNorm's Forward and Backward, which sum over the ranks
    inside the layer (a Recompute does not: it normalises with the statistics its Forward
    saved). Every rank must make them in the same order, and each rank plans alone: its plan
    may differ from another's where it follows measured times or a solver stopped by its time
    limit (what changes the order: the buckets, one rank's schedule putting a Backward
    before another's)."""
    graph, out = schedule.graph, []
    for step in schedule.steps:
        if step.kind in COMMUNICATION:
            out.append((step.kind, step.tensor))
        elif sync_bn and step.kind in (FORWARD, BACKWARD) and graph.nodes[step.node].layer.type == "BatchNorm":
            out.append((step.kind, graph.nodes[step.node].name))
    return out


def sync_bn_sums(schedule):
    """The bytes of each all-reduce that synchronised BatchNorm makes in one iteration of
    ``schedule``, in order: for each BatchNorm that normalises by its batch's statistics, two
    of its channels' sums in its Forward (the mean, then the variance, which needs the mean)
    and one of both its backward's sums together in its Backward. None of them overlaps
    anything: the layer's next operation reads the result."""
    graph, out = schedule.graph, []
    for kind, name in collective_order(schedule, sync_bn=True):
        if kind in COMMUNICATION:
            continue
        node = graph.node(name)
        if node.layer.cfg["use_global_stats"]:
            continue
        sums = int(graph.tensors[node.tops[0]].shape[1]) * graph.dtype.itemsize
        out += [2 * sums] if kind == BACKWARD else [sums, sums]
    return out
