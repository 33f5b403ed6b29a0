"""Codec names to classes: the built-ins plus any registered by entry point.

A third-party package adds a codec by declaring, in its pyproject.toml::

    [project.entry-points."wirebench.codecs"]
    my-codec = "my_package.my_module:MyCodec"

The class subclasses ``wirecodecs.Codec``: it sets ``name``, defines
``encode`` and ``decode``, and declares the facts where it differs from the
defaults (``carries_multimodal``, ``multimodal_kinds``, ``out_of_band``,
``packed_token_ids``, ``unpickles_peer_data``), which the registry reads from
the class. A registered class that is not a Codec, leaves ``encode`` or
``decode`` abstract, or names an unknown multimodal kind is refused with an
error naming its entry point. ``bench check-codec NAME`` runs the conformance checks
(``wirecodecs.conformance``) against a registered codec.

Built-ins are imported lazily by name. A name may carry calibration options
after ``+`` (``pickle+request-delay=500us``, see ``wirecodecs.calibration``).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from functools import cache
from importlib.metadata import entry_points

from .base import ALL_MULTIMODAL_KINDS, Codec

ENTRY_POINT_GROUP = "wirebench.codecs"

_BUILTIN: dict[str, str] = {
    "pickle": "wirecodecs.pickle_codec:PickleCodec",
    "pickle-oob": "wirecodecs.pickle_codec:PickleOobCodec",
    "msgspec": "wirecodecs.msgspec_codec:MsgspecCodec",
    "msgspec-b64": "wirecodecs.msgspec_codec:MsgspecB64Codec",
    "msgspec-oob": "wirecodecs.msgspec_codec:MsgspecOobCodec",
    "msgspec-packed": "wirecodecs.msgspec_codec:MsgspecPackedCodec",
    "vllm": "wirecodecs.vllm_codec:VllmCodec",
}

# Built-ins that need a package the base install leaves out: the module, and how to get it.
_NEEDS: dict[str, tuple[str, str]] = {
    "vllm": (
        "vllm",
        "scripts/setup.sh --with-vllm (pip install --no-deps vllm==0.33.0 plus the extra "
        "'.[vllm]': vLLM's own requirements would replace the CPU torch)",
    ),
}


class UnknownNameError(KeyError):
    """A name no registry entry answers to (or whose entry cannot be used)."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0])


class UnknownCodecError(UnknownNameError):
    pass


def registered_targets(group: str, builtin: dict[str, str]) -> dict[str, str]:
    """Names to ``module:attribute`` targets: the built-ins, then every entry point of ``group`` (one never
    takes a built-in's name). The transports' registry (harness.transports.registry) reads its own the same way."""
    found = dict(builtin)
    for ep in entry_points(group=group):
        found.setdefault(ep.name, ep.value)
    return found


@cache
def _registered() -> dict[str, str]:
    return registered_targets(ENTRY_POINT_GROUP, _BUILTIN)


def available_codecs() -> list[str]:
    """Names of every codec that ``get_codec`` accepts, built-ins first (those installed)."""
    return [name for name in _registered() if name not in unavailable_codecs()]


@cache
def unavailable_codecs() -> dict[str, str]:
    """Built-in codecs whose package is not installed → the command that installs it."""
    return {name: how for name, (module, how) in _NEEDS.items() if importlib.util.find_spec(module) is None}


def codec_listing() -> str:
    """The codecs for a help text: available ones, then the others with what they need."""
    missing = "".join(f"; {name} (not installed: {how})" for name, how in unavailable_codecs().items())
    return ", ".join(available_codecs()) + missing


