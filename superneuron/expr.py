"""Values of network files: YAML read with positions, and the ``${expr}`` language over them.

:func:`parse_yaml` reads YAML into plain values whose mappings and lists (:class:`Map`,
:class:`Seq`) remember the line and column of every key and item, so that a problem found
after expansion can still point into the file.

``${expr}`` is evaluated by a small, safe evaluator over Python's ``ast``.

Allowed: numbers, strings, booleans, lists, tuples, dicts, names (parameters, template
arguments, loop variables, ``prev``), ``+ - * / // % **``, comparisons and ``in``,
``and or not``, ``a if c else b``, subscripts and slices, and calls to a few functions
(:data:`FUNCTIONS`). Anything else (attributes, lambdas, comprehensions, other calls) is an
:class:`ExprError` naming the expression, so a network file can never run arbitrary code.

:func:`substitute` applies it to a YAML value: a string that is exactly one ``${expr}`` becomes
the expression's value with its type; ``${expr}`` inside a longer string is replaced by
``str(value)``; lists and mappings are substituted item by item.
"""

import ast
import functools
import operator

import yaml

from .errors import SpecError, where


def _error(message):
    """``${... if ok else error("why")}``: stop with the file's own message."""
    raise ExprError(str(message))


FUNCTIONS = {"min": min, "max": max, "int": int, "float": float, "str": str, "len": len,
             "range": lambda *a: list(range(*a)), "sum": sum, "abs": abs, "error": _error}

MAX_POWER = 4096  # a larger exponent or range is a typo, not a network; refuse it quickly
MAX_RANGE = 1_000_000

BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
          ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
          ast.Pow: operator.pow}
COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}

# Names of constructs for "... is not allowed" messages.
FORBIDDEN = {ast.Attribute: "attribute access", ast.Lambda: "lambda", ast.ListComp: "a comprehension",
             ast.SetComp: "a comprehension", ast.DictComp: "a comprehension",
             ast.GeneratorExp: "a comprehension", ast.Starred: "'*' unpacking",
             ast.NamedExpr: "':='", ast.JoinedStr: "an f-string", ast.Set: "a set",
             ast.BitAnd: "'&'", ast.BitOr: "'|'", ast.BitXor: "'^'", ast.LShift: "'<<'",
             ast.RShift: "'>>'", ast.Invert: "'~'", ast.MatMult: "'@'", ast.Is: "'is'",
             ast.IsNot: "'is not'", ast.Await: "await", ast.Yield: "yield"}


class ExprError(ValueError):
    """A ``${}`` expression that cannot be evaluated; the message names the expression."""


def evaluate(src, env):
    """The value of the expression ``src`` with names looked up in ``env`` (a dict)."""
    shown = "${" + (src if len(src) <= 60 else src[:57] + "...") + "}"
    try:
        tree = _parse(src.strip())
    except SyntaxError as e:
        raise ExprError(f"invalid expression '{shown}': {e.msg}") from None
    try:
        return _Evaluator(env, shown).visit(tree)
    except ExprError:
        raise
    except RecursionError:
        raise ExprError(f"expression too deeply nested: '{shown}'") from None
    except (ArithmeticError, TypeError, ValueError, IndexError, KeyError) as e:
        what = type(e).__name__ if isinstance(e, (IndexError, KeyError)) else ""
        msg = f"{what}: {e}" if what else str(e)
        raise ExprError(f"cannot evaluate '{shown}': {msg}") from None


@functools.lru_cache(maxsize=4096)  # a repeat evaluates the same few expressions many times
def _parse(src):
    return ast.parse(src, mode="eval").body


