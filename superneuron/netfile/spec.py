"""YAML network files → NetSpec: validation, params and templates, --set overrides, errors as file:line.

A file has ``name``, ``params`` (defaults, replaced by ``--set``; each may use the ones before
it), ``input`` (top name → shape, batch first), ``templates`` (name → list of layers) and
``layers``. An item of a layer list is a layer (Caffe's keys, flattened), ``{use: template,
with: {args}}``, or ``{repeat: n, as: i, use: ... | layers: [...]}``. Strings may hold
``${expr}`` (see :mod:`superneuron.netfile.expr`); ``prev`` names the first top of the layer emitted
last. Every problem in a file is reported at once, each as
``file:line:col: layer 'name' (Type): what is wrong``. Graph-level checks (dangling bottoms,
shapes) belong to :mod:`superneuron.graph`, which reads the positions kept on each LayerSpec.
"""

import difflib
import os
import re
from dataclasses import dataclass, field

from ..errors import SpecError, where
from ..files import read_text_capped
from ..layers import layer_class
from ..layers.base import Key
from ..layers.input import FED_TYPES
from ..limits import MAX_BATCH, MAX_LAYERS, MAX_NESTING, MAX_NET_FILE_BYTES, MAX_REPEAT_ROUNDS, over
from .expr import ExprError, substitute
from .rules import PHASES, param_blocks, phases_of
from .yaml_read import Map, Seq, parse_yaml


@dataclass
class LayerSpec:
    """One layer as written (after templates, repeats and ``${}`` are expanded)."""

    name: str
    type: str
    bottoms: list
    tops: list
    cfg: dict                 # the layer's own keys, converted by Key.convert, defaults filled
    file: str = "<net>"
    line: int = 0             # 1-based line of the layer's mapping in ``file``
    col: int = 0
    loss_weight: float = None  # None: the layer class default (1.0 for loss layers, else 0)
    lr_mult: tuple = ()       # per parameter, in param_specs order; missing → 1.0
    decay_mult: tuple = ()
    phases: frozenset = PHASES  # the phases it runs in (Caffe's include/exclude)
    rules: tuple = ()         # its include/exclude rules as written: (("include", [rule, ...]), ...)


@dataclass
class NetSpec:
    """A whole network file: its name, the resolved ``params``, and the layers in file order
    (``input:`` becomes a first layer of type ``Input``)."""

    name: str
    file: str
    layers: list
    params: dict = field(default_factory=dict)
    solver: dict = None       # the file's ``solver:`` section (Caffe solver keys), if any
    solver_line: int = 0


COMMON_KEYS = {"loss_weight": Key("floats"), "lr_mult": Key("floats"), "decay_mult": Key("floats")}
LAYER_KEYS = ("name", "type", "bottom", "top")
RULE_KEYS = ("include", "exclude", "param")  # Caffe's NetStateRule lists and ParamSpec blocks
TOP_KEYS = ("name", "params", "input", "templates", "layers", "solver")


def parse_overrides(items):
    """``["depth=152", "blocks=[3,8,36,3]"]`` → ``{"depth": 152, "blocks": [3, 8, 36, 3]}``
    (values are read as YAML, so numbers and lists keep their type)."""
    out, problems = {}, []
    for item in items or ():
        key, eq, text = str(item).partition("=")
        key = key.strip()
        if not eq or not key.isidentifier() or not text.strip():
            problems.append(f"--set {item!r}: expected NAME=VALUE, such as depth=50")
            continue
        try:  # with positions dropped; read as a file is, so an alias bomb is refused too
            out[key] = _plain(parse_yaml(text, "--set"))
        except SpecError as e:
            why = str(e).split("invalid YAML: ", 1)[-1]
            problems.append(f"--set {item if len(item) <= 60 else item[:57] + '...'!r}: the value is not "
                            f"valid YAML ({why})")
    if problems:
        raise SpecError(problems)
    return out


