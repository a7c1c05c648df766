"""The graph's backward: which layers run it, which tensors get gradients, which in-place writes may alias."""

from .tensors import TensorInfo


def mark_gradients(nodes, tensors, dtype):
    """Decide which of ``nodes`` run backward and which tensors have gradients: set each node's
    gradient names and add the gradients to ``tensors``, aliased where written in place."""
    # Forward sweep: tensors that depend on a learnable parameter.
    requires = set()
    training = [n for n in nodes if "TRAIN" in n.phases]  # only these run backward
    for n in training:
        learnable = any(tensors[t].kind == "param" for t in n.params.values())
        if n.layer.BACKWARD and (learnable or any(
                b in requires for i, b in enumerate(n.bottoms) if i not in n.layer.LABEL_BOTTOMS)):
            requires.update(n.tops)
    # Backward sweep: tensors that reach a loss.
    contributes = set()
    for n in reversed(training):
        if n.loss_weight or any(t in contributes for t in n.tops):
            if n.layer.BACKWARD:
                contributes.update(b for i, b in enumerate(n.bottoms)
                                   if i not in n.layer.LABEL_BOTTOMS)
            if n.loss_weight:
                contributes.update(n.tops)
    for n in nodes:
        learnable = {k: t for k, t in n.params.items() if tensors[t].kind == "param"}
        n.top_grads = [f"{t}.grad" if t in requires and t in contributes else None
                       for t in n.tops]
        n.bottom_grads = [f"{b}.grad" if b in requires and b in contributes
                          and i not in n.layer.LABEL_BOTTOMS else None
                          for i, b in enumerate(n.bottoms)]
        n.backward = n.layer.BACKWARD and any(g is not None for g in n.top_grads) and (
            bool(learnable) or any(g is not None for g in n.bottom_grads))
        if n.backward:
            n.param_grads = {k: f"{t}.grad" for k, t in learnable.items()}
        else:
            n.bottom_grads = [None] * len(n.bottoms)
    for n in nodes:
        for t, g in zip(n.tops, n.top_grads):
            if g is not None:
                tensors[g] = TensorInfo(g, tensors[t].shape, dtype, "grad")
        for k, g in n.param_grads.items():
            tensors[g] = TensorInfo(g, tensors[n.params[k]].shape, dtype, "param_grad")
    # An in-place layer writes its bottom's gradient over its top's; a view's (Flatten,
    # Reshape) bottom gradient is its top gradient seen in the bottom's shape.
    for n in nodes:
        if n.backward and (n.layer.ALIAS_GRADS or n.inplace) and n.bottom_grads[0] is not None:
            tensors[n.bottom_grads[0]].alias = n.top_grads[0]


def inplace_choice(pos, order, views, readers, backward_readers):
    """``(inplace, kept)`` for the layer at ``pos``: whether its top may share its bottom's
    memory, and if it asked to (Caffe's ``top == bottom``) but may not, why (what it keeps).

    The write may not destroy a value still read: the bottom, by this layer's backward or
    another's; or a view of the same memory (Split, Flatten, Reshape tops), by a forward
    after it or by another layer's backward. (A forward reader of the written version itself
    always comes before the write.)"""
    ls, layer, bottoms, tops = order[pos]
    if not tops or "@" not in tops[0] or layer.ALIAS_TOPS:
        return False, None
    if ls.tops[0] != ls.bottoms[0]:
        return False, f"its first top overwrites its bottom '{ls.tops[0]}' out of place"
    if layer.top_shapes[0] != layer.bottom_shapes[0]:
        return False, "its top's shape differs from its bottom's"
    shared, todo = {bottoms[0]}, [bottoms[0]]
    while todo:
        for w in views.get(todo.pop(), ()):
            if w not in shared:
                shared.add(w)
                todo.append(w)
    names = [ls.name] if not layer.INPLACE and 0 in layer.backward_reads()[0] else []
    for w in [bottoms[0]] + sorted(shared - {bottoms[0]}):
        names += [rls.name for rls, rlayer in backward_readers.get(w, ()) if rlayer is not layer]
        later = [order[p][0].name for p in readers.get(w, ()) if p > pos and not order[p][1].ALIAS_TOPS]
        if names or later:
            why = []
            if names:
                why.append("read by the backward of " + ", ".join(f"'{r}'" for r in names))
            if later:
                why.append("read later by " + ", ".join(f"'{r}'" for r in later))
            return False, f"keeps '{w}', " + " and ".join(why)
    if not layer.INPLACE:
        return False, f"{layer.type} does not run in place"
    return True, None
