"""lower(): a Graph → the baseline Schedule, where every activation and gradient lives all
iteration (network-wide allocation, as in Caffe) and each step's workspace lives for that step.

Memory steps name storage roots only: tensors that alias another (in-place tops, Split tops,
in-place gradients) take no storage of their own.
"""

from ..graph.tensors import TensorInfo
from .schedule import Schedule, add_workspace
from .steps import Accumulate, Alloc, Backward, Forward, Free, Update

ACCUM = ".accum"  # a parameter gradient's accumulator is named after it: conv1/weight.grad.accum


def rounds_of(optimizer):
    """Micro-batches per iteration: the optimiser's ``iter_size`` (1 without one)."""
    return optimizer.iter_size if optimizer is not None else 1


def resident_tensors(graph, optimizer=None):
    """Resident tensors in placement order (params and state, their gradients, optimiser
    state, and with ``iter_size`` > 1 the gradients' accumulators), adding the optimiser's
    tensors to ``graph.tensors``' copy returned too."""
    tensors = dict(graph.tensors)
    params = [t for n in graph.nodes for t in n.params.values()]
    grads = [g for n in graph.nodes for g in n.param_grads.values()]
    state = []
    if optimizer is not None:
        for n in graph.nodes:
            for t in n.params.values():
                info = tensors[t]
                if info.kind != "param":
                    continue
                for k in range(optimizer.slots):
                    name = f"{t}.{optimizer.state_name(k)}"
                    tensors[name] = TensorInfo(name, info.shape, info.dtype, "state")
                    state.append(name)
    if rounds_of(optimizer) > 1:  # a second copy of every gradient: the sum over the rounds
        for g in grads:
            info = tensors[g]
            tensors[g + ACCUM] = TensorInfo(g + ACCUM, info.shape, info.dtype, "accum")
            state.append(g + ACCUM)
    return tensors, params + grads + state


def _step(graph, tensors, node, phase):
    algo = node.layer.algorithms(phase)[0]  # the default: the passes choose others
    ws = None
    if algo.workspace > 0:
        ws = add_workspace(tensors, f"ws:{node.name}:{phase}", algo.workspace)
    make = Forward if phase == "forward" else Backward
    return make(node.index, algo.name, ws)


def lower(graph, train=True, optimizer=None):
    """The baseline schedule of one iteration: a training iteration (forward, backward and,
    with an optimiser, the update; with its ``iter_size`` K > 1, K rounds of them that an
    Accumulate step ends, the update in the last) or, with ``train=False``, a forward pass for
    testing."""
    tensors, resident = resident_tensors(graph, optimizer)
    kinds = ("data", "grad") if train else ("data",)
    roots = [t.name for t in graph.tensors.values() if t.kind in kinds and t.alias is None]
    steps = [Alloc(t) for t in roots]
    phase = "TRAIN" if train else "TEST"
    nodes = [n for n in graph.nodes if phase in n.phases]  # Caffe's include/exclude
    for node in nodes:
        steps += _with_workspace(_step(graph, tensors, node, "forward"))
    if train:
        for node in reversed(nodes):
            if node.backward:
                steps += _with_workspace(_step(graph, tensors, node, "backward"))
        rounds = rounds_of(optimizer)
        if rounds > 1:
            steps.append(Accumulate())
        if optimizer is not None:
            shapes = [tensors[t].shape for t in resident if tensors[t].kind == "param"]
            nbytes = optimizer.workspace_bytes(shapes, graph.dtype)
            ws = add_workspace(tensors, "ws:update", nbytes) if nbytes > 0 else None
            steps += _with_workspace(Update(ws))
    steps += [Free(t) for t in reversed(roots)]
    rounds = rounds_of(optimizer) if train else 1
    # the update needs every gradient at once: clipping by their global norm, or a sum over rounds
    whole = optimizer is not None and (optimizer.needs_every_gradient or rounds > 1)
    return Schedule(graph, tensors, resident, steps, train=train, policy="baseline", whole_update=whole,
                    rounds=rounds, optimizer=optimizer)


def _with_workspace(step):
    if step.workspace is None:
        return [step]
    return [Alloc(step.workspace), step, Free(step.workspace)]
