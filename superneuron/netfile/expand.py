"""Templates and repeats: the ``use:`` and ``repeat:`` items of a net file's layer lists expanded into layers."""

from ..errors import SpecError
from ..limits import MAX_LAYERS, MAX_NESTING, MAX_REPEAT_ROUNDS, over
from .expr import ExprError, substitute
from .layer_check import did_you_mean
from .yaml_read import Map


class Expansion:
    """The expanding part of :class:`superneuron.netfile.loader.Loader`: each item of a list is
    a layer (handed to its ``layer``), a ``repeat`` loop or a template ``use``."""

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
                             + did_you_mean(key, allowed), chain=chain)

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
                             + did_you_mean(name, self.templates), chain=chain)
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