class _Evaluator:
    def __init__(self, env, shown):
        self.env, self.shown = env, shown

    def fail(self, message):
        raise ExprError(f"{message} in '{self.shown}'")

    def forbid(self, node):
        what = FORBIDDEN.get(type(node), f"'{type(node).__name__}'")
        self.fail(f"{what} is not allowed")

    def visit(self, node):
        method = getattr(self, "visit_" + type(node).__name__, None)
        if method is None:
            self.forbid(node)
        return method(node)

    def visit_Constant(self, node):
        if not isinstance(node.value, (int, float, str, bool, type(None))):
            self.forbid(node)
        return node.value

    def visit_Name(self, node):
        if node.id in self.env:
            return self.env[node.id]
        if node.id in ("true", "false"):  # YAML spelling
            return node.id == "true"
        if node.id in FUNCTIONS:
            self.fail(f"function '{node.id}' must be called")
        self.fail(f"undefined name '{node.id}'")

    def visit_List(self, node):
        return [self.visit(e) for e in node.elts]

    def visit_Tuple(self, node):
        return tuple(self.visit(e) for e in node.elts)

    def visit_Dict(self, node):
        if any(k is None for k in node.keys):
            self.fail("'**' unpacking is not allowed")
        return {self.visit(k): self.visit(v) for k, v in zip(node.keys, node.values, strict=True)}

    def visit_BinOp(self, node):
        op = BINARY.get(type(node.op))
        if op is None:
            self.forbid(node.op)
        left, right = self.visit(node.left), self.visit(node.right)
        if isinstance(node.op, ast.Pow) and isinstance(right, (int, float)) and abs(right) > MAX_POWER:
            self.fail(f"exponent {right} is too large")
        if isinstance(node.op, ast.Mult) and any(isinstance(v, (str, list, tuple)) for v in (left, right)):
            n = right if isinstance(left, (str, list, tuple)) else left
            if isinstance(n, int) and n > MAX_RANGE:
                self.fail(f"repetition {n} is too large")
        return op(left, right)

    def visit_UnaryOp(self, node):
        op = UNARY.get(type(node.op))
        if op is None:
            self.forbid(node.op)
        return op(self.visit(node.operand))

    def visit_BoolOp(self, node):
        value = None
        for e in node.values:  # short-circuit, as Python does
            value = self.visit(e)
            if isinstance(node.op, ast.And) != bool(value):
                return value
        return value

    def visit_Compare(self, node):
        left = self.visit(node.left)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            fn = COMPARE.get(type(op))
            if fn is None:
                self.forbid(op)
            right = self.visit(right_node)
            if not fn(left, right):
                return False
            left = right
        return True

    def visit_IfExp(self, node):
        return self.visit(node.body) if self.visit(node.test) else self.visit(node.orelse)

    def visit_Subscript(self, node):
        container, key = self.visit(node.value), self.visit(node.slice)
        try:
            return container[key]
        except KeyError:  # say which key and which there are, not Python's "KeyError: 21"
            keys = ", ".join(map(repr, list(container)[:10])) + (", ..." if len(container) > 10 else "")
            self.fail(f"{key!r} is not one of the keys ({keys})")

    def visit_Slice(self, node):
        parts = [None if p is None else self.visit(p) for p in (node.lower, node.upper, node.step)]
        return slice(*parts)

    def visit_Call(self, node):
        if isinstance(node.func, ast.Attribute):
            self.forbid(node.func)
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            name = getattr(node.func, "id", None) or ast.unparse(node.func)
            self.fail(f"call of '{name}' is not allowed (allowed: {', '.join(FUNCTIONS)})")
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            self.fail(f"'{node.func.id}' takes positional arguments only")
        args = [self.visit(a) for a in node.args]
        if node.func.id == "range" and len(range(*args)) > MAX_RANGE:
            self.fail(f"range of {len(range(*args))} items is too large")
        return FUNCTIONS[node.func.id](*args)


@functools.lru_cache(maxsize=4096)
def find(text):
    """The ``(start, end, source)`` of every ``${...}`` in ``text`` (braces inside are matched,
    and quoted strings are skipped, so ``${ {'a': 1}['a'] }`` works)."""
    spans, i = [], 0
    while True:
        start = text.find("${", i)
        if start < 0:
            break
        depth, j, quote = 1, start + 2, None
        while j < len(text) and depth:
            c = text[j]
            if quote:
                if c == "\\":
                    j += 1
                elif c == quote:
                    quote = None
            elif c in "'\"":
                quote = c
            elif c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            j += 1
        if depth:
            raise ExprError(f"unclosed '${{' in '{text}'")
        spans.append((start, j, text[start + 2:j - 1]))
        i = j
    return tuple(spans)


