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
error naming its entry point; so is one whose module raises anything at import
(SystemExit included): that is its own error, and every other codec keeps
working. ``bench check-codec NAME`` runs the conformance checks
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
# The longest error text from a codec's own code that is shown: enough to read, never megabytes.
MAX_ERROR_CHARS = 2000

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


def codec_class(name: str) -> type[Codec]:
    """The class registered as ``name``; UnknownCodecError saying why when there is none or it is unusable."""
    if name in unavailable_codecs():
        raise UnknownCodecError(f"codec {name!r} is not installed: run {unavailable_codecs()[name]}")
    if name not in _registered():
        raise UnknownCodecError(f"unknown codec {name!r}; available: {', '.join(available_codecs())}")
    found = _load(name)
    if isinstance(found, str):
        raise UnknownCodecError(found)
    return found


@cache
def _load(name: str) -> type[Codec] | str:
    """The class registered as ``name``, or why it cannot be used (a failure is remembered: a broken
    plugin is imported once, not again each time another codec walks the registry)."""
    module_name, _, attr = _registered()[name].partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attr)
        problem = _problem(found)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # whatever a plugin raises, SystemExit included, is that plugin's error alone
        return f"codec {name!r} is registered as {where(name)} but cannot be loaded: {error_text(exc)}"
    if problem:
        return f"codec {name!r} is registered as {where(name)}, which {problem}"
    return found


def where(name: str) -> str:
    """How a codec is registered, for an error: its entry point, or the built-in's class."""
    target = _registered()[name]
    if name in _BUILTIN:
        return f"the built-in {target!r}"
    return f"entry point '{name} = {target}' (group {ENTRY_POINT_GROUP!r})"


def _problem(found: object) -> str:
    """Why a registered object cannot serve as a codec (empty when it can)."""
    if not (isinstance(found, type) and issubclass(found, Codec)):
        return f"is {found!r}, not a wirecodecs.Codec subclass"
    if inspect.isabstract(found):
        return f"does not define {' and '.join(sorted(found.__abstractmethods__))}"
    if not isinstance(getattr(found, "name", None), str):
        return "sets no name (a str class attribute)"
    unknown = set(found.multimodal_kinds) - ALL_MULTIMODAL_KINDS
    if unknown:
        return f"declares unknown multimodal kinds {sorted(unknown)} (known: {sorted(ALL_MULTIMODAL_KINDS)})"
    return ""


def error_text(exc: BaseException, limit: int | None = MAX_ERROR_CHARS) -> str:
    """``Type: message`` of an exception from code we do not control, on one line and cut to ``limit``
    characters (None: whole), even when its ``__str__`` raises."""
    message = " ".join(message_of(exc).splitlines())
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if limit is None else shortened(text, limit)


def message_of(exc: BaseException) -> str:
    """``str(exc)``, or what went wrong making it (a plugin's exception may break its own ``__str__``)."""
    try:
        text = str(exc)
    except KeyboardInterrupt:
        raise
    except BaseException as inner:
        return f"<its message could not be read: str() raised {type(inner).__name__}>"
    return text


def shortened(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit:,} more characters cut]"


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
    """Usable codecs that send big buffers as frames of their own (a broken plugin is named when chosen)."""
    return [name for name in usable_codecs() if sends_out_of_band(name)]


def usable_codecs() -> list[str]:
    """The available codecs whose class loads and is a usable Codec."""
    return [name for name in available_codecs() if not isinstance(_load(name), str)]


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
    """Usable codecs that carry multimodal inputs (of this kind, when given)."""
    return [name for name in usable_codecs() if (kinds := multimodal_kinds(name)) and (kind is None or kind in kinds)]
