"""The package's import picture reads as the pipeline: no module imports one that imports it back (lazy imports inside
functions count: they hide a cycle, they do not remove it), and the bottom layers stay free of what sits above them.

`layers()` is the picture: each module's floor is one above the highest floor it imports from. Run this file
directly to print it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pcapdecomp"

# Cycles tolerated for now, listed by the modules in them: none (the last, exchanges ↔ fastlane, went with the
# lane's public hand-over API)
KNOWN_CYCLES: list[set[str]] = []


def modules() -> dict[str, Path]:
    """Module name relative to the package ('report', 'mysql.wire') -> file."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


_GRAPHS: dict[tuple, dict[str, set[str]]] = {}


def imports() -> dict[str, set[str]]:
    """Every module's imports of other package modules, at the top and inside functions alike: read once per state
    of the files (the tests here each ask for it), and the caller's own copy."""
    mods = modules()
    state = tuple((name, path.stat().st_mtime_ns, path.stat().st_size) for name, path in mods.items())
    if state not in _GRAPHS:
        _GRAPHS[state] = _imports_of(mods)
    return {m: set(targets) for m, targets in _GRAPHS[state].items()}


def _imports_of(mods: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name.removeprefix("pcapdecomp.") for a in node.names if a.name.startswith("pcapdecomp.")]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - (node.level - 1)] + (node.module.split(".") if node.module else [])
                elif node.module and (node.module == "pcapdecomp" or node.module.startswith("pcapdecomp.")):
                    base = node.module.split(".")[1:]
                else:
                    continue
                targets = [".".join(base)] + [".".join([*base, a.name]) for a in node.names]
            graph[name].update(t for t in targets if t in mods and t != name and t != "")
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layers(graph: dict[str, set[str]]) -> dict[str, int]:
    """Floor of each module: 0 imports no package module; else one above its highest import (a known cycle's
    modules share a floor)."""
    merged = {m: frozenset(c) for c in KNOWN_CYCLES for m in c}
    floor: dict[str, int] = {}

    def of(m: str) -> int:
        if m not in floor:
            group = merged.get(m, frozenset([m]))
            below = {t for g in group for t in graph[g]} - group
            level = 1 + max((of(t) for t in below), default=-1)
            for g in group:
                floor[g] = level
        return floor[m]

    for m in graph:
        of(m)
    return floor


# The pipeline's floors, one package per stage: a module imports only from its own package and the floors below
# (the top level, the commands and the spine, may import any).
FLOORS = {"core": 0, "mysql": 0, "slowlog": 1, "read": 2, "pair": 3, "explain": 4, "render": 5, "run": 6}
TOP = max(FLOORS.values()) + 1


def floor_of(module: str) -> int:
    """The floor of a module's package; a top-level module (cli, analysis, compare, …) is above every package."""
    package = module.split(".")[0]
    return FLOORS[package] if package in FLOORS else TOP


def test_the_modules_are_found():
    graph = imports()
    assert {"analysis", "read.capture", "read.captureset", "core.formats", "core.outputs", "mysql.connection",
            "explain.summary", "explain.verdict"} <= set(graph)
    assert "core.formats" in graph["render.report"] and "core.outputs" in graph["run.session"]
    assert {"read.extract", "pair.pairing", "explain.servers", "run.session", "run.spilled"} == \
        graph["analysis"] - {"read.captureset"}
    assert "explain.verdict" in graph["explain.summary"]


def test_no_import_cycles():
    found = [c for c in cycles(imports()) if c not in KNOWN_CYCLES]
    assert not found, f"import cycles: {[' ↔ '.join(sorted(c)) for c in found]}"


def test_every_module_lives_in_a_stage_package_or_is_a_command():
    """The tree is the pipeline: beside the packages only the spine, the commands (and `python3 -m pcapdecomp`'s
    entry to them) and the package's version."""
    top = {m for m in imports() if "." not in m and m and m not in FLOORS}
    assert top <= {"analysis", "cli", "__main__", "compare", "guide", "lab"}, top
    assert {m.split(".")[0] for m in imports() if "." in m} <= set(FLOORS), "a package without a floor"


def test_each_package_imports_only_its_own_and_the_floors_below():
    graph = imports()
    wrong = []
    for m, targets in graph.items():
        if m.split(".")[0] not in FLOORS:
            continue
        here = m.split(".")[0]
        for t in targets:
            there = t.split(".")[0] if "." in t else t
            if there == here or not t:
                continue
            if floor_of(t) >= floor_of(m):
                wrong.append(f"{m} → {t}")
    assert wrong == []


def test_the_bottom_layers_import_nothing_above_them():
    graph = imports()
    # the protocol core: only itself (sans-IO; habit 1 of the house style)
    for m in graph:
        if m.startswith("mysql."):
            assert all(t.split(".")[0] == "mysql" for t in graph[m]), (m, graph[m])
        if m.startswith("core."):  # the ground floor: shared tools, nothing of the stages
            assert all(t.split(".")[0] == "core" for t in graph[m]), (m, graph[m])
    assert graph["read.tcp"] == set()
    assert graph["core.formats"] == set()
    assert graph["core.schema"] == set()
    # the stage modules never reach up into the outputs or the command line
    outputs = {m for m in graph if m.startswith("render.")} | {"explain.verdict", "explain.summary", "cli",
                                                                 "analysis", "compare"}
    for m in graph:
        if m.split(".")[0] in ("read", "pair", "slowlog"):
            assert not graph[m] & outputs, (m, graph[m] & outputs)


def test_tests_share_helpers_not_each_other():
    """A test module imports helper modules (craft, streams, feeding, lanes, pcaptools, …), never another test
    module: importing one runs its module-level setup and ties the two files' fates together."""
    tests = Path(__file__).resolve().parent
    found = []
    for path in sorted(tests.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.name} imports {n}" for n in names if n.split(".")[0].startswith("test_")]
    assert found == []


if __name__ == "__main__":
    graph = imports()
    packages = sorted({m.split(".")[0] for m in graph if "." in m}, key=lambda p: (FLOORS.get(p, TOP), p))
    for package in packages:
        names = sorted(m.split(".", 1)[1] for m in graph if m.startswith(package + "."))
        print(FLOORS.get(package, TOP), package, " ".join(names))
    print(TOP, "(top)", " ".join(sorted(m for m in graph if m and "." not in m and m not in FLOORS)))
    for c in cycles(graph):
        print("cycle:", " ↔ ".join(sorted(c)))