def load_spec(path, overrides=None, batch=None, data=None, states=None):
    """Read, expand and check the network file at ``path``; a :class:`NetSpec` or SpecError.

    ``overrides`` (name → value, from ``--set``) replace entries of ``params:``; ``batch``
    replaces the first dimension of every input (and a Data layer's ``batch_size``).
    A Caffe ``.prototxt`` is read by :mod:`superneuron.netfile.caffe.prototxt` into the same spec;
    ``data="synthetic"`` replaces its Data layers with synthetic data of their shape.
    ``states`` (``{phase: rules.NetState}``, from ``--stage`` or a solver's ``train_state``
    and ``test_state``) chooses the layers whose include/exclude rules name stages or levels."""
    if str(path).lower().endswith(".prototxt"):
        # here, not at the top: Caffe's formats load protobuf, which costs start-up time
        from .caffe.textproto import read_text
        return prototxt_spec(read_text(path), str(path), overrides, batch, data, states=states)
    text = read_text_capped(path, MAX_NET_FILE_BYTES, "network file", error=SpecError)
    return loads_spec(text, str(path), overrides, batch, states)


def loads_spec(text, file="<net>", overrides=None, batch=None, states=None):
    """Like :func:`load_spec`, for YAML given as a string."""
    return _Loader(file, overrides, batch, states).load(text)


def prototxt_spec(text, file="<net>", overrides=None, batch=None, data=None, loss=False, states=None):
    """The :class:`NetSpec` of a Caffe ``.prototxt``'s text, translated by
    :mod:`superneuron.netfile.caffe.prototxt` into the YAML layout and given every check a YAML net gets
    (``data``: ``synthetic[:CxHxW]`` replaces its Data layers; ``loss``: see ``add_loss``)."""
    # here, not at the top: Caffe's formats load protobuf, which costs start-up time
    from .caffe.prototxt import add_loss, prototxt_tree
    root = prototxt_tree(text, file, data)
    if loss:
        add_loss(root)
    return spec_from_tree(root, file, overrides, batch, states)


def spec_from_tree(root, file, overrides=None, batch=None, states=None):
    """A :class:`NetSpec` from an already-read file: a :class:`Map` of the YAML layout (the
    Caffe reader builds one, with the positions of its own file)."""
    return _Loader(file, overrides, batch, states).load_root(root)


def _plain(value):
    """``value`` with the position-keeping Map and Seq turned into dict and list."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _close(word, known):
    close = difflib.get_close_matches(str(word), [str(k) for k in known], n=1)
    return close[0] if close else None


def _hint(word, known):
    close = _close(word, known)
    return f"; did you mean '{close}'?" if close else ""


def _names(value):
    """A bottom/top value as a list of names, or None if it is not a name or a list of names."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def _arity(what, count, bounds):
    lo, hi = bounds
    if count >= lo and (hi is None or count <= hi):
        return None
    plural = lambda n: f"{n} {what}" + ("" if n == 1 else "s")  # noqa: E731
    if hi is None:
        need = f"at least {plural(lo)}"
    elif lo == hi:
        need = plural(lo)
    else:
        need = f"{lo} to {hi} {what}s"
    return f"expects {need}, got {count}"


