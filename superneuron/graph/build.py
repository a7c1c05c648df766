"""Graph: the layers of a NetSpec in execution order, with every tensor's shape, kind and bytes.

Building the graph is where a network is checked as a whole (every problem is reported before
anything runs, as ``file:line:col: layer 'x' (Type): what``): dangling bottoms, a top written
twice, cycles, shapes that do not fit, and in-place requests that would corrupt a gradient.

Tensor names: a top keeps its name; a top written in place (Caffe's ``top == bottom``) is a
new version ``name@layer``. In place is a request, as in Caffe, where any chain such as
conv → BatchNorm → Scale → ReLU on one blob is accepted: the version shares the previous
version's memory (``alias``) unless that would destroy a value some backward still reads (the
layer's own, such as Scale's, or an earlier layer's, such as BatchNorm's x_hat under a Scale).
Then it gets memory of its own, so the value it would have destroyed stays an ordinary tensor
that the scheduler sees, frees, offloads or recomputes like any other (``Node.kept`` says
which and why). One kept value serves every backward that reads it: in conv → BatchNorm →
Scale → ReLU, x_hat is kept once for both BatchNorm's and Scale's backward, and the ReLU
writes over Scale's output, since its backward needs only its own output.

Where one tensor feeds several layers a ``Split`` is inserted (as Caffe does): its tops are
views of the tensor, and its backward adds their gradients, so every gradient has exactly one
writer. The tops of every view layer (``ALIAS_TOPS``: Split, Flatten, Reshape) alias its bottom,
with their own shapes; Flatten's and Reshape's bottom gradients alias their top gradients
(``ALIAS_GRADS``). The gradient of tensor ``t`` is ``t.grad``; parameter ``p`` of layer ``l`` is
``l/p``.
Internal names cannot be spelt by users: ``@`` and ``#`` are refused in names (in-place
versions and Splits, ``t#split``, ``t#0``..., use them), and a top may not end in ``.grad``
nor take the name of a parameter.
"""

import math

import numpy as np

from ..errors import LayerError, SpecError, where
from ..layers import layer_class
from ..layers.input import FED_TYPES
from ..limits import MAX_PROBLEMS, MAX_TENSOR_BYTES, over
from ..netfile.rules import PHASES
from .backward import inplace_choice, mark_gradients
from .tensors import Node, TensorInfo, storage_root


