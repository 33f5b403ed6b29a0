"""The vLLM module layout the plugin is written against, checked before it rebinds anything.

The plugin swaps vLLM's engine-link serializer by rebinding module-level names, wraps the EngineCore
process's methods that take a request off its input queue and hand output batches to its output queue
(``harness.vllm_plugin.queues``), and reads a few fields of vLLM's messages. A vLLM that moved or
renamed any of them would otherwise run as plain vLLM, untimed, and a run would learn only afterwards
that the timings are missing; ``install`` ends the server's start with one line instead
(``problem_line``).

Checked against the versions in ``CHECKED_VERSIONS``: 0.32.0 (vLLM's CPU build in ``.venv-vllm``) by
importing it, 0.33.0 (``.venv``, installed ``--no-deps``, so ``vllm.v1.engine.core`` does not import
there) with ``python -m harness.vllm_plugin.layout --read-source``, which reads the top-level names
of a module that does not import from its source instead (a class as its methods, annotated fields and
the attributes its methods set on ``self``).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import sys
import textwrap
import types
from collections.abc import Callable
from typing import Any

from harness.vllm_plugin.queues import ADD_METHOD, STEP_METHODS

CHECKED_VERSIONS = ("0.32.0", "0.33.0")
SERIAL_UTILS = "vllm.v1.serial_utils"
ENGINE = "vllm.v1.engine"
ENGINE_CORE = "vllm.v1.engine.core"
REQUEST = "vllm.v1.request"
# The modules that build the engine link's coders and sockets, by these module-level names: the plugin
# rebinds them there (``coders.install``).
BUILDERS = (ENGINE_CORE, "vllm.v1.engine.core_client")
REBOUND = ("MsgpackEncoder", "MsgpackDecoder", "make_zmq_socket")
# Every other name the plugin uses, per module.
NAMES: dict[str, tuple[str, ...]] = {
    **{module: REBOUND for module in BUILDERS},
    ENGINE_CORE: (*REBOUND, "EngineCoreProc"),  # the engine process's class: its queues' methods are wrapped
    ENGINE: ("EngineCoreRequest", "EngineCoreOutputs", "EngineCoreOutput"),
    SERIAL_UTILS: ("MsgpackEncoder", "MsgpackDecoder"),
    REQUEST: ("Request",),
    "vllm.envs": ("VLLM_ALLOW_INSECURE_SERIALIZATION",),
}
# What the plugin reads of a class: the messages' fields the records name, the methods it calls or wraps.
MEMBERS: dict[tuple[str, str], tuple[str, ...]] = {
    (ENGINE, "EngineCoreRequest"): ("request_id", "external_req_id"),
    (ENGINE, "EngineCoreOutputs"): ("timestamp", "outputs", "utility_output"),
    (ENGINE, "EngineCoreOutput"): ("request_id",),
    (SERIAL_UTILS, "MsgpackEncoder"): ("encode", "encode_into"),
    (SERIAL_UTILS, "MsgpackDecoder"): ("decode",),
    (ENGINE_CORE, "EngineCoreProc"): (ADD_METHOD, *STEP_METHODS),
    (REQUEST, "Request"): ("request_id",),  # what add_request is given: the "ra" record names it
}
# A class read from source (``source_loader``) carries the attributes its methods set on ``self`` here.
SELF_ATTRIBUTES = "__wirebench_self_attributes__"
MAX_NAMED = 8  # problems named in the one line; the rest counted

Loader = Callable[[str], Any]


def layout_problems(load: Loader = importlib.import_module) -> list[str]:
    """What the plugin needs and this vLLM lacks, one phrase each (empty: the layout is known)."""
    problems: list[str] = []
    modules: dict[str, Any] = {}
    for name, wanted in NAMES.items():
        try:
            modules[name] = load(name)
        except Exception as exc:  # a module vLLM moved, or one that does not import here
            problems.append(f"module {name} ({type(exc).__name__}: {' '.join(str(exc).split())})")
            continue
        problems += [f"{name}.{attr}" for attr in wanted if not _has(modules[name], attr)]
    for (module, cls_name), members in MEMBERS.items():
        cls = getattr(modules.get(module), cls_name, None)
        if cls is not None:
            problems += [f"{module}.{cls_name}.{m}" for m in members if not _has_member(cls, m)]
    problems += _rebinding_problems(modules)
    return problems


def _has(module: Any, attr: str) -> bool:
    """Whether a module has ``attr``; vllm.envs answers by its ``__dir__`` (reading the attribute would
    parse the environment variable)."""
    return attr in vars(module) or attr in dir(module)


def _has_member(cls: type, member: str) -> bool:
    """A message's field (a msgspec Struct's, an annotated one, or one a plain class's methods set on
    ``self``, as vLLM's Request does) or a method."""
    annotated = (name for klass in getattr(cls, "__mro__", (cls,)) for name in vars(klass).get("__annotations__", {}))
    fields = (*getattr(cls, "__struct_fields__", ()), *annotated)
    return member in fields or callable(getattr(cls, member, None)) or member in _assigned_on_self(cls)