class _Loader:
    """One pass over a file: params, templates, input and layers, collecting every problem."""

    def __init__(self, file, overrides, batch, states=None):
        self.file, self.overrides, self.batch = file, dict(overrides or {}), batch
        self.states = states  # {phase: NetState}; None: level 0, no stage
        self.problems = {}          # dict as an ordered set: a repeat may repeat a message
        self.layers, self.first_line = [], {}
        self.prev = None            # first top of the last layer emitted
        self.params, self.templates = {}, {}
        self.rounds = 0             # of every repeat, nested ones in full: MAX_REPEAT_ROUNDS

    def problem(self, pos, message, layer=None, ltype=None, chain=()):
        line, col = pos if pos else (None, None)
        via = ", ".join(f"template '{t}' used at line {ln}" for t, ln in reversed(chain))
        self.problems[where(self.file, line, col, layer, ltype) + message
                       + (f" (in {via})" if via else "")] = None

    def check(self):
        if self.problems:
            raise SpecError(list(self.problems))  # which lists MAX_PROBLEMS and counts the rest

    def env(self, env):
        return env if self.prev is None else dict(env, prev=self.prev)

    def load(self, text):
        self.check_batch()
        return self.load_root(parse_yaml(text, self.file))

    def check_batch(self):
        if self.batch is not None and (isinstance(self.batch, bool) or not isinstance(self.batch, int)
                                       or self.batch <= 0):
            raise SpecError(f"batch must be a positive integer, got {self.batch!r}")
        if self.batch is not None and self.batch > MAX_BATCH:
            raise SpecError(over("batch", self.batch, MAX_BATCH, "MAX_BATCH"))

    def load_root(self, root):
        self.check_batch()
        if not isinstance(root, Map):
            raise SpecError(where(self.file, *(getattr(root, "mark", None) or (1, 1)))
                            + "expected a mapping with 'layers:' (and optionally name, params, "
                              "input, templates)")
        for key in root:
            if key not in TOP_KEYS:
                self.problem(root.key_at(key), f"unknown top-level key '{key}'" + _hint(key, TOP_KEYS))
        before = len(self.problems)
        self.load_params(root)
        if len(self.problems) > before:
            self.check()  # a bad parameter would make every use of it fail; stop here
        name = self.value(root, "name", self.params, default=os.path.splitext(os.path.basename(self.file))[0])
        templates = root.get("templates", Map())
        if not isinstance(templates, Map):
            self.problem(root.value_at("templates"), "'templates:' must map names to lists of layers")
        else:
            self.templates = templates
        if "input" in root:
            self.load_input(root)
        if "layers" not in root:
            self.problem(root.mark, "no 'layers:' list")
        else:
            self.expand(root["layers"], self.params, (), root.value_at("layers"))
        sources = [ls for ls in self.layers if ls.type in FED_TYPES or (ls.type == "Python" and not ls.bottoms)]
        if not sources and "layers" in root:
            self.problem(root.mark, "no input: add an 'input:' mapping, a Data layer or a Python data layer")
        self.check()
        if self.batch is not None:
            self.apply_batch()
        spec = NetSpec(str(name), self.file, self.layers, dict(self.params))
        if "solver" in root:
            solver = self.value(root, "solver", self.params)
            if not isinstance(solver, dict):
                self.problem(root.value_at("solver"), "'solver:' must be a mapping of solver keys")
                self.check()
            spec.solver, spec.solver_line = _plain(solver), root.key_at("solver")[0]
        return spec

    def value(self, m, key, env, default=None, layer=None, ltype=None, chain=()):
        """``m[key]`` with ``${}`` evaluated; records a problem and returns ``default`` if it fails."""
        if key not in m:
            return default
        try:
            return substitute(m[key], env)
        except ExprError as e:
            self.problem(m.value_at(key), f"'{key}': {e}", layer, ltype, chain)
            return default

    # -- params and input ----------------------------------------------------------------
    def load_params(self, root):
        raw = root.get("params", Map())
        if not isinstance(raw, Map):
            self.problem(root.value_at("params"), "'params:' must be a mapping of names to values")
            raw = Map()
        if self.batch is not None and "batch" in raw:
            self.overrides["batch"] = self.batch  # as apply_batch does, the batch argument wins
        for key in self.overrides:
            if key not in raw:
                known = ", ".join(map(str, raw)) or "none"
                self.problem(None, f"--set {key}: no such parameter{_hint(key, raw)} (parameters: {known})")
        for key in raw:
            if not isinstance(key, str) or not key.isidentifier():
                self.problem(raw.key_at(key), f"parameter name {key!r} is not a plain name")
                continue
            where_ = raw.value_at(key)
            try:
                value = self.overrides[key] if key in self.overrides else raw[key]
                self.params[key] = substitute(value, self.params)
            except ExprError as e:
                self.problem(where_, f"parameter '{key}'{self._from_set(key, raw[key])}: {e}")

    def _from_set(self, key, raw):
        """Where a parameter that failed got its value from: `` (from --set)`` when ``--set``
        gave it, `` (with --set depth=21)`` when its text names values ``--set`` gave, else
        nothing."""
        if key in self.overrides:
            return " (from --set)"
        named = set(re.findall(r"[A-Za-z_]\w*", str(raw)))
        used = [k for k in self.overrides if k in named]
        return " (with " + ", ".join(f"--set {k}={self.overrides[k]}" for k in used) + ")" if used else ""

    def load_input(self, root):
        """``input: {data: [8, 3, 32, 32], label: [8]}`` → the first layer, of type Input."""
        inp = root["input"]
        if not isinstance(inp, Map) or not inp:
            self.problem(root.value_at("input"), "'input:' must map top names to shapes, "
                                                 "such as {data: [8, 3, 32, 32], label: [8]}")
            return
        item = Map({"name": "input", "type": "Input", "top": Seq(inp), "shape": Seq()})
        item.mark = root.key_at("input")
        item.valmarks = {"shape": root.value_at("input")}
        for top in inp:
            shape = self.value(inp, top, self.params, layer="input", ltype="Input")
            if not (isinstance(shape, list) and shape and not isinstance(shape[0], list)):
                self.problem(inp.value_at(top), f"input '{top}': expected a shape such as "
                                                f"[8, 3, 32, 32], got {shape!r}", "input", "Input")
                return
            item["shape"].append(shape)
        self.layer(item, {}, ())

    def apply_batch(self):
        for ls in self.layers:
            if ls.type == "Input" and "shape" in ls.cfg:
                ls.cfg["shape"] = tuple((self.batch,) + tuple(s[1:]) for s in ls.cfg["shape"])
            elif ls.type in ("Data", "HDF5Data", "MemoryData") and "batch_size" in ls.cfg:
                ls.cfg["batch_size"] = self.batch

    # -- expansion -----------------------------------------------------------------------
    def expand(self, items, env, chain, pos):
        """Emit the layers of a list of items: layers, ``repeat`` loops and template ``use``s."""
        if not isinstance(items, list):
            self.problem(pos, "expected a list of layers", chain=chain)
            return
        for i, item in enumerate(items):
            if not isinstance(item, Map):
                self.problem(items.at(i), f"expected a layer mapping {{name: ..., type: ...}}, "
                                          f"got {item!r}", chain=chain)
            elif "repeat" in item:
                self.repeat(item, env, chain)
            elif "use" in item:
                self.use(item, env, chain)
            else:
                self.layer(item, env, chain)

    def control_keys(self, item, allowed, chain):
        for key in item:
            if key not in allowed:
                self.problem(item.key_at(key), f"unknown key '{key}' in '{allowed[0]}:'"
                             + _hint(key, allowed), chain=chain)

    def repeat(self, item, env, chain):
        self.control_keys(item, ("repeat", "as", "use", "with", "layers"), chain)
        count = self.value(item, "repeat", self.env(env), chain=chain)
        var = item.get("as")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            if count is not None:
                self.problem(item.value_at("repeat"), f"repeat: expected a non-negative integer, "
                                                      f"got {count!r}", chain=chain)
            return
        if var is not None and not (isinstance(var, str) and var.isidentifier()):
            self.problem(item.value_at("as"), f"'as': expected a plain name, got {var!r}", chain=chain)
            return
        if ("use" in item) == ("layers" in item):
            self.problem(item.mark, "repeat needs either 'use: template' or 'layers: [...]'", chain=chain)
            return
        if count > MAX_LAYERS:
            self.too_many(item.value_at("repeat"), over("repeat", count, MAX_LAYERS, "MAX_LAYERS")
                          + ", the most layers a net may have", chain)
        if self.rounds + count > MAX_REPEAT_ROUNDS:
            self.too_many(item.value_at("repeat"), f"repeat {count} after {self.rounds} rounds of repeats: "
                          + over("a file whose repeats make", self.rounds + count, MAX_REPEAT_ROUNDS,
                                 "MAX_REPEAT_ROUNDS", " rounds"), chain)
        before, rounds_before = len(self.layers), self.rounds
        for i in range(count):
            self.rounds += 1
            inner = env if var is None else dict(env, **{var: i})
            if "use" in item:
                self.use(item, inner, chain)
            else:
                self.expand(item["layers"], inner, chain, item.value_at("layers"))
            if i == 0 and before + (len(self.layers) - before) * count > MAX_LAYERS:
                self.too_many(item.value_at("repeat"), f"repeat {count} of {len(self.layers) - before} layers: "
                              + over("a net of about", before + (len(self.layers) - before) * count, MAX_LAYERS,
                                     "MAX_LAYERS", " layers"), chain)
            if i == 0 and rounds_before + (self.rounds - rounds_before) * count > MAX_REPEAT_ROUNDS:
                total = rounds_before + (self.rounds - rounds_before) * count
                self.too_many(item.value_at("repeat"), f"repeat {count} whose first round made "
                              f"{self.rounds - rounds_before} rounds of nested repeats: "
                              + over("a file whose repeats make about", total, MAX_REPEAT_ROUNDS,
                                     "MAX_REPEAT_ROUNDS", " rounds"), chain)

    def too_many(self, pos, message, chain):
        """Stop expanding at once: the file asks for more layers than MAX_LAYERS, or more rounds
        of repeats than MAX_REPEAT_ROUNDS."""
        self.problem(pos, message, chain=chain)
        raise SpecError(list(self.problems))

    def use(self, item, env, chain):
        if "repeat" not in item:
            self.control_keys(item, ("use", "with"), chain)
        name = self.value(item, "use", self.env(env), chain=chain)
        if name not in self.templates:
            if name is not None:
                self.problem(item.value_at("use"), f"unknown template '{name}'"
                             + _hint(name, self.templates), chain=chain)
            return
        if name in [t for t, _ in chain] or len(chain) >= MAX_NESTING:
            path = " → ".join([t for t, _ in chain] + [str(name)])
            self.problem(item.value_at("use"), f"template '{name}' uses itself ({path})", chain=chain)
            return
        args = item.get("with", Map())
        if not isinstance(args, Map):
            self.problem(item.value_at("with"), "'with:' must map argument names to values", chain=chain)
            return
        scope = dict(self.params)  # a template sees the params and its arguments, nothing else
        failed = False
        for key in args:
            try:
                scope[key] = substitute(args[key], self.env(env))
            except ExprError as e:
                self.problem(args.value_at(key), f"template argument '{key}': {e}", chain=chain)
                failed = True
        if not failed:
            self.expand(self.templates[name], scope, chain + ((name, item.mark[0]),),
                        self.templates.value_at(name))

    # -- one layer -----------------------------------------------------------------------
    def layer(self, item, env, chain):
        """Check one layer mapping and append its LayerSpec; every problem is recorded."""
        env = self.env(env)
        values, bad = {}, []
        for key in item:
            try:
                values[key] = substitute(item[key], env)
            except ExprError as e:
                bad.append((key, e))
        name, ltype = values.get("name"), values.get("type")
        lname = name if isinstance(name, str) else None
        tname = ltype if isinstance(ltype, str) else None

        def problem(key, message, at_key=False):
            pos = item.mark if key is None else item.key_at(key) if at_key else item.value_at(key)
            self.problem(pos, message, lname, tname, chain)

        for key, e in bad:
            problem(key, f"'{key}': {e}")
        cls = None
        if "name" not in item:
            problem(None, f"a layer{f' of type {tname}' if tname else ''} has no 'name'")
        elif lname is None and "name" in values:
            problem("name", f"'name': expected a string, got {name!r}")
        if "type" not in item:
            problem(None, "missing 'type'")
        elif tname is not None:
            try:
                cls = layer_class(tname)
            except KeyError as e:
                problem("type", e.args[0])
        elif "type" in values:
            problem("type", f"'type': expected a layer type name, got {ltype!r}")

        conns = {}
        for key, side in (("bottom", 0), ("top", 1)):
            bounds = None if cls is None else (cls.BOTTOMS, cls.TOPS)[side]
            conns[key] = _names(values[key]) if key in values else []
            if key not in item:
                if bounds is None or bounds[0] > 0:
                    problem(None, f"missing '{key}'")
            elif conns[key] is None:
                problem(key, f"'{key}': expected a name or a list of names, got {values[key]!r}")
                conns[key] = []
            elif key in values and bounds is not None and _arity(key, len(conns[key]), bounds):
                problem(key, _arity(key, len(conns[key]), bounds))

        cfg, common, suggested = {}, {}, set()
        phases = PHASES
        try:
            phases = phases_of(values.get("include"), values.get("exclude"), self.states)
        except ValueError as e:
            problem("include" if "include" in values else "exclude", str(e))
        if not phases:
            return  # another stage's or level's layer (Caffe's FilterNet leaves it out)
        rules = tuple((k, values[k] if isinstance(values[k], list) else [values[k]])
                      for k in ("include", "exclude") if k in values)
        if "param" in values:
            if "lr_mult" in values or "decay_mult" in values:
                problem("param", "write either 'param:' blocks or 'lr_mult'/'decay_mult', not both")
            else:
                try:
                    common["lr_mult"], common["decay_mult"] = param_blocks(values["param"])
                except ValueError as e:
                    problem("param", str(e))
        for key, value in values.items():
            if key in LAYER_KEYS or key in RULE_KEYS:
                continue
            spec = COMMON_KEYS.get(key) or (cls.KEYS.get(key) if cls is not None else None)
            if spec is None:
                if cls is not None:
                    close = _close(key, list(cls.KEYS) + list(COMMON_KEYS) + list(LAYER_KEYS) + list(RULE_KEYS))
                    suggested.add(close)  # a misspelt key is not also reported missing
                    problem(key, f"unknown key '{key}'" + (f"; did you mean '{close}'?" if close else ""),
                            at_key=True)
                continue
            try:
                (common if key in COMMON_KEYS else cfg)[key] = spec.convert(value)
            except ValueError as e:
                problem(key, f"'{key}': {e}")
        if cls is not None:
            for key, spec in cls.KEYS.items():
                if key not in item and spec.required and key not in suggested:
                    problem(None, f"missing required key '{key}'")
                cfg.setdefault(key, None if spec.required else spec.default)
        loss_weight = common.get("loss_weight")
        if loss_weight is not None:
            if len(loss_weight) != 1:
                problem("loss_weight", f"'loss_weight': expected one number, got {values['loss_weight']!r}")
            loss_weight = loss_weight[0]

        if lname is not None:
            line, seen = self.first_line.get(lname, (None, frozenset()))
            if seen & phases:  # train_val files name a TRAIN and a TEST layer alike
                problem("name", f"duplicate layer name '{lname}' (first used at line {line})")
            else:
                self.first_line[lname] = (line or item.mark[0], seen | phases)
        if lname is not None and tname is not None:
            if len(self.layers) >= MAX_LAYERS:
                self.too_many(item.mark, over("a net of more than", MAX_LAYERS, MAX_LAYERS, "MAX_LAYERS",
                                              " layers"), chain)
            self.layers.append(LayerSpec(lname, tname, conns["bottom"], conns["top"], cfg,
                                         self.file, item.mark[0], item.mark[1], loss_weight,
                                         common.get("lr_mult", ()), common.get("decay_mult", ()), phases,
                                         rules))
        if conns["top"]:
            self.prev = conns["top"][0]
