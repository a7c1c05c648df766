"""The floors of the house (DESIGN.md, "Rooms and what they may touch"): no import runs back
up. Every import of every module, those inside functions too, read with ``ast``."""

import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "superneuron")


def _modules():
    """``{dotted module name: path}`` of every module of the package."""
    out = {}
    for folder, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, f), os.path.dirname(PACKAGE))[:-3]
                name = rel.replace(os.sep, ".").removesuffix(".__init__")
                out[name] = os.path.join(folder, f)
    return out


MODULES = _modules()


def imports_of(name):
    """The package modules ``name`` imports, anywhere in its file (resolved to module names)."""
    path = MODULES[name]
    tree = ast.parse(open(path).read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            for a in node.names:  # `from . import x` imports module x; `from .m import f`, module m
                found.add(f"{stem}.{a.name}" if f"{stem}.{a.name}" in MODULES else stem)
    return {m for m in found if m in MODULES}


def _room(name):
    """The room a module is in: its subpackage (``layers``, ``scheduler``, ...) or its own name."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_the_import_reader_sees_relative_and_nested_imports():
    # a control: the reader must find what these modules are known to import
    assert "superneuron.scheduler.liveness" in imports_of("superneuron.scheduler.offload")
    assert "superneuron.scheduler.allocator" in imports_of("superneuron.scheduler.simulate")
    assert "superneuron.scheduler.simulate" in imports_of("superneuron.scheduler.workspace")  # in a function


@pytest.mark.parametrize("name", sorted(m for m in MODULES if _room(m) == "scheduler"))
def test_the_scheduler_knows_steps_and_bytes_never_kernels(name):
    bad = {m for m in imports_of(name) if _room(m) in ("runtime", "layers", "backend", "cli", "net", "report")}
    assert not bad, f"{name} imports {sorted(bad)}"


@pytest.mark.parametrize("name", sorted(m for m in MODULES if _room(m) == "layers"))
def test_layers_know_shapes_and_kernels_never_the_schedule(name):
    bad = {m for m in imports_of(name) if _room(m) in ("scheduler", "runtime", "cli", "net", "graph")}
    assert not bad, f"{name} imports {sorted(bad)}"


@pytest.mark.parametrize("name", ["superneuron.scheduler.allocator", "superneuron.sizes", "superneuron.errors",
                                  "superneuron.limits"])
def test_the_ground_floor_imports_only_errors_and_limits(name):
    assert imports_of(name) <= {"superneuron.errors", "superneuron.limits"}


def test_nothing_below_the_command_line_imports_it():
    bad = {(m, i) for m in MODULES if _room(m) != "cli" for i in imports_of(m) if _room(i) == "cli"}
    assert not bad


def test_no_two_rooms_import_each_other():
    rooms = {}
    for m in MODULES:
        for i in imports_of(m):
            if _room(i) != _room(m):
                rooms.setdefault(_room(m), set()).add(_room(i))
    both = {tuple(sorted((a, b))) for a, bs in rooms.items() for b in bs if a in rooms.get(b, ())}
    assert not both, f"rooms that import each other: {sorted(both)}"


# -- no circles, no long signatures, few imports inside functions ------------------------------

def import_graph():
    """``{module: the package modules it imports}``, every import read (those inside functions too)."""
    return {m: imports_of(m) - {m} for m in MODULES}


def _circles(graph):
    """Every strongly connected set of two or more nodes of ``graph`` (Tarjan's)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return out


def test_the_circle_finder_sees_a_circle():
    # a control: two modules that import each other are one strongly connected part
    assert _circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_among_the_package_modules():
    graph = import_graph()
    assert "superneuron.layers.windows" in graph["superneuron.layers.im2col"]  # the reader sees them
    assert not _circles(graph), f"modules that import each other, directly or round a circle: {_circles(graph)}"


MAX_PARAMETERS = 8


def test_no_function_takes_more_than_eight_parameters():
    """Options travel as one value (options.PlanOptions), not spelled out again in each
    signature: every parameter counts, ``self``, ``*args`` and ``**kwargs`` included."""
    long = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = node.args
                count = (len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None)
                         + (a.kwarg is not None))
                if count > MAX_PARAMETERS:
                    long.append(f"{path}:{node.lineno} {getattr(node, 'name', 'lambda')} ({count})")
    assert not long, "functions with more than 8 parameters:\n" + "\n".join(long)


MAX_LATE_IMPORTS = 12


def test_imports_inside_functions_are_few_and_say_why():
    """An import of the package's own modules inside a function is kept only where importing at
    the top would slow every tool's start-up (a comment on it says so), never to dodge a circle."""
    late = []
    for path in MODULES.values():
        lines = open(path).read().split("\n")
        for node in ast.walk(ast.parse("\n".join(lines), path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    own = (isinstance(inner, ast.ImportFrom) and (inner.level or (inner.module or "").startswith(
                        "superneuron"))) or (isinstance(inner, ast.Import) and any(
                            a.name.startswith("superneuron") for a in inner.names))
                    if own:
                        said = "start-up" in lines[inner.lineno - 1] or "start-up" in lines[inner.lineno - 2]
                        late.append((f"{path}:{inner.lineno}", said))
    unsaid = [where for where, said in late if not said]
    assert not unsaid, "imports inside functions without a start-up reason:\n" + "\n".join(unsaid)
    assert len(late) <= MAX_LATE_IMPORTS, f"{len(late)} imports inside functions: " + ", ".join(w for w, _ in late)


# -- what a step kind means is written once, in the walker's methods --------------------------

def _kind_constants():
    """``{name: kind}`` of the single kind constants steps.py declares (FORWARD, ALLOC, ...):
    the groups (MEMORY, COPY, ...) are categories the vocabulary declares, one question each."""
    tree = ast.parse(open(MODULES["superneuron.scheduler.steps"]).read())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Constant, ast.Tuple)):
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            for target in node.targets:
                names = target.elts if isinstance(target, ast.Tuple) else [target]
                if len(names) == len(values) and all(isinstance(v, ast.Constant) for v in values):
                    found.update((t.id, v.value) for t, v in zip(names, values) if t.id.isupper())
    return found


KIND_CONSTANTS = _kind_constants()


def kinds_compared(function):
    """The distinct step kinds ``function`` (an ast function) compares a ``.kind`` with, by
    constant or by string literal, in its own body (nested functions are their own)."""
    kinds = set(KIND_CONSTANTS.values())
    found = set()

    def mentions_kind(e):
        return any(isinstance(n, ast.Attribute) and n.attr == "kind" for n in ast.walk(e))

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            if isinstance(child, ast.Compare):
                operands = [child.left] + child.comparators
                if any(mentions_kind(o) for o in operands):
                    for o in operands:
                        for n in ast.walk(o):
                            if isinstance(n, ast.Name) and n.id in KIND_CONSTANTS:
                                found.add(KIND_CONSTANTS[n.id])
                            elif isinstance(n, ast.Constant) and n.value in kinds:
                                found.add(n.value)
            visit(child)

    visit(function)
    return found


def _walker_classes(trees):
    """The names of walk.Walker and of every class that derives from it, in any module."""
    bases = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                                    for b in node.bases}
    walkers, grew = {"Walker"}, True
    while grew:
        more = {name for name, of in bases.items() if of & walkers} - walkers
        walkers |= more
        grew = bool(more)
    return walkers


