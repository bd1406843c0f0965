"""The house rules of `ddtree_ops/`, read off the source (AST, nothing imported):

- no import circle between its modules;
- rooms have floors, and a room imports only from lower floors (or from itself);
- no module over MAX_LINES (host_scripts/ aside: they travel to hosts as single stdlib files);
- at most MAX_TOP_LEVEL modules directly in ddtree_ops/;
- no import of a ddtree_ops module inside a function, and a third-party import is deferred into
  a function only for the heavy optional dependencies named in DEFERRED.

Each checker is also run on a small made-up package that breaks its rule, so none can pass vacuously.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "ddtree_ops"
MAX_LINES = 450
MAX_TOP_LEVEL = 5  # __init__, config, exceptions, state, progress
# Floors, lowest first. A module in room R may import a room on a lower floor, or R itself.
# Modules directly in ddtree_ops/ and the data packages are the ground floor.
FLOORS = {
    "knowledge": 0,  # data: versioned YAML and its loader
    "templates": 0,  # data
    "host_scripts": 0,  # stdlib scripts that run on hosts
    "": 1,  # config, exceptions, state, progress
    "service": 2,  # the HTTP client of one server: needs no host access
    "hosts": 2,  # SSH, Ansible, probe, layout
    "lab": 3,  # the Docker fleet (its hosts are reached through hosts/)
    "provision": 4,
    "deploy": 5,
    "health": 6,
    "compare": 6,
    "sweep": 7,  # redeploys (deploy) and measures (compare)
    "cli": 8,
}
# Third-party modules that may be imported inside a function (each site says why in a comment).
DEFERRED = {"ansible_runner", "docker", "matplotlib", "setuptools"}


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.lru_cache(maxsize=None)
def modules(root: Path) -> dict[str, Path]:
    return {module_name(root, p): p for p in sorted(root.rglob("*.py"))}


def _resolve(name: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = name.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(root: Path) -> dict[str, list[tuple[str, int, bool]]]:
    """module -> [(imported module, line, inside a function)] for imports of the package itself and others."""
    known = modules(root)
    graph: dict[str, list[tuple[str, int, bool]]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text())
        in_function: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                in_function |= {id(n) for n in ast.walk(node) if n is not node}
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, path.name == "__init__.py", node)
                # `from . import x` imports the module x when there is one.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            for target in targets:
                found.append((target, node.lineno, id(node) in in_function))
        graph[name] = found
    return graph


def internal_edges(root: Path) -> dict[str, set[str]]:
    known = modules(root)
    edges: dict[str, set[str]] = {name: set() for name in known}
    for name, found in imports(root).items():
        for target, _line, _inside in found:
            # `import a.b.c` depends on the deepest module of the package it names.
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and target != root.name:
                edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def room(root: Path, name: str) -> str:
    """The subpackage a module lives in ("" for the modules directly in the package)."""
    parts = modules(root)[name].relative_to(root).parts
    return parts[0] if len(parts) > 1 else ""


def upward_imports(root: Path, floors: dict[str, int]) -> list[str]:
    problems = []
    for name, targets in internal_edges(root).items():
        here = room(root, name)
        for target in targets:
            there = room(root, target)
            if there != here and floors[there] >= floors[here]:
                problems.append(f"{name} ({here or 'ground'}, floor {floors[here]}) imports {target} ({there or 'ground'}, floor {floors[there]})")
    return sorted(problems)


def unknown_rooms(root: Path, floors: dict[str, int]) -> list[str]:
    return sorted({room(root, name) for name in modules(root)} - set(floors))


def long_modules(root: Path, max_lines: int) -> list[str]:
    out = []
    for name, path in modules(root).items():
        if room(root, name) == "host_scripts":
            continue  # shipped to hosts on stdin as one stdlib file each
        n = len(path.read_text().splitlines())
        if n > max_lines:
            out.append(f"{name}: {n} lines")
    return out


def top_level_modules(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob("*.py"))


def imports_in_functions(root: Path, deferred: set[str]) -> list[str]:
    problems = []
    for name, found in imports(root).items():
        if room(root, name) == "host_scripts":
            continue  # stand-alone stdlib scripts run on hosts: they import what the host has, when they need it
        for target, line, inside in found:
            if not inside:
                continue
            if target == root.name or target.startswith(root.name + "."):
                problems.append(f"{name}:{line} imports {target} inside a function")
            elif target.split(".")[0] not in deferred:
                problems.append(f"{name}:{line} defers {target} (not a listed heavy optional dependency)")
    return problems


# --- the rules, on ddtree_ops ----------------------------------------------------------------------


def test_every_room_has_a_floor():
    assert unknown_rooms(PACKAGE, FLOORS) == []


def test_no_import_circle():
    assert cycles(internal_edges(PACKAGE)) == []


def test_no_room_imports_a_higher_or_equal_floor():
    assert upward_imports(PACKAGE, FLOORS) == []


def test_no_module_is_over_the_line_limit():
    assert long_modules(PACKAGE, MAX_LINES) == []


def test_only_a_handful_of_modules_directly_in_the_package():
    top = top_level_modules(PACKAGE)
    assert len(top) <= MAX_TOP_LEVEL, top


def test_imports_sit_at_the_top_of_modules():
    assert imports_in_functions(PACKAGE, DEFERRED) == []


# --- each checker catches what it is for -------------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def bad_package(tmp_path) -> Path:
    """A made-up package that breaks every rule once."""
    return _write(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "a.py": "", "b.py": "", "c.py": "", "d.py": "", "e.py": "",  # fmt: skip
            "low/__init__.py": "",
            "low/one.py": "from . import two\n",
            "low/two.py": "from .one import x\nfrom ..high import view\n",  # circle one<->two, and an upward import
            "high/__init__.py": "",
            "high/view.py": "def f():\n    from .. import a\n    import requests\n",  # imports inside a function
            "high/big.py": "x = 1\n" * (MAX_LINES + 1),
            "attic/old.py": "",
        },
    )


def test_the_checkers_catch_each_broken_rule(bad_package):
    floors = {"": 0, "low": 1, "high": 2}
    modules.cache_clear()
    assert unknown_rooms(bad_package, floors) == ["attic"]
    floors["attic"] = 0
    assert cycles(internal_edges(bad_package)) == [["pkg.low.one", "pkg.low.two"]]
    assert upward_imports(bad_package, floors) == ["pkg.low.two (low, floor 1) imports pkg.high.view (high, floor 2)"]
    assert long_modules(bad_package, MAX_LINES) == [f"pkg.high.big: {MAX_LINES + 1} lines"]
    assert len(top_level_modules(bad_package)) == 6 > MAX_TOP_LEVEL
    assert imports_in_functions(bad_package, DEFERRED) == [
        "pkg.high.view:2 imports pkg.a inside a function",
        "pkg.high.view:3 defers requests (not a listed heavy optional dependency)",
    ]