class Graph:
    """Layers in execution order and their tensors, built and checked from a NetSpec."""

    def __init__(self, spec, dtype=np.float32, kernels=None):
        """``kernels``: the device's vendor kernels (layers/cudnn.py) the layers may offer as
        algorithms; None for the portable NumPy/CuPy ones."""
        self.spec, self.dtype, self.kernels = spec, np.dtype(dtype), kernels
        self.name = spec.name
        self.tensors = {}
        self.nodes = []
        self._by_name = {}
        self._problems = []
        layers = self._instantiate(spec)
        order = self._resolve(layers)
        self._check_names(order)
        if not self._problems:
            self._build(order)
        if not self._problems:
            mark_gradients(self.nodes, self.tensors, self.dtype)
        if self._problems:
            raise SpecError(self._problems)

    # -- helpers -------------------------------------------------------------------------
    def _where(self, ls):
        return where(ls.file, ls.line, ls.col, ls.name, ls.type)

    def _problem(self, ls, message):
        self._problems.append(self._where(ls) + message)

    def root(self, name):
        """The tensor whose memory ``name`` uses (follows aliases)."""
        return storage_root(self.tensors, name)

    def node(self, name):
        """The node of the layer called ``name``."""
        return self._by_name[name]

    @property
    def inputs(self):
        """The nodes that take data from outside (Input, Data, HDF5Data, MemoryData)."""
        return [n for n in self.nodes if n.layer.type in FED_TYPES]

    @property
    def losses(self):
        """The nodes whose top is a weighted term of the loss."""
        return [n for n in self.nodes if n.loss_weight]

    def tensors_of_kind(self, *kinds):
        return [t for t in self.tensors.values() if t.kind in kinds]

    # -- building ------------------------------------------------------------------------
    def _instantiate(self, spec):
        layers = []
        trains_on = any("TRAIN" in ls.phases and ls.type in FED_TYPES for ls in spec.layers)
        for ls in spec.layers:
            if ls.phases == {"TEST"} and ls.type in FED_TYPES and trains_on:
                # a train_val file's test input: the test runs on the training input's tensors,
                # fed by the test loader (its batch size and source are the data's concern)
                continue
            try:
                cls = layer_class(ls.type)
            except KeyError as e:
                self._problem(ls, str(e.args[0]))
                continue
            layer = cls(ls.name, ls.bottoms, ls.tops, ls.cfg, dtype=self.dtype)
            layer.kernels, layer.source_file = self.kernels, ls.file
            layers.append((ls, layer))
        return layers

    def _resolve(self, layers):
        """Order the layers so every bottom is produced first; find versions of in-place tops.

        Returns ``[(LayerSpec, Layer, bottom_versions, top_versions)]`` in execution order."""
        producers = {}  # name -> [(position, LayerSpec)]
        for pos, (ls, _) in enumerate(layers):
            for t in ls.tops:
                producers.setdefault(t, []).append((pos, ls))
        for t, prods in producers.items():
            first = prods[0][1]
            for _, ls in prods[1:]:
                if t not in ls.bottoms:
                    self._problem(ls, f"top '{t}' is already written by layer '{first.name}' "
                                      f"(line {first.line}); only an in-place layer (top == bottom) "
                                      f"may write it again")
        resolved = []
        version = {}  # name -> latest version name, in file order
        for ls, layer in layers:
            bottoms = []
            for b in ls.bottoms:
                if b in version:
                    bottoms.append(version[b])
                elif b in producers and any(other is not ls for _, other in producers[b]):
                    cycle = _cycle(ls, b, producers)
                    if cycle:
                        self._problem(ls, "cycle: " + " → ".join(cycle))
                    else:
                        later = producers[b][0][1]
                        self._problem(ls, f"bottom '{b}' is produced later, by layer '{later.name}' "
                                          f"(line {later.line}): a layer must come after what it reads")
                    bottoms.append(None)
                else:
                    # past MAX_PROBLEMS no hint: a near match among 20 000 names, each time, is slow
                    hint = _close_hint(b, list(version)) if len(self._problems) < MAX_PROBLEMS else ""
                    self._problem(ls, f"bottom '{b}' is not produced by any layer or input" + hint)
                    bottoms.append(None)
            tops = []
            for t in ls.tops:
                v = t if t not in version else f"{t}@{ls.name}"
                tops.append(v)
            for t, v in zip(ls.tops, tops):
                version[t] = v
            resolved.append((ls, layer, bottoms, tops))
        return resolved

    def _check_names(self, order):
        """Names users write must not spell the graph's own (versions, Splits, gradients,
        parameters, workspaces): such a collision would silently share memory."""
        for ls, _, _, _ in order:
            if "@" in ls.name or "#" in ls.name:
                self._problem(ls, "layer names may not contain '@' or '#' (superneuron names its "
                                  "own splits with them)")
            for t in ls.tops:
                if "@" in t or "#" in t:
                    self._problem(ls, f"top '{t}': names may not contain '@' or '#' (superneuron "
                                      f"names in-place versions and splits with them)")
                elif t.endswith(".grad") or t.startswith("ws:"):
                    self._problem(ls, f"top '{t}': names ending in '.grad' or starting with 'ws:' "
                                      f"are superneuron's own (gradients, workspaces); rename it")

    def _build(self, order):
        readers = {}  # version -> [position] of layers reading it
        for pos, (_, _, bottoms, _) in enumerate(order):
            for b in bottoms:
                readers.setdefault(b, []).append(pos)
        backward_readers = {}  # version -> [(LayerSpec, Layer)] whose backward reads it
        views = {}  # version -> versions that are views of it or it of them (ALIAS_TOPS layers)
        for ls, layer, bottoms, tops in order:
            if layer.BACKWARD:
                reads_b, reads_t = layer.backward_reads()
                for v in [bottoms[i] for i in reads_b] + [tops[i] for i in reads_t]:
                    backward_readers.setdefault(v, []).append((ls, layer))
            if layer.ALIAS_TOPS:
                for t in tops:
                    views.setdefault(t, []).append(bottoms[0])
                    views.setdefault(bottoms[0], []).append(t)
        shapes, inplace = {}, {}
        failed = set()
        for pos, (ls, layer, bottoms, tops) in enumerate(order):
            if any(b in failed for b in bottoms):
                failed.update(tops)
                continue
            try:
                top_shapes = layer.setup([shapes[b] for b in bottoms])
            except LayerError as e:
                self._problem(ls, str(e))
                failed.update(tops)
                continue
            if len(top_shapes) != len(tops):
                self._problem(ls, f"has {len(tops)} tops but produces {len(top_shapes)}")
                failed.update(tops)
                continue
            if self._too_large(ls, zip(ls.tops, top_shapes), "top"):
                failed.update(tops)
                continue
            layer.bottom_shapes = [tuple(shapes[b]) for b in bottoms]
            layer.top_shapes = [tuple(s) for s in top_shapes]
            for t, s in zip(tops, top_shapes):
                shapes[t] = tuple(s)
            inplace[ls.name] = inplace_choice(pos, order, views, readers, backward_readers)
        if self._problems:
            return
        # Insert Splits where a version is read more than once; each read gets its own top.
        split_cls = layer_class("Split")
        self._splits = {}  # version -> its Split node
        seen = {}
        for ls, layer, bottoms, tops in order:
            renamed = list(bottoms)
            for i, b in enumerate(bottoms):
                if len(readers[b]) > 1:
                    split = self._split_of(b, shapes[b], len(readers[b]), split_cls)
                    renamed[i] = split.tops[seen.get(b, 0)]
                    seen[b] = seen.get(b, 0) + 1
            node = self._add_node(ls, layer, renamed, tops, *inplace[ls.name])
            if node.inplace:
                self.tensors[tops[0]].alias = renamed[0]

    def _too_large(self, ls, named_shapes, what):
        """Record a problem for each tensor over MAX_TENSOR_BYTES; whether there was one."""
        found = False
        for name, shape in named_shapes:
            nbytes = math.prod(map(int, shape)) * self.dtype.itemsize
            if nbytes > MAX_TENSOR_BYTES:
                self._problem(ls, over(f"{what} '{name}' of shape {tuple(shape)} takes", nbytes,
                                       MAX_TENSOR_BYTES, "MAX_TENSOR_BYTES", " bytes"))
                found = True
        return found

    def _split_of(self, version, shape, count, split_cls):
        """The Split node for ``version``, created just before its first reader; its name and
        its tops' (``version#split``, ``version#0``, ...) cannot be spelt in a file."""
        if version in self._splits:
            return self._splits[version]
        name = f"{version}#split"
        tops = [f"{version}#{k}" for k in range(count)]
        layer = split_cls(name, [version], tops, split_cls.config({}), dtype=self.dtype)
        layer.bottom_shapes = [shape]
        layer.top_shapes = layer.setup([shape])
        node = self._splits[version] = self._add_node(None, layer, [version], tops)
        return node

    def _add_node(self, ls, layer, bottoms, tops, inplace=False, kept=None):
        # a fed layer runs in both phases: a train_val file's TEST input was dropped for it
        # (_instantiate), so the test forward reads its tensors, fed by the test loader
        both = ls is None or ls.type in FED_TYPES
        node = Node(len(self.nodes), layer, ls, list(bottoms), list(tops), inplace=inplace, kept=kept,
                    phases=PHASES if both else ls.phases)
        for t, s in zip(tops, layer.top_shapes):
            if t in self.tensors:  # only a parameter's name can be taken already
                self._problem(ls, f"top '{t}' has the name of a parameter ('layer/param'); rename it")
            # a view (Split, Flatten, Reshape); an in-place version is aliased by _build
            alias = bottoms[0] if layer.ALIAS_TOPS else None
            self.tensors[t] = TensorInfo(t, s, self.dtype, "data", alias)
        specs = layer.param_specs()
        if self._too_large(ls, [(f"{layer.name}/{p.name}", p.shape) for p in specs], "parameter"):
            specs = []
        for k, p in enumerate(specs):
            tname = f"{layer.name}/{p.name}"
            if tname in self.tensors:
                self._problem(ls, f"parameter '{tname}' has the name of a top; rename that top")
            if ls is not None:
                p.lr_mult = ls.lr_mult[k] if k < len(ls.lr_mult) else p.lr_mult
                p.decay_mult = ls.decay_mult[k] if k < len(ls.decay_mult) else p.decay_mult
            self.tensors[tname] = TensorInfo(tname, tuple(p.shape), self.dtype,
                                             "param" if p.learnable else "state")
            node.params[p.name] = tname
            node.param_specs[p.name] = p
        if layer.LOSS or (layer.ANY_TOP_LOSS and ls is not None and ls.loss_weight):
            node.loss_weight = 1.0 if ls is None or ls.loss_weight is None else float(ls.loss_weight)
        elif ls is not None and ls.loss_weight:
            self._problem(ls, "loss_weight is only allowed on loss layers")
        self.nodes.append(node)
        self._by_name[layer.name] = node
        return node

def _cycle(ls, bottom, producers):
    """Layer names on a cycle from ``ls`` back to itself through ``bottom``, or None."""
    stack, seen = [(producers[bottom][0][1], [ls.name])], set()
    while stack:
        layer, path = stack.pop()
        if layer.name == ls.name:
            return path + [ls.name]
        if layer.name in seen:
            continue
        seen.add(layer.name)
        for b in layer.bottoms:
            if b in producers and b not in layer.tops:
                stack.append((producers[b][0][1], path + [layer.name]))
    return None


def _close_hint(name, known):
    import difflib
    close = difflib.get_close_matches(name, known, n=1)
    return f"; did you mean '{close[0]}'?" if close else ""
