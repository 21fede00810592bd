"""The project's import graph: no arrow climbs a floor between packages, and no circle
(docs/design/architecture.md). Every import counts, at module level or inside a function, so neither
can hide behind a function-level import; a package's modules importing the package's own
`__init__` (e.g. `workloads.peers.opacus` -> `workloads.peers`) is no circle, as Python runs the
`__init__` first."""
from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The floors, lowest first: a module imports its own floor or one below, never one above. engine/ is
# the library measured; measuring/ how it is measured; workloads/ the registry (and what runs its
# workloads); suite/ (asv's benchmarks) and dashboards/ share a floor; vmapbench/ holds the commands.
FLOORS = (("engine",), ("measuring",), ("workloads",), ("suite", "dashboards"), ("vmapbench",))
FLOOR = {package: level for level, packages in enumerate(FLOORS) for package in packages}
PACKAGES = tuple(sorted(FLOOR))


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """module -> the modules of `packages` it imports (a name resolved to its longest module prefix)."""
    files = {module_name(root, p): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name and name != mod and not mod.startswith(name + "."):
                    graph[mod].add(name)
    return graph


@functools.lru_cache(maxsize=1)
def project_graph() -> dict[str, set[str]]:
    """The repository's own graph, parsed once for the checks below (they only read it)."""
    return import_graph()


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle(package: str) -> None:
    mine = [c for c in circles(project_graph()) if any(m == package or m.startswith(package + ".") for m in c)]
    assert not mine, f"import circles through {package}/ (each module must import only downward): {mine}"


def test_a_circle_is_found_even_through_a_function_level_import(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from pkg.sub import leaf\n")  # its own package: no circle
    (package / "sub" / "leaf.py").write_text("from pkg import sub\n")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("from . import c\n")
    (package / "c.py").write_text("def late():\n    from pkg.a import something\n")
    (package / "d.py").write_text("import pkg.a\n")
    assert circles(import_graph(tmp_path, ("pkg",))) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_the_engine_runs_no_git() -> None:
    # The engine is the library measured: commands (its coverage report, which runs git and writes
    # results/) live in vmapbench/commands/.
    found = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "engine").rglob("*.py"))
             if any(word in p.read_text() for word in ('"git"', "'git'"))]
    assert not found, "engine/ runs no git:\n" + "\n".join(found)


def climbing_arrows(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, package) for each import of a package on a higher floor than the module's."""
    return sorted({(mod, name.split(".")[0]) for mod, names in graph.items() for name in names
                   if FLOOR[name.split(".")[0]] > FLOOR[mod.split(".")[0]]})


def test_every_package_has_a_floor() -> None:
    packages = sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))
    assert packages == list(PACKAGES), f"a package of the repository without a floor in FLOORS: {packages}"


def test_no_import_climbs_a_floor() -> None:
    found = climbing_arrows(project_graph())
    order = " -> ".join("/".join(packages) for packages in FLOORS)
    assert not found, (f"imports that climb a floor (allowed order, lowest first: {order}); move the code "
                       "imported down a floor, or inject it:\n" + "\n".join(f"{m} imports {p}" for m, p in found))


def test_measuring_imports_no_other_package() -> None:
    # The gate runs measured commits' trees (engine/ and workloads/ alone) with its own checkout's
    # measuring/, so measuring/ must not reach into an engine or workloads of another commit.
    found = sorted((mod, name) for mod, names in project_graph().items() if mod.split(".")[0] == "measuring"
                   for name in names if name.split(".")[0] != "measuring")
    assert not found, "measuring/ imports nothing else of the project:\n" + "\n".join(f"{m} imports {n}" for m, n in found)


def test_a_climbing_import_inside_a_function_is_found(tmp_path: Path) -> None:
    for package in ("workloads", "measuring"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "workloads" / "base.py").write_text("from measuring import timer\n")  # downward: fine
    (tmp_path / "measuring" / "timer.py").write_text("def f():\n    from workloads.base import x\n")
    graph = import_graph(tmp_path, ("measuring", "workloads"))
    assert climbing_arrows(graph) == [("measuring.timer", "workloads")]