def branching_functions(trees):
    """``[(path, function name, kinds)]``: the functions of ``trees`` ({path: ast}) outside
    walk.py and the walkers' methods that compare step kinds with three or more kinds."""
    walkers = _walker_classes(trees.values())
    out = []
    for path, tree in trees.items():
        if path.endswith(os.path.join("scheduler", "walk.py")):
            continue
        methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name in walkers
                   for f in c.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and id(node) not in methods:
                kinds = kinds_compared(node)
                if len(kinds) >= 3:
                    out.append((path, node.name, sorted(kinds)))
    return out


def test_the_kind_scan_sees_a_chain_and_spares_the_walkers():
    # a control: a three-way chain is found, by constant or by literal; a walker's method and
    # a test for a group (MEMORY: one question) are not
    source = '''
def chain(step):
    if step.kind == FORWARD:
        return 1
    elif step.kind in (BACKWARD, "recompute"):
        return 2

def grouped(step):
    return step.kind in MEMORY or step.kind == FORWARD or step.kind == BACKWARD

class Reading(Walker):
    def run_one(self, step):
        return step.kind in (FORWARD, BACKWARD, RECOMPUTE)

class Deeper(Reading):
    def run_two(self, step):
        return step.kind in (FORWARD, BACKWARD, RECOMPUTE)
'''
    found = branching_functions({"x.py": ast.parse(source)})
    assert found == [("x.py", "chain", ["backward", "forward", "recompute"])]
    assert {"FORWARD", "ALLOC", "WAIT_REDUCE"} <= set(KIND_CONSTANTS) and "MEMORY" not in KIND_CONSTANTS


def test_no_function_outside_the_walker_branches_over_three_kinds():
    """What a kind means is written once per reading, in the walker's methods (walk.py and its
    subclasses); a pass may look for the kinds it rewrites, but a function that branches over
    three or more kinds is a chain the walker should hold (issue 31)."""
    trees = {path: ast.parse(open(path).read(), path) for path in MODULES.values()}
    found = branching_functions(trees)
    assert not found, "functions that branch over 3+ step kinds:\n" + "\n".join(
        f"{os.path.relpath(p, PACKAGE)} {name}: {', '.join(kinds)}" for p, name, kinds in found)
