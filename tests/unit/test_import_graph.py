"""The one-way import rule between Hydra's packages, read from the source (every import,
function-level ones included), and no import cycle between modules.

    hydrad.common        imports nothing else of Hydra
    hydrad.wire          imports only hydrad.common
    hydrad.engine        never imports the coordinator (nor cli, nor tui)
    hydrad.coordinator   never imports the engine (nor cli, nor tui)
    hydrad.store         the KV store: imports only hydrad.common (usable alone)
    hydrad.cli           the command line: may import anything in hydrad; nothing imports it
    tui                  imports only hydrad.wire and hydrad.common (it talks to the admin API)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("hydrad", "tui")

# package -> packages it must never import (prefix match on dotted names)
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "hydrad.common": ("hydrad.wire", "hydrad.engine", "hydrad.coordinator", "hydrad.cli", "tui"),
    "hydrad.wire": ("hydrad.engine", "hydrad.coordinator", "hydrad.cli", "tui"),
    "hydrad.engine": ("hydrad.coordinator", "hydrad.cli", "tui"),
    "hydrad.coordinator": ("hydrad.engine", "hydrad.cli", "tui"),
    "hydrad.store": ("hydrad.wire", "hydrad.engine", "hydrad.coordinator", "hydrad.cli", "tui"),
    "hydrad.cli": ("tui",),
    "tui": ("hydrad.engine", "hydrad.coordinator", "hydrad.cli"),
}
# every module of hydrad lives in one of these packages (the top level holds only __init__)
PACKAGES = ("hydrad.common", "hydrad.wire", "hydrad.engine", "hydrad.coordinator", "hydrad.cli", "hydrad.store")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for root in ROOTS for p in sorted((REPO / root).rglob("*.py"))}


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The longest known module a dotted import name refers to (``a.b.C`` → ``a.b``)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(module: str, *, top_level_only: bool = False) -> set[str]:
    """Hydra modules ``module`` imports (``from pkg import mod`` counts as importing ``pkg.mod``)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    if top_level_only:  # top level, plus what sits under if/try at the top (TYPE_CHECKING aside)
        nodes = [n for stmt in tree.body for n in ast.walk(stmt)
                 if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] not in ROOTS:
                continue
            target = _resolve(name)
            if target is not None and target != module:
                out.add(target)
    return out


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_modules_are_found() -> None:
    assert "hydrad.engine.core" in MODULES and "hydrad.coordinator.daemon" in MODULES and "tui.app" in MODULES


def test_every_hydrad_module_sits_in_a_plane_or_shared_package() -> None:
    stray = [m for m in MODULES if m.startswith("hydrad.") and not any(_inside(m, p) for p in PACKAGES)]
    assert stray == []


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package: str) -> None:
    bad = sorted(f"{m} imports {t}" for m in MODULES if _inside(m, package)
                 for t in imports(m) if any(_inside(t, f) for f in FORBIDDEN[package]))
    assert bad == []


def test_hydrad_never_imports_the_console() -> None:
    bad = sorted(f"{m} imports {t}" for m in MODULES if _inside(m, "hydrad") for t in imports(m) if _inside(t, "tui"))
    assert bad == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _parents(module: str) -> set[str]:
    """A package's ``__init__`` runs before its modules: importing ``a.b.c`` imports ``a`` and ``a.b``."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


@pytest.mark.parametrize("top_level_only", [True, False], ids=["top-level", "all"])
def test_no_import_cycles(top_level_only: bool) -> None:
    graph = {m: {t for t in imports(m, top_level_only=top_level_only) if t not in _parents(m)} for m in MODULES}
    assert _cycles(graph) == []


def test_the_checker_sees_function_level_imports_and_cycles() -> None:
    assert "hydrad.cli.up" in imports("hydrad.cli.hydractl")  # imported inside cmd_up only
    assert "hydrad.cli.up" not in imports("hydrad.cli.hydractl", top_level_only=True)
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
