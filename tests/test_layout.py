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


def imports() -> dict[str, set[str]]:
    """Every module's imports of other package modules, at the top and inside functions alike."""
    mods = modules()
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


def test_the_modules_are_found():
    graph = imports()
    assert {"analysis", "capture", "captureset", "formats", "outputs", "mysql.connection", "summary",
            "verdict"} <= set(graph)
    assert "formats" in graph["report"] and "outputs" in graph["analysis"] and "verdict" in graph["summary"]


def test_no_import_cycles():
    found = [c for c in cycles(imports()) if c not in KNOWN_CYCLES]
    assert not found, f"import cycles: {[' ↔ '.join(sorted(c)) for c in found]}"


def test_the_bottom_layers_import_nothing_above_them():
    graph = imports()
    # the protocol core: only itself (sans-IO; habit 1 of the house style)
    for m in graph:
        if m.startswith("mysql."):
            assert all(t.startswith("mysql.") for t in graph[m]), (m, graph[m])
    assert graph["tcp"] == set()
    # the shared output helpers: nothing of the stages
    assert graph["formats"] == set()
    assert graph["console"] <= {"schema"}
    assert graph["outputs"] <= {"errors"}
    assert graph["schema"] == set()
    # the stage modules never reach up into the outputs or the command line
    outputs = {"report", "report_figures", "compare", "compare_page", "evidence", "verdict", "summary", "cli",
               "analysis"}
    for m in ("capture", "tcp", "flows", "exchanges", "sources", "captureset", "match", "clock", "decompose",
              "slowlog", "slowjoin", "threadpool", "proxy", "repair", "parallel"):
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
    floors = layers(graph)
    for level in sorted(set(floors.values())):
        print(level, " ".join(sorted(m or "(package)" for m, f in floors.items() if f == level)))
    for c in cycles(graph):
        print("cycle:", " ↔ ".join(sorted(c)))
