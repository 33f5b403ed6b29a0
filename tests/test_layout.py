"""The import graph of harness/ and codecs/ has no cycles, and each process's package stays on its side.

Imports are read from the source (ast), module-level and function-level alike:
a lazy import that closes a cycle is still a cycle in the design.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"harness": ROOT / "harness", "wirecodecs": ROOT / "codecs"}


def _module_name(package: str, folder: Path, path: Path) -> str:
    parts = [package, *path.relative_to(folder).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(pkg, folder, path): path for pkg, folder in PACKAGES.items() for path in folder.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports (``from x import y`` counts x.y when that is a module)."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        out.update(t for t in targets if t in known)
    out.discard(name)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_import_graph_has_no_cycles() -> None:
    graph = _graph()
    # Package __init__ files that re-export their modules import them: an edge
    # from a module to its own package's __init__ is how Python loads it, not a cycle.
    for name in graph:
        parent = name.rpartition(".")[0]
        graph[name].discard(parent)
    assert _find_cycle(graph) is None, " -> ".join(_find_cycle(graph) or [])


def test_the_engine_does_not_import_the_frontend_and_back() -> None:
    graph = _graph()
    for name, deps in graph.items():
        if name.startswith("harness.engine"):
            assert not any(d.startswith("harness.frontend") for d in deps), (name, deps)
        if name.startswith("harness.frontend"):
            # The frontend may read the engine's config (to agree on limits), nothing else of it.
            assert all(d == "harness.engine.config" for d in deps if d.startswith("harness.engine")), (name, deps)


def test_the_graph_is_read_and_a_cycle_would_be_found() -> None:
    graph = _graph()
    assert "harness.frontend.inputs" in graph["harness.frontend.app"]
    assert "wirecodecs.base" in graph["wirecodecs.msgspec_codec"]
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
