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
            found.add(stem)
            found.update(f"{stem}.{a.name}" for a in node.names)  # `from . import x` names modules
    return {m for m in found if m in MODULES}


def _room(name):
    """The room a module is in: its subpackage (``layers``, ``scheduler``, ...) or its own name."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_the_import_reader_sees_relative_and_nested_imports():
    # a control: the reader must find what these modules are known to import
    assert "superneuron.scheduler.liveness" in imports_of("superneuron.scheduler.offload")
    assert "superneuron.allocator" in imports_of("superneuron.scheduler.simulate")
    assert "superneuron.scheduler.simulate" in imports_of("superneuron.scheduler.workspace")  # in a function


@pytest.mark.parametrize("name", sorted(m for m in MODULES if _room(m) == "scheduler"))
def test_the_scheduler_knows_steps_and_bytes_never_kernels(name):
    bad = {m for m in imports_of(name) if _room(m) in ("runtime", "layers", "backend", "cli", "net", "report")}
    assert not bad, f"{name} imports {sorted(bad)}"


@pytest.mark.parametrize("name", sorted(m for m in MODULES if _room(m) == "layers"))
def test_layers_know_shapes_and_kernels_never_the_schedule(name):
    bad = {m for m in imports_of(name) if _room(m) in ("scheduler", "runtime", "cli", "net", "graph")}
    assert not bad, f"{name} imports {sorted(bad)}"


@pytest.mark.parametrize("name", ["superneuron.allocator", "superneuron.sizes", "superneuron.errors",
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
