"""The ``${expr}`` language of network files, over the values superneuron.netfile.yaml_read reads
(YAML with the position of every key and item).

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
import math
import operator
import re

from ..limits import MAX_EXPR_CHARS, MAX_EXPR_DEPTH, MAX_EXPR_SIZE, MAX_INT_BITS, over


def _error(message):
    """``${... if ok else error("why")}``: stop with the file's own message."""
    raise ExprError(str(message))


def _sum(items, start=0):
    """Python's ``sum``, in linear time for lists and tuples too (``sum(lists, [])``), and
    refusing a result over MAX_EXPR_SIZE as it grows."""
    items = list(items)
    if not isinstance(start, (list, tuple)):
        return sum(items, start)
    out = list(start)
    for item in items:
        if not isinstance(item, type(start)):
            raise TypeError(f"can only concatenate {type(start).__name__} (not "
                            f"\"{type(item).__name__}\") to {type(start).__name__}")
        if len(out) + len(item) > MAX_EXPR_SIZE:
            raise ExprError(over("a sum of", len(out) + len(item), MAX_EXPR_SIZE, "MAX_EXPR_SIZE", " items"))
        out.extend(item)
    return out if isinstance(start, list) else tuple(out)


FUNCTIONS = {"min": min, "max": max, "int": int, "float": float, "str": str, "len": len,
             "range": lambda *a: list(range(*a)), "sum": _sum, "abs": abs, "error": _error}

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
    """The value of the expression ``src`` with names looked up in ``env`` (a dict).

    Its length, its nesting and the size of every value it makes are bounded (MAX_EXPR_CHARS,
    MAX_EXPR_DEPTH, MAX_EXPR_SIZE, MAX_INT_BITS), each checked before the work it would cost, so
    no expression can run for long or take much memory."""
    shown = "${" + (src if len(src) <= 60 else src[:57] + "...") + "}"
    if len(src) > MAX_EXPR_CHARS:
        raise ExprError(over(f"expression '{shown}' of", len(src), MAX_EXPR_CHARS, "MAX_EXPR_CHARS",
                             " characters"))
    try:
        tree = _parse(src.strip())
    except SyntaxError as e:
        raise ExprError(f"invalid expression '{shown}': {e.msg}") from None
    except (RecursionError, MemoryError):
        raise ExprError(f"invalid expression '{shown}': nested too deeply") from None
    if _depth(tree) > MAX_EXPR_DEPTH:
        raise ExprError(f"expression '{shown}' is nested more than {MAX_EXPR_DEPTH} deep (MAX_EXPR_DEPTH)")
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


def _depth(tree):
    """The depth of a syntax tree, walked without recursion (the evaluator's recursion follows it)."""
    deepest, todo = 0, [(tree, 1)]
    while todo:
        node, d = todo.pop()
        deepest = max(deepest, d)
        if d <= MAX_EXPR_DEPTH:
            todo.extend((child, d + 1) for child in ast.iter_child_nodes(node))
    return deepest


def size_of(value, limit=MAX_EXPR_SIZE):
    """About how large ``value`` is: characters of strings, digits of long integers, and items
    of lists, tuples and dicts counted through nested ones (a list holding one list a million
    times counts a million times). Counting stops once past ``limit``."""
    total, todo = 0, [value]
    while todo and total <= limit:
        v = todo.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, int):  # an item; a long integer also its digits past the first 19
            total += max(0, v.bit_length() - 64) // 3
        elif isinstance(v, (list, tuple)):
            total += len(v)
            if total <= limit:
                todo.extend(v)
        elif isinstance(v, dict):
            total += len(v)
            if total <= limit:
                todo.extend(v)
                todo.extend(v.values())
    return total


# printf-style conversions: '%s', '%-08.3f', '%(name)d', '%*d' (a width taken from the arguments)
_CONVERSION = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?(.)", re.S)


