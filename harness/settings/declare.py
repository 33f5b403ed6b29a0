"""Settings declared once: a dataclass field carries its flag, help, default and whether it makes two
runs incomparable. The argparse arguments, the value read back from parsed flags, the flags a spawned
``bench serve`` gets and the comparability check are derived from those fields, never listed again.

    @dataclass(frozen=True)
    class Limits:
        max_num_seqs: int = setting(64, flag="--max-num-seqs", help="...", comparable=True)
        spans: bool = setting(True, flag="--no-spans", help="...")  # a switch that turns it off

A ``bool`` setting is a switch (``store_true``): giving its flag flips the default, so ``spans=True``
is declared with ``--no-spans``. A flag's destination is argparse's (``--engine-threads`` →
``engine_threads``), which is also its key in the flags a run file records; it may differ from the
field's name. Fields without ``setting`` (values a program fills in) have no flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

T = TypeVar("T")
_KEY = "wirebench.setting"


@dataclass(frozen=True)
class Flag:
    """How one setting appears on a command line. ``choices`` may be a function, asked each time the
    arguments are added (a registry that grows after import)."""

    flag: str
    help: str | None = None
    type: Callable[[str], Any] | None = None
    choices: Sequence[Any] | Callable[[], Sequence[Any]] | None = None
    metavar: str | None = None
    comparable: bool = False
    aliases: tuple[str, ...] = ()  # other names of the same flag, e.g. another tool's

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


def setting(
    default: Any,
    *,
    flag: str,
    help: str | None = None,
    type: Callable[[str], Any] | None = None,
    choices: Sequence[Any] | Callable[[], Sequence[Any]] | None = None,
    metavar: str | None = None,
    comparable: bool = False,
    aliases: tuple[str, ...] = (),
) -> Any:
    """A dataclass field with a flag. ``type`` defaults to ``int``/``float`` for such defaults, else str;
    ``comparable``: two runs that differ in it measured different things (harness.analysis.like_for_like)."""
    if type is None and isinstance(default, int | float) and not isinstance(default, bool):
        type = int if isinstance(default, int) else float
    spec = Flag(flag, help, type, choices, metavar, comparable, aliases)
    return field(default=default, metadata={_KEY: spec})


@dataclass(frozen=True)
class Declared:
    """One declared field: its name, its default (as the field holds it) and its flag."""

    name: str
    default: Any
    spec: Flag

    @property
    def dest(self) -> str:
        return self.spec.dest

    @property
    def switch(self) -> bool:
        return isinstance(self.default, bool)

    def from_flag(self, value: Any) -> Any:
        """The field's value from the parsed flag's (a given switch flips the default)."""
        return (not self.default if value else self.default) if self.switch else value

    def to_flag(self, value: Any) -> Any:
        """The parsed flag's value that gives this field ``value``."""
        return value != self.default if self.switch else value

    @property
    def flag_default(self) -> Any:
        return self.to_flag(self.default)


def declared(cls: type) -> tuple[Declared, ...]:
    """The declared fields of dataclass ``cls``, in field order."""
    out = []
    for f in fields(cls):
        spec = f.metadata.get(_KEY)
        if spec is None:
            continue
        if f.default is MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: a setting needs a default")
        out.append(Declared(f.name, f.default, spec))
    return tuple(out)


def add_arguments(group: Any, cls: type, *, exclude: Iterable[str] = ()) -> None:
    """Add the flags of ``cls``'s settings to an argparse parser or group (``exclude``: dests left out)."""
    skip = set(exclude)
    for d in declared(cls):
        if d.dest in skip:
            continue
        names = (d.spec.flag, *d.spec.aliases)
        if d.switch:
            group.add_argument(*names, action="store_true", help=d.spec.help)
            continue
        choices = d.spec.choices() if callable(d.spec.choices) else d.spec.choices
        optional = {"type": d.spec.type, "choices": choices, "metavar": d.spec.metavar, "help": d.spec.help}
        group.add_argument(*names, default=d.default, **{k: v for k, v in optional.items() if v is not None})


def field_values(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The values of ``cls``'s settings, by field name, from parsed flags by destination (``vars(args)``);
    a setting whose flag is absent is left out."""
    return {d.name: d.from_flag(values[d.dest]) for d in declared(cls) if d.dest in values}


def from_values(cls: type[T], values: Mapping[str, Any], **given: Any) -> T:
    """An instance of ``cls`` from parsed flags by destination (``vars(args)``); a setting whose flag
    is absent keeps its default; ``given`` sets fields outright (those without a flag among them)."""
    return cls(**{**field_values(cls, values), **given})


def from_args(cls: type[T], args: argparse.Namespace, **given: Any) -> T:
    """``from_values`` of a parsed command line."""
    return from_values(cls, vars(args), **given)


def flag_values(obj: Any) -> dict[str, Any]:
    """The parsed flags, by destination, that give ``obj``'s settings (what a run file records)."""
    return {d.dest: d.to_flag(getattr(obj, d.name)) for d in declared(type(obj))}


def flag_defaults(cls: type) -> dict[str, Any]:
    """Every flag destination of ``cls`` and its default as parsed."""
    return {d.dest: d.flag_default for d in declared(cls)}


def to_flags(obj: Any) -> list[str]:
    """The command-line flags that reproduce ``obj``'s settings: only those that differ from their
    defaults (and are not None); a switch is its bare flag."""
    out: list[str] = []
    for d in declared(type(obj)):
        value = getattr(obj, d.name)
        if value is None or value == d.default:
            continue
        out += [d.spec.flag] if d.switch else [d.spec.flag, str(value)]
    return out


def comparable(*classes: type) -> tuple[str, ...]:
    """The flag destinations of the settings that make two runs incomparable, first seen first."""
    names = (d.dest for cls in classes for d in declared(cls) if d.spec.comparable)
    return tuple(dict.fromkeys(names))


def flag_type(parse: Callable[[str], T], *errors: type[Exception]) -> Callable[[str], T]:
    """An argparse type from ``parse``: its ``errors`` (default ValueError) become argparse's, message kept."""
    caught = errors or (ValueError,)

    def checked(text: str) -> T:
        try:
            return parse(text)
        except caught as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    checked.__name__ = getattr(parse, "__name__", "value")
    return checked
