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


# The layers, bottom-up (docs/architecture.md): a package may import its own layer and those below.
LAYERS = [
    {"wirecodecs"},
    {
        "harness.wire",
        "harness.transports",
        "harness.settings",
        "harness.tokenizers",
        "harness.processes",
        "harness.server_metrics",
    },
    # the server processes: ours, vLLM's, SGLang's
    {"harness.engine", "harness.frontend", "harness.vllm_plugin", "harness.sglang_hook"},
    {"harness.workloads", "harness.loadgen"},
    {"harness.micro"},
    {"harness.analysis"},
    {"harness.experiment"},
    {"harness.commands", "harness.cli"},
]


def _layer(module: str) -> int | None:
    for i, packages in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in packages):
            return i
    return None


# The imports up the layers, on purpose: the vllm codec's adapter maps our wire messages onto
# vLLM's own, and the codec checks build the messages they send, so both name them; every codec
# itself is blind to the messages it carries.
UPWARD_ALLOWED = {
    "wirecodecs.vllm_messages -> harness.wire.messages",
    "wirecodecs.conformance_samples -> harness.wire.messages",
}


def test_imports_point_down_the_layers() -> None:
    upward = []
    for name, deps in _graph().items():
        here = _layer(name)
        for dep in deps:
            there = _layer(dep)
            if here is not None and there is not None and there > here:
                upward.append(f"{name} -> {dep}")
    assert sorted(set(upward) - UPWARD_ALLOWED) == [], "\n".join(upward)


def test_nothing_imports_a_command_module() -> None:
    importers = [
        f"{name} -> {dep}"
        for name, deps in _graph().items()
        for dep in deps
        if dep.startswith("harness.commands.") and name != dep
    ]
    assert not importers, "\n".join(importers)


# A module holds one job; one that needs more room than this holds more than one.
MAX_LINES = 800


def test_every_harness_module_is_in_a_layer_and_of_one_jobs_length() -> None:
    for name, path in _modules().items():
        if name in ("harness", "harness.__init__"):
            continue
        assert _layer(name) is not None, f"{name} belongs to no layer"
        lines = len(path.read_text().splitlines())
        assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines"


def test_no_argparse_internals_and_no_namespace_below_the_commands() -> None:
    """Flags become typed settings once (experiment/flags.py, LoadSettings.from_args, WorkloadSpec.from_args);
    nothing reaches into argparse's private attributes."""
    private = ("._actions", "._option_string_actions", "._action_groups", "_ActionsContainer", ".__class__ =")
    for path in [*(ROOT / "harness").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")]:
        text = path.read_text()
        assert not any(p in text for p in private), path
    for path in (ROOT / "harness" / "experiment").glob("*.py"):
        if path.name not in ("flags.py", "server_flags.py"):  # the two that define flags
            assert "import argparse" not in path.read_text(), path


def test_no_product_code_or_product_test_loads_a_study() -> None:
    """One-off studies live in scripts/studies/NAME/ with their own tests; harness/, codecs/ and tests/ may
    name one in prose or help, never build a path to one (a study can change or go without breaking them)."""
    me = Path(__file__).resolve()
    # These read the studies' folders and READMEs as docs (links, prose, the index); they load no code.
    docs_checks = (ROOT / "tests" / "test_docs.py", ROOT / "tests" / "test_index.py")
    for path in [*(ROOT / "harness").rglob("*.py"), *(ROOT / "codecs").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]:
        if path.resolve() in (me, *docs_checks):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                value = node.value
                assert value != "studies" and not (value.endswith(".py") and "studies/" in value), path
    assert not list((ROOT / "scripts").glob("test_*.py")), "a study's tests go in its folder under scripts/studies/"


def test_no_gc_freeze_reaches_the_engines_config_and_the_servers_flags() -> None:
    """--no-gc-freeze reaches the engine's config and bench serve's flags from bench run (that both
    server processes then freeze their heap, or not, is tests/test_e2e_serve.py's)."""
    from harness.cli import build_parser
    from harness.commands.serve import engine_config_from_args
    from harness.experiment.server_flags import server_flags
    from harness.tokenizers.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(None)
    for argv, frozen in ((["serve"], True), (["serve", "--no-gc-freeze"], False)):
        parser, _ = build_parser(argv)
        assert engine_config_from_args(parser.parse_args(argv), tokenizer).gc_freeze is frozen
    parser, _ = build_parser(["run", "--no-gc-freeze"])
    assert "--no-gc-freeze" in server_flags(vars(parser.parse_args(["run", "--no-gc-freeze"])), 0)


def test_what_travels_names_no_transport() -> None:
    """harness.wire sits under harness.transports: the link's rules, which name transports, live with them."""
    upward = [
        f"{name} -> {dep}"
        for name, deps in _graph().items()
        if name.startswith("harness.wire")
        for dep in deps
        if dep.startswith("harness.transports")
    ]
    assert not upward, "\n".join(upward)
