"""One layer mapping of a net file checked and made a LayerSpec: its type, bottoms and tops, keys and rules."""

import difflib

from ..layers import layer_class
from ..layers.base import Key
from ..limits import MAX_LAYERS, over
from .expr import ExprError, substitute
from .netspec import LayerSpec
from .rules import PHASES, param_blocks, phases_of

COMMON_KEYS = {"loss_weight": Key("floats"), "lr_mult": Key("floats"), "decay_mult": Key("floats")}
LAYER_KEYS = ("name", "type", "bottom", "top")
RULE_KEYS = ("include", "exclude", "param")  # Caffe's NetStateRule lists and ParamSpec blocks


def closest(word, known):
    """The name of ``known`` closest to ``word``, or None when none is close."""
    close = difflib.get_close_matches(str(word), [str(k) for k in known], n=1)
    return close[0] if close else None


def did_you_mean(word, known):
    """``; did you mean 'x'?`` for the name of ``known`` closest to ``word``, else nothing."""
    close = closest(word, known)
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


class LayerChecks:
    """The one-layer part of :class:`superneuron.netfile.loader.Loader`: it records problems
    through the loader's ``problem``, ``env`` and ``too_many``, and appends to its ``layers``."""

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
                    close = closest(key, list(cls.KEYS) + list(COMMON_KEYS) + list(LAYER_KEYS) + list(RULE_KEYS))
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