@cache
def codec_class(name: str) -> type[Codec]:
    target = _registered().get(name)
    if name in unavailable_codecs():
        raise UnknownCodecError(f"codec {name!r} is not installed: run {unavailable_codecs()[name]}")
    if target is None:
        raise UnknownCodecError(f"unknown codec {name!r}; available: {', '.join(available_codecs())}")
    module_name, _, attr = target.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UnknownCodecError(f"codec {name!r} is registered as {where(name)} but cannot be loaded: {exc}") from exc
    if isinstance(found, type) and issubclass(found, Codec):
        problem = _codec_class_problem(found)
        if not problem:
            return found
    else:
        problem = f"is {found!r}, not a wirecodecs.Codec subclass"
    raise UnknownCodecError(f"codec {name!r} is registered as {where(name)}, which {problem}")


def where(name: str) -> str:
    """How a codec is registered, for an error: its entry point, or the built-in's class."""
    target = _registered()[name]
    if name in _BUILTIN:
        return f"the built-in {target!r}"
    return f"entry point '{name} = {target}' (group {ENTRY_POINT_GROUP!r})"


def _codec_class_problem(cls: type[Codec]) -> str:
    """Why a Codec subclass cannot be used (empty when it can)."""
    if inspect.isabstract(cls):
        return f"does not define {' and '.join(sorted(cls.__abstractmethods__))}"
    if not isinstance(getattr(cls, "name", None), str):
        return "sets no name (a str class attribute)"
    unknown = set(cls.multimodal_kinds) - ALL_MULTIMODAL_KINDS
    if unknown:
        return f"declares unknown multimodal kinds {sorted(unknown)} (known: {sorted(ALL_MULTIMODAL_KINDS)})"
    return ""


def split_spec(spec: str) -> tuple[str, list[str]]:
    """``"pickle+request-delay=500us"`` → ("pickle", ["request-delay=500us"]): a codec and its options."""
    base, *options = spec.split("+")
    return base, options


def get_codec(name: str) -> Codec:
    """A new codec instance (instances keep per-call state; don't share across threads).

    ``name`` may carry options after ``+`` (``pickle+request-delay=500us``): the
    calibration wrapper of ``wirecodecs.calibration`` around the named codec.
    """
    base, options = split_spec(name)
    codec = codec_class(base)()
    if multimodal_kinds(base) != ALL_MULTIMODAL_KINDS:  # it refuses some kinds: its error names who carries them
        codec.alternatives = {kind: codecs_that_carry_multimodal(kind) for kind in sorted(ALL_MULTIMODAL_KINDS)}
    if options:
        from .calibration import DelayedCodec, parse_options

        try:
            delays = parse_options(options)
        except ValueError as exc:
            raise UnknownCodecError(f"codec {name!r}: {exc}") from None
        return DelayedCodec(codec, name, delays)
    return codec


def check_codec_spec(name: str) -> str:
    """``name`` if ``get_codec`` accepts it; UnknownCodecError saying why otherwise (loads the codec)."""
    get_codec(name)
    return name


def sends_out_of_band(name: str) -> bool:
    """Whether the codec sends big buffers as frames of their own (its class says)."""
    return codec_class(split_spec(name)[0]).out_of_band


def codecs_out_of_band() -> list[str]:
    return [name for name in available_codecs() if sends_out_of_band(name)]


def packs_token_ids(name: str) -> bool:
    """Whether the codec wants prompt token ids as an int32 array (its class says)."""
    return codec_class(split_spec(name)[0]).packed_token_ids


def unpickles_peer_data(name: str) -> bool:
    """Whether the codec's decode runs code the sender chooses (its class says)."""
    return codec_class(split_spec(name)[0]).unpickles_peer_data


def multimodal_kinds(name: str) -> frozenset[str]:
    """The kinds of multimodal value ("tensor", "array", "image") the codec carries (its class says)."""
    cls = codec_class(split_spec(name)[0])
    return cls.multimodal_kinds if cls.carries_multimodal else frozenset()


def codecs_that_carry_multimodal(kind: str | None = None) -> list[str]:
    """Codecs that carry multimodal inputs (of this kind, when given)."""
    names = []
    for name in available_codecs():
        try:
            kinds = multimodal_kinds(name)
        except UnknownCodecError:
            continue
        if kinds and (kind is None or kind in kinds):
            names.append(name)
    return names