def interpolate(text, env):
    """One string: the typed value of a lone ``${expr}``, else the string with each replaced."""
    spans = find(text)
    if not spans:
        return text
    if len(spans) == 1 and spans[0][0] == 0 and spans[0][1] == len(text):
        value = evaluate(spans[0][2], env)
        return list(value) if isinstance(value, tuple) else value
    out, last = [], 0
    for start, end, src in spans:
        out.append(text[last:start])
        out.append(str(evaluate(src, env)))
        last = end
    out.append(text[last:])
    return "".join(out)


def substitute(value, env):
    """``value`` (a YAML value) with every ``${}`` in its strings evaluated in ``env``.

    Mappings and lists keep their class (so position-carrying subclasses survive) by being
    copied with ``copy()`` and refilled."""
    if isinstance(value, str):
        return interpolate(value, env)
    if isinstance(value, dict):
        out = value.copy()
        for k, v in value.items():
            out[k] = substitute(v, env)
        return out
    if isinstance(value, list):
        out = value.copy()
        out[:] = [substitute(v, env) for v in value]
        return out
    return value


# -- YAML with positions ------------------------------------------------------------------
class Map(dict):
    """A YAML mapping that remembers where it, each key and each value were written."""

    mark = (0, 0)

    def __init__(self, *args):
        super().__init__(*args)
        self.keymarks, self.valmarks = {}, {}

    def copy(self):
        out = Map(self)
        out.mark, out.keymarks, out.valmarks = self.mark, self.keymarks, self.valmarks
        return out

    def key_at(self, key):
        return self.keymarks.get(key, self.mark)

    def value_at(self, key):
        return self.valmarks.get(key, self.mark)


class Seq(list):
    """A YAML sequence that remembers where it and each item were written."""

    mark = (0, 0)

    def __init__(self, *args):
        super().__init__(*args)
        self.marks = []

    def copy(self):
        out = Seq(self)
        out.mark, out.marks = self.mark, self.marks
        return out

    def at(self, i):
        return self.marks[i] if i < len(self.marks) else self.mark


def _mark(node):
    return node.start_mark.line + 1, node.start_mark.column + 1


def parse_yaml(text, file="<net>"):
    """Plain Python values (Map/Seq carrying positions) from YAML ``text``; SpecError if invalid."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        return None if node is None else _plain(loader, node, file)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (None, None)
        what = " ".join(p for p in (e.context, e.problem) if p)
        raise SpecError(where(file, line, col) + f"invalid YAML: {what}") from None
    except yaml.YAMLError as e:
        raise SpecError(where(file) + f"invalid YAML: {e}") from None
    except RecursionError:  # an anchor that contains itself
        raise SpecError(where(file) + "invalid YAML: nested too deeply (a recursive anchor?)") from None
    finally:
        loader.dispose()


def _plain(loader, node, file):
    if isinstance(node, yaml.SequenceNode):
        out = Seq(_plain(loader, n, file) for n in node.value)
        out.mark, out.marks = _mark(node), [_mark(n) for n in node.value]
        return out
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)  # YAML merge keys (<<: *anchor)
        out = Map()
        out.mark = _mark(node)
        for knode, vnode in node.value:
            key = _plain(loader, knode, file)
            if isinstance(key, (list, dict)):
                raise SpecError(where(file, *_mark(knode)) + "a key must be a plain name")
            if key in out:
                raise SpecError(where(file, *_mark(knode)) + f"duplicate key '{key}'")
            out[key] = _plain(loader, vnode, file)
            out.keymarks[key], out.valmarks[key] = _mark(knode), _mark(vnode)
        return out
    return loader.construct_object(node)