def _check_format(text):
    """A ``'...' % args`` format whose widths and precisions are small numbers written in it."""
    for m in _CONVERSION.finditer(text):
        for part in m.group(1, 2):
            if part == "*":
                raise ExprError("'*' widths in '%' formatting are not allowed")
            if part is not None and (len(part) > 7 or int(part) > MAX_EXPR_SIZE):
                raise ExprError(over("a '%' width of", int(part) if len(part) <= 30 else 10**30,
                                     MAX_EXPR_SIZE, "MAX_EXPR_SIZE", " characters"))


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

    def bounded(self, value):
        """``value``, if it is within MAX_INT_BITS and MAX_EXPR_SIZE."""
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            self.fail(over("an integer of", value.bit_length(), MAX_INT_BITS, "MAX_INT_BITS", " bits"))
        if isinstance(value, (str, list, tuple, dict)) and size_of(value) > MAX_EXPR_SIZE:
            self.fail(over("a value of more than", MAX_EXPR_SIZE, MAX_EXPR_SIZE, "MAX_EXPR_SIZE",
                           " characters or items"))
        return value

    def visit_List(self, node):
        return self.bounded([self.visit(e) for e in node.elts])

    def visit_Tuple(self, node):
        return self.bounded(tuple(self.visit(e) for e in node.elts))

    def visit_Dict(self, node):
        if any(k is None for k in node.keys):
            self.fail("'**' unpacking is not allowed")
        return self.bounded({self.visit(k): self.visit(v) for k, v in zip(node.keys, node.values, strict=True)})

    def visit_BinOp(self, node):
        op = BINARY.get(type(node.op))
        if op is None:
            self.forbid(node.op)
        left, right = self.visit(node.left), self.visit(node.right)
        self.check_cost(node.op, left, right)
        return self.bounded(op(left, right))

    def check_cost(self, op, left, right):
        """Refuse, before computing it, a result that would break MAX_INT_BITS or MAX_EXPR_SIZE."""
        ints = all(isinstance(v, int) for v in (left, right))
        seqs = (str, list, tuple)
        if isinstance(op, ast.Pow) and ints and right > 0 and abs(left) > 1:
            bits = right * math.log2(abs(left))
            if bits > MAX_INT_BITS:
                self.fail(over("an integer of about", int(bits) if bits < 1e30 else 10**30, MAX_INT_BITS,
                               "MAX_INT_BITS", " bits"))
        elif isinstance(op, ast.Mult) and ints:
            if left.bit_length() + right.bit_length() > MAX_INT_BITS + 1:
                self.fail(over("an integer of about", left.bit_length() + right.bit_length(), MAX_INT_BITS,
                               "MAX_INT_BITS", " bits"))
        elif isinstance(op, ast.Mult) and any(isinstance(v, seqs) for v in (left, right)):
            seq, n = (left, right) if isinstance(left, seqs) else (right, left)
            if isinstance(n, int) and n > 0 and size_of(seq) * n > MAX_EXPR_SIZE:
                self.fail(over("a repetition of", size_of(seq) * n if n < 10**30 else n, MAX_EXPR_SIZE,
                               "MAX_EXPR_SIZE", " characters or items"))
        elif isinstance(op, ast.Add) and isinstance(left, seqs) and isinstance(right, seqs):
            if size_of(left) + size_of(right) > MAX_EXPR_SIZE:
                self.fail(over("a value of more than", MAX_EXPR_SIZE, MAX_EXPR_SIZE, "MAX_EXPR_SIZE",
                               " characters or items"))
        elif isinstance(op, ast.Mod) and isinstance(left, str):
            _check_format(left)
            if size_of(right) > MAX_EXPR_SIZE:
                self.fail(over("a value of more than", MAX_EXPR_SIZE, MAX_EXPR_SIZE, "MAX_EXPR_SIZE",
                               " characters or items"))

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
        if node.func.id == "range" and len(range(*args)) > MAX_EXPR_SIZE:
            self.fail(over("a range of", len(range(*args)), MAX_EXPR_SIZE, "MAX_EXPR_SIZE", " items"))
        return self.bounded(FUNCTIONS[node.func.id](*args))


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
    out, last, length = [], 0, len(text)
    for start, end, src in spans:
        out.append(text[last:start])
        out.append(str(evaluate(src, env)))
        length += len(out[-1])
        if length > MAX_EXPR_SIZE:
            raise ExprError(over(f"'{text[:40]}...' makes a string of more than", MAX_EXPR_SIZE,
                                 MAX_EXPR_SIZE, "MAX_EXPR_SIZE", " characters"))
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
