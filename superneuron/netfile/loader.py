"""One pass over a net file's tree: name, params, input and top-level keys checked, every problem collected."""

import os
import re

from ..errors import SpecError, where
from ..layers.input import FED_TYPES
from ..limits import MAX_BATCH, over
from .expand import Expansion
from .expr import ExprError, substitute
from .layer_check import LayerChecks, did_you_mean
from .netspec import NetSpec
from .yaml_read import Map, Seq, parse_yaml

TOP_KEYS = ("name", "params", "input", "templates", "layers", "solver")


def plain(value):
    """``value`` with the position-keeping Map and Seq turned into dict and list."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


class Loader(Expansion, LayerChecks):
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
                self.problem(root.key_at(key), f"unknown top-level key '{key}'" + did_you_mean(key, TOP_KEYS))
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
            spec.solver, spec.solver_line = plain(solver), root.key_at("solver")[0]
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
                self.problem(None, f"--set {key}: no such parameter{did_you_mean(key, raw)} (parameters: {known})")
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