def _assigned_on_self(cls: type) -> set[str]:
    """The attributes the methods of ``cls`` and its bases set on ``self``, read from their source."""
    names: set[str] = set()
    for klass in getattr(cls, "__mro__", ()):
        known = vars(klass).get(SELF_ATTRIBUTES)
        if known is not None:  # a stand-in read from source
            names |= known
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):  # a builtin, or a class without its source
            continue
        names |= {name for node in tree.body if isinstance(node, ast.ClassDef) for name in _self_attributes(node)}
    return names


def _self_attributes(node: ast.ClassDef) -> set[str]:
    """``self.NAME = ...`` (or ``: T =``, ``+=``) in the class's own methods, ``self`` their first argument."""
    found: set[str] = set()
    for method in node.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or not method.args.args:
            continue
        me = method.args.args[0].arg
        for statement in ast.walk(method):
            if isinstance(statement, ast.Assign):
                targets = statement.targets
            elif isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
                targets = [statement.target]
            else:
                continue
            for target in targets:
                found |= {
                    t.attr
                    for t in ast.walk(target)
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == me
                }
    return found


def _rebinding_problems(modules: dict[str, Any]) -> list[str]:
    """The builders' coder names must be serial_utils' own classes, which the plugin wraps: a vLLM with
    coders of its own there would lose them to the wrappers."""
    serial = modules.get(SERIAL_UTILS)
    problems = []
    for module in BUILDERS:
        for name in ("MsgpackEncoder", "MsgpackDecoder"):
            found = getattr(modules.get(module), name, None)
            if serial is not None and found is not None and found is not getattr(serial, name, None):
                problems.append(f"{module}.{name} as {SERIAL_UTILS}.{name}")
    return problems


def vllm_version(load: Loader = importlib.import_module) -> str:
    try:
        return str(load("vllm").__version__)
    except Exception:
        return "(version unknown)"


def problem_line(load: Loader = importlib.import_module) -> str | None:
    """The one line that ends a server's start when this vLLM's layout is not the known one, or None."""
    problems = layout_problems(load)
    if not problems:
        return None
    named = ", ".join(problems[:MAX_NAMED]) + (f" and {len(problems) - MAX_NAMED} more" if problems[MAX_NAMED:] else "")
    return (
        f"wirebench plugin: vLLM {vllm_version(load)} is not laid out as the plugin knows it (checked against "
        f"vLLM {' and '.join(CHECKED_VERSIONS)}): looked for {named}; stopping rather than serving as plain, "
        "untimed vLLM"
    )


# --- reading a module that does not import (a --no-deps install) ---------------------------------------------


def source_loader(name: str) -> Any:
    """``name`` imported, or, when it does not import, a stand-in holding the top-level names its source
    binds: ``from X import Y`` as X's own Y where X imports, anything else as a placeholder."""
    try:
        return importlib.import_module(name)
    except ImportError:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read(), spec.origin)
    stand_in = types.ModuleType(name)
    for node in tree.body:
        for bound, value in _top_level_names(node, stand_in):
            setattr(stand_in, bound, value)
    return stand_in


def _top_level_names(node: ast.stmt, module: types.ModuleType) -> list[tuple[str, Any]]:
    """The names a statement of a module's body binds, with a stand-in value each (``module``: the
    stand-in so far, where a class finds its bases)."""
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [(a.asname or a.name, _imported(node.module, a.name)) for a in node.names]
    if isinstance(node, ast.Import):
        return [((a.asname or a.name).split(".")[0], object()) for a in node.names]
    if isinstance(node, ast.ClassDef):
        return [(node.name, _stand_in_class(node, module))]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [(node.name, object())]
    if isinstance(node, ast.Assign):
        return [(t.id, object()) for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [(node.target.id, object())]
    return []


def _stand_in_method(*args: Any, **kwargs: Any) -> None:
    """What a method of a class read from source stands for: only its name is checked."""


def _stand_in_class(node: ast.ClassDef, module: types.ModuleType) -> type:
    """A class of a module read from source: its methods (as stand-ins), its annotated fields, the
    attributes its methods set on ``self``, and its bases where they are stand-ins of the same module."""
    bases = [getattr(module, b.id, None) for b in node.bases if isinstance(b, ast.Name)]
    namespace: dict[str, Any] = {
        item.name: _stand_in_method for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    fields = [item.target for item in node.body if isinstance(item, ast.AnnAssign)]
    namespace["__annotations__"] = {field.id: object for field in fields if isinstance(field, ast.Name)}
    namespace[SELF_ATTRIBUTES] = frozenset(_self_attributes(node))
    namespace["__module__"] = module.__name__
    return type(node.name, tuple(b for b in bases if isinstance(b, type) and SELF_ATTRIBUTES in vars(b)), namespace)


def _imported(module: str, attr: str) -> Any:
    try:
        return getattr(importlib.import_module(module), attr)
    except Exception:
        return object()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.vllm_plugin.layout",
        description="Check that this Python's vLLM has the module layout the wirebench plugin is written against.",
    )
    parser.add_argument(
        "--read-source",
        action="store_true",
        help="a module that does not import (vLLM installed --no-deps) is read from its source",
    )
    args = parser.parse_args(argv)
    load = source_loader if args.read_source else importlib.import_module
    line = problem_line(load)
    if line is not None:
        print(line, file=sys.stderr)
        return 1
    print(f"vLLM {vllm_version(load)}: the layout the plugin knows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
