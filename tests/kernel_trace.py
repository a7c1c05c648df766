"""An independent witness of a run: every array the Runtime hands to a layer's kernel.

The plan-equals-run tests must not believe the Runtime's own bookkeeping (its Arena makes the
Simulator's calls, so comparing the two is equal by construction). This module wraps
``forward`` and ``backward`` of every registered layer class (the Layer contract, which any
executor must call) and records, for each call, each operand's graph name, role, byte offset
from the one block all of them are views of, size, and a digest of its bytes. From those alone
it derives what a run really used:

- ``locate()``: the one NumPy block every operand is a view of (the arena, if the design
  holds), and each operand's offset in it;
- ``high_water``: the highest byte any kernel touched (offset + size), to compare with the
  plan's arena;
- ``instances()``: each stored value (graph storage root at one offset; an in-place pair is
  one value) from its first kernel touch to its last, ended early where a kernel touches
  another root in its bytes;
- ``live_peak()``: the resident bytes plus the most bytes of values alive at one call, each
  rounded up to the arena's documented 256-byte alignment; without copies (which no kernel
  makes, so the witness cannot see them) this is the run's liveness, to compare with the
  plan's peak;
- ``clashes()``: operands of one call that share bytes without being one value or an
  in-place pair (an ``INPLACE`` layer's top over its bottom, at exactly the same place);
- ``violations``: every read that does not see the bytes last written under that name (freed
  early and overwritten, a copy not waited for, a kept value destroyed), every recompute that
  writes bytes other than the forward wrote (a Dropout mask drawn anew), and every recompute
  that changes a parameter or state buffer (BatchNorm's statistics updated twice).

Gist's Encode and Decode steps (scheduler/encode.py) are kernel calls too: a layer's own form
(``Layer.encode``, max pooling's argmax, or its ``forward`` given ``ctx.encoded``, which then
writes that form beside its top) and the codecs' (``codecs.encode`` and
``codecs.decode``) are wrapped, their operands recorded like any other (``source``: the map,
named by the last kernel write to its bytes; ``encoded``: its form, named as encode.py names
it). An Encode must read what was written to its source; a Decode, and a Backward that reads a
layer's form, must read the bytes its Encode wrote (not, say, a freed buffer's new contents);
a Decode must give back what the form keeps of the value encoded (its signs, its half
precision, or every bit), and from then on its bytes are what the value's names hold.

Only the CPU backend is traced (operands must be NumPy arrays).
"""

import hashlib
from dataclasses import dataclass, field

import numpy as np

try:
    from numpy.lib.array_utils import byte_bounds  # NumPy 2
except ImportError:  # NumPy 1
    byte_bounds = np.byte_bounds

from superneuron.layers import REGISTRY, codecs
from superneuron.scheduler.encode import direct_form

ALIGN = 256  # the arena's alignment (cudaMalloc's), stated in DESIGN.md's accounting


