"""The update in the backward: each parameter is updated on the device as soon as its gradient
is complete, and the gradient's memory is free from then on (the optimiser-in-backward of
LOMO, Lv et al. 2023, and of PyTorch's post-accumulate-grad hooks).

Caffe, PyTorch and the other policies keep every parameter gradient resident all iteration,
for one Update step at the end: as many bytes as the parameters (98 MiB on ResNet-50, 528
MiB on VGG-16). Here each layer's Backward, which writes its parameters' gradients, is
followed by an ``Update`` of those parameters alone, and the gradients become ordinary
scheduled tensors: liveness allocates each before the Backward that writes it and frees it
after its Update, so at any step the device holds the gradients of one layer, not of all.

The arithmetic is the optimiser's own, parameter by parameter, as the one Update does it (it
loops over the parameters), so the parameters after an iteration are the same bits. Nothing
reads a parameter after its own layer's Backward in the iteration (a Recompute of a layer runs
before that layer's Backward), so updating it there changes nothing else.

It applies where each gradient is final when its Backward ends and the update can take one
parameter at a time: an optimiser, no clipping by the global norm, one round (no iter_size
sum), one rank (no all-reduce of buckets), parameters on the device (parameter offload has its
own host diet: params.py). Test schedules lose the gradients from their resident tensors too,
since they share the Runtime's resident layout. The ``optimal`` and ``auto`` policies apply it
first (optimal.py): every plan they weigh has it.
"""

from .schedule import add_workspace
from .steps import BACKWARD, COMMUNICATION, MEMORY, UPDATE, Alloc, Free, Update


def applies(schedule, context=None):
    """Whether the update can follow each Backward in ``schedule`` (see the module's
    docstring): the same answer for a net's training and test schedules, so it asks the
    optimiser, which both have, not the schedule (a test schedule has one round and no
    update, whatever the iter_size)."""
    optimizer = schedule.optimizer
    return (optimizer is not None and not optimizer.needs_every_gradient and optimizer.iter_size == 1
            and not schedule.host_resident and getattr(context, "ranks", 1) == 1
            and not any(s.kind in COMMUNICATION for s in schedule.steps))


def updated_in_backward(graph):
    """The parameter gradients updated right after their Backward: those of every layer that
    runs one in training (a layer of the TEST phase alone keeps its gradient resident, for the
    last Update, as before)."""
    return [g for n in graph.nodes if n.backward and "TRAIN" in n.phases for g in n.param_grads.values()]


def update_in_backward(schedule, context=None):
    """The pass (on the lowered schedule, before the others): see the module's docstring;
    ``schedule`` unchanged where it does not apply."""
    graph = schedule.graph
    moved = set(updated_in_backward(graph)) if applies(schedule, context) else set()
    if not moved:
        return schedule
    resident = [t for t in schedule.resident if t not in moved]
    if not schedule.train:
        return schedule.replace(resident=resident)
    tensors = dict(schedule.tensors)
    rest = tuple(g for n in graph.nodes for g in n.param_grads.values() if g not in moved)
    last = next(s for s in schedule.steps if s.kind == UPDATE)
    steps = [Alloc(g) for g in sorted(moved)]  # the baseline's way; liveness makes them short
    for step in schedule.steps:
        if step.kind in MEMORY and last.workspace and step.tensor == last.workspace and not rest:
            continue  # the last Update goes, and its workspace with it
        if step.kind == UPDATE:
            steps += [step._replace(grads=rest)] if rest else []
            continue
        steps.append(step)
        if step.kind == BACKWARD:
            steps += _update_after(graph.nodes[step.node], moved, tensors, schedule.optimizer, graph.dtype)
    steps += [Free(g) for g in sorted(moved)]
    return schedule.replace(steps, tensors=tensors, resident=resident)


def _update_after(node, moved, tensors, optimizer, dtype):
    """The steps that update ``node``'s parameters after its Backward: the Update of their
    gradients, with a workspace of its own (the optimiser's scratch for them) where it needs
    one."""
    keys = [k for k, g in node.param_grads.items() if g in moved]
    if not keys:
        return []
    grads = tuple(node.param_grads[k] for k in keys)
    nbytes = optimizer.workspace_bytes([tensors[node.params[k]].shape for k in keys], dtype)
    if not nbytes:
        return [Update(None, grads)]
    ws = add_workspace(tensors, f"ws:update:{node.name}", nbytes)
    return [Alloc(ws), Update(ws, grads), Free(ws)]