def aligned(n):
    return -(-int(n) // ALIGN) * ALIGN


def digest(a):
    return hashlib.blake2b(np.ascontiguousarray(a).view(np.uint8).data, digest_size=16).digest()


def owner(a):
    """The array at the end of ``a``'s chain of bases: the block it is a view of."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


@dataclass
class Operand:
    role: str       # bottom, top, param, top_grad, bottom_grad, param_grad, workspace
    name: str       # graph tensor name ('' for the workspace)
    array: np.ndarray
    offset: int = 0
    nbytes: int = 0


@dataclass
class Call:
    index: int
    node: object    # None: a codec's Encode or Decode of a tensor form
    phase: str      # forward, recompute, backward, encode, decode
    operands: list = field(default_factory=list)

    @property
    def label(self):
        what = self.node.name if self.node is not None else self.operands[0].name
        return f"{self.phase}({what})#{self.index}"


RESIDENT = ("param", "param_grad")
READS = {"forward": ("bottom",), "recompute": ("bottom",), "backward": ("bottom", "top", "top_grad", "encoded"),
         "encode": ("bottom", "top", "source"), "decode": ("encoded",)}
WRITES = {"forward": ("top", "encoded"), "recompute": ("top",), "backward": ("bottom_grad", "param_grad"),
          "encode": ("encoded",), "decode": ("source",)}
# What a Decode must give back of the value encoded, by codec: a digest of it
KEPT = {"sign": lambda a: digest(a > 0), "fp16": lambda a: digest(a.astype(np.float16)), "sparse": digest}


class KernelTrace:
    """Records the kernel calls of ``net`` while installed (see :meth:`install`)."""

    def __init__(self, net, resident_params=True):
        self.net, self.graph = net, net.graph
        self.nodes = {id(n.layer): n for n in net.graph.nodes}
        self.resident_params = resident_params  # False under parameter offload
        self.calls, self.violations = [], []
        self.written = {}       # name → digest of its bytes as last written by a kernel
        self.root_written = {}  # storage root → digest of the last value written there
        self.forward_digest = {}  # name → digest its forward wrote (recompute must match)
        self.unchecked_reads = set()  # names read that no kernel wrote (a loss's top gradient)
        self.at_bytes = {}      # (start, end) address → the name last written there
        self.kept = {}          # encoded form → (codec, digest of what it keeps, digest of the value)
        self.forms = {}         # node name → the name of its own encoded form, as last written
        self._depth = 0

    # -- recording ------------------------------------------------------------------------
    def install(self, monkeypatch):
        for cls in set(REGISTRY.values()):
            monkeypatch.setattr(cls, "forward", self._wrap(cls.forward, "forward"))
            monkeypatch.setattr(cls, "backward", self._wrap(cls.backward, "backward"))
            monkeypatch.setattr(cls, "encode", self._wrap(cls.encode, "encode"))
        monkeypatch.setattr(codecs, "encode", self._wrap_codec(codecs.encode, "encode"))
        monkeypatch.setattr(codecs, "decode", self._wrap_codec(codecs.decode, "decode"))
        return self

    def _wrap_codec(self, kernel, phase):
        trace = self

        def traced(ctx, codec, a, b):
            return trace._outermost(lambda: trace._record_codec(kernel, ctx, codec, a, b, phase),
                                    lambda: kernel(ctx, codec, a, b))
        return traced

    def _outermost(self, record, run):
        """``record()`` (which runs the kernel), or ``run()`` alone inside a kernel already
        recorded (a super() call, a kernel calling another)."""
        if self._depth:
            return run()
        self._depth += 1
        try:
            return record()
        finally:
            self._depth -= 1

    def _begin(self, call, ctx):
        """Record ``call`` (its workspace an operand too) and check what it reads."""
        if ctx.workspace is not None:
            call.operands.append(Operand("workspace", "", ctx.workspace))
        for op in call.operands:
            op.nbytes = op.array.nbytes
        self.calls.append(call)
        self._check_reads(call)

    def _record_codec(self, kernel, ctx, codec, a, b, phase):
        """An Encode (``a`` the map, ``b`` its form) or a Decode (``a`` the form, ``b`` the map)
        of a tensor form."""
        x, form = (a, b) if phase == "encode" else (b, a)
        name = self.at_bytes.get(byte_bounds(x), "?") if phase == "encode" else self._decoded_name(form)
        call = Call(len(self.calls), None, phase,
                    [Operand("source", name, x), Operand("encoded", f"{name}#{codec}", form)])
        self._begin(call, ctx)
        result = kernel(ctx, codec, a, b)
        self._note_writes(call)
        if phase == "encode":
            self.kept[f"{name}#{codec}"] = (codec, KEPT[codec](x), digest(x))
        else:
            self._decoded(call, codec, name, x)
        return result

    def _decoded_name(self, form):
        """The name of the map whose form ``form`` is: the one whose form was last written at
        its bytes."""
        found = self.at_bytes.get(byte_bounds(form), "?#")
        return found.rsplit("#", 1)[0]

    def _decoded(self, call, codec, name, x):
        """After a Decode into ``x``: it must give back what the form keeps; the names that held
        the value encoded now hold what it gave back."""
        e = f"{name}#{codec}"
        if e not in self.kept:
            self.violations.append(f"{call.label}: decodes '{e}', which nothing encoded")
            return
        _, kept, value = self.kept[e]
        if KEPT[codec](x) != kept:
            self.violations.append(f"{call.label}: '{name}' decoded is not what '{e}' kept")
        now = digest(x)
        for names in (self.written, self.root_written):
            for n, d in names.items():
                if d == value:
                    names[n] = now

    def _wrap(self, kernel, phase):
        trace = self

        def traced(layer, ctx, *args):
            node = trace.nodes.get(id(layer))
            if node is None:  # another net's layer
                return kernel(layer, ctx, *args)
            return trace._outermost(lambda: trace._record(kernel, layer, ctx, args, node, phase),
                                    lambda: kernel(layer, ctx, *args))
        return traced

    def _record(self, kernel, layer, ctx, args, node, phase):
        if phase == "forward" and ctx.recompute:
            phase = "recompute"
        call = Call(len(self.calls), node, phase)
        if phase == "encode":  # a layer's own form of its backward's operands
            codec, bottoms, tops, out = args
            self.forms[node.name] = f"{node.name}#{codec}"
            groups = [("bottom", node.bottoms, bottoms), ("top", node.tops, tops),
                      ("encoded", [self.forms[node.name]], [out])]
        elif phase == "backward":
            bottoms, tops, top_grads, bottom_grads, params, param_grads = args
            groups = [("bottom", node.bottoms, bottoms), ("top", node.tops, tops),
                      ("top_grad", node.top_grads, top_grads), ("bottom_grad", node.bottom_grads, bottom_grads),
                      ("param", [node.params[k] for k in params], list(params.values())),
                      ("param_grad", [node.param_grads[k] for k in param_grads], list(param_grads.values()))]
            if ctx.encoded is not None:  # it reads its layer's own form instead of its operands
                groups.append(("encoded", [self.forms.get(node.name, "?")], [ctx.encoded]))
        else:
            bottoms, tops, params = args
            groups = [("bottom", node.bottoms, bottoms), ("top", node.tops, tops),
                      ("param", [node.params[k] for k in params], list(params.values()))]
            if ctx.encoded is not None:  # it writes its layer's own form too, in the same pass
                self.forms[node.name] = f"{node.name}#{direct_form(layer).codec}"
                groups.append(("encoded", [self.forms[node.name]], [ctx.encoded]))
            if getattr(ctx, "scale", None) is not None:  # and a Scale's top, from its parameters
                scale = self.nodes[id(ctx.scale.layer)]
                groups += [("param", [scale.params[k] for k in ctx.scale.params], list(ctx.scale.params.values())),
                           ("top", scale.tops, [ctx.scale.top])]
        for role, names, arrays in groups:
            for name, a in zip(names, arrays):
                if a is not None:
                    call.operands.append(Operand(role, name, a))
        self._begin(call, ctx)
        before = {op.name: digest(op.array) for op in call.operands if op.role == "param"}
        result = kernel(layer, ctx, *args)
        if phase == "recompute":
            for op in call.operands:
                if op.role == "param" and digest(op.array) != before[op.name]:
                    self.violations.append(f"{call.label}: recompute changed '{op.name}'")
        last = node if getattr(ctx, "scale", None) is None else self.nodes[id(ctx.scale.layer)]
        self._note_writes(call, self._relu_after(last) if getattr(ctx, "relu", False) else {})
        return result

    def _relu_after(self, node):
        """``{top: the top of the ReLU in place on it}`` for a forward with a fused ReLU
        (scheduler/fuse.py) on ``node``'s top: what it writes is what that ReLU's forward
        wrote."""
        return {n.bottoms[0]: n.tops[0] for n in self.graph.nodes
                if n.layer.type == "ReLU" and list(n.bottoms) == list(node.tops)}

    def _check_reads(self, call):
        for op in call.operands:
            if op.role not in READS[call.phase]:
                continue
            expect = self.written.get(op.name)
            if expect is None and op.role != "encoded":  # a view no kernel writes (Split, Flatten): its root's value
                expect = self.root_written.get(self.graph.root(op.name))
            if expect is None:
                self.unchecked_reads.add(op.name)
            elif digest(op.array) != expect:
                self.violations.append(f"{call.label}: '{op.name}' is not what was written to it")

    def _note_writes(self, call, fused=None):
        for op in call.operands:
            if op.role not in WRITES[call.phase]:
                continue
            d = digest(op.array)
            after = (fused or {}).get(op.name)
            if call.phase == "recompute" and self.forward_digest.get(after or op.name) != d:
                self.violations.append(f"{call.label}: recomputed '{op.name}' differs from its forward")
            if after is not None:
                self.written[after] = d
            if call.phase == "forward":
                self.forward_digest[op.name] = d
            self.written[op.name] = d
            self.at_bytes[byte_bounds(op.array)] = op.name
            if op.role not in ("param_grad", "encoded"):
                self.root_written[self.graph.root(op.name)] = d

    # -- what the run used ---------------------------------------------------------------
    def locate(self):
        """Offsets of every operand from the one block they share; returns that block."""
        owners = {id(owner(op.array)): owner(op.array) for c in self.calls for op in c.operands}
        assert len(owners) == 1, f"kernel operands are views of {len(owners)} blocks, not one arena"
        base = next(iter(owners.values()))
        lo = byte_bounds(base)[0]
        for c in self.calls:
            for op in c.operands:
                start, end = byte_bounds(op.array)
                assert end - start == op.nbytes, f"{c.label}: '{op.name}' is not contiguous"
                op.offset = start - lo
        return base

    def _resident(self, op):
        return op.role in RESIDENT and self.resident_params

    @property
    def high_water(self):
        return max(op.offset + op.nbytes for c in self.calls for op in c.operands)

    def resident_extent(self):
        """``(end of the resident operands, lowest scheduled offset)``."""
        ops = [op for c in self.calls for op in c.operands]
        return (max((op.offset + op.nbytes for op in ops if self._resident(op)), default=0),
                min(op.offset for op in ops if not self._resident(op)))

    def _key(self, call, op):
        if op.role == "encoded":  # not a graph tensor: its own value
            return op.name
        return f"ws#{call.index}" if op.role == "workspace" else self.graph.root(op.name)

    def instances(self):
        """``[(key, offset, first call, last call, bytes)]``: each scheduled value from its first
        kernel touch to its last; the key is the graph storage root (a workspace is its own
        value at each call). A value ends where a kernel touches another root in its bytes; if
        the same root is touched there again, it was brought back (a prefetch): a new value,
        whose bytes the digests check. Copies are invisible here, so under policies that copy
        a value may look alive while it sits on the host: only without copies is this the
        run's exact liveness."""
        current, done, same = {}, [], {}
        for c in self.calls:
            ops = [op for op in c.operands if not self._resident(op)]
            for a in ops:  # an in-place pair is one value, whatever the graph calls it
                for b in ops:
                    if a.role in READS[c.phase] and b.role in WRITES[c.phase] and self._in_place(c, a, b):
                        read = (self._key(c, a), a.offset)
                        same[(self._key(c, b), b.offset)] = same.get(read, read)
            keys = [same.get((self._key(c, op), op.offset), (self._key(c, op), op.offset)) for op in ops]
            mine = {k for k, _ in keys}
            for key, (k, o, _, _, n) in list(current.items()):  # bytes another root now uses
                if k not in mine and any(o < op.offset + op.nbytes and op.offset < o + n for op in ops):
                    done.append(current.pop(key))
            for op, key in zip(ops, keys):
                if key in current and self._starts_anew(c, op):
                    done.append(current.pop(key))
                if key not in current:
                    current[key] = [*key, c.index, c.index, op.nbytes]
                else:
                    rec = current[key]
                    rec[3], rec[4] = c.index, max(rec[4], op.nbytes)
        return done + list(current.values())

    def _starts_anew(self, call, op):
        """A recompute writing a root makes a new value (the forward's was freed since)."""
        return call.phase == "recompute" and op.role == "top" and self.graph.root(op.name) == op.name

    def live_peak(self):
        resident = {op.name: op.nbytes for c in self.calls for op in c.operands if self._resident(op)}
        delta = [0] * (len(self.calls) + 1)
        for _, _, first, last, size in self.instances():
            delta[first] += aligned(size)
            delta[last + 1] -= aligned(size)
        live, peak = 0, 0
        for d in delta:
            live += d
            peak = max(peak, live)
        return sum(map(aligned, resident.values())) + peak

    def clashes(self):
        """Operands of one call that share bytes without being one value (or an in-place pair:
        an INPLACE layer's top over its bottom; a bottom gradient over a top gradient or over its
        bottom where the layer allows it: Layer.grad_inplace, Layer.grad_over_bottom)."""
        out = []
        for c in self.calls:
            ops = sorted(c.operands, key=lambda op: op.offset)
            for i, a in enumerate(ops):
                for b in ops[i + 1:]:
                    if b.offset >= a.offset + a.nbytes:
                        break
                    if self._key(c, a) == self._key(c, b) or self._in_place(c, a, b):
                        continue
                    out.append(f"{c.label}: {a.role} '{a.name}' and {b.role} '{b.name}' share bytes at {b.offset}")
        return out

    @staticmethod
    def _in_place(call, a, b):
        if call.node is None or (a.offset, a.nbytes) != (b.offset, b.nbytes):
            return False
        node, names = call.node, {a.role: a.name, b.role: b.name}
        if set(names) == {"bottom", "top"}:
            return node.layer.INPLACE
        if set(names) == {"bottom_grad", "top_grad"}:  # the pairs the layer allows (Layer.grad_inplace)
            return any(node.bottom_grads[i] == names["bottom_grad"] and node.top_grads[j] == names["top_grad"]
                       for i, j in node.layer.grad_inplace())
        if set(names) == {"bottom", "bottom_grad"}:  # a gradient over its bottom (Layer.grad_over_bottom)
            return any(node.bottoms[i] == names["bottom"] and node.bottom_grads[i] == names["bottom_grad"]
                       for i in node.layer.grad_over_bottom())
        return False
