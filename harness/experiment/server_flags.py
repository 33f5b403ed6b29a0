"""The flags of what is served (model, engine limits, payload form), and turning them back into
``bench serve`` flags: every arm of an experiment gets the same ones.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from harness.engine.config import EngineConfig
from harness.frontend.served import ServedSettings
from harness.settings.declare import add_arguments, flag_defaults, from_values, to_flags

# What is served, declared once each: the frontend's settings, then the engine's.
SERVED = (ServedSettings, EngineConfig)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of what is served (model, engine limits, payload form); `bench run` forwards these."""
    g = p.add_argument_group("served model and engine")
    for cls in SERVED:
        add_arguments(g, cls)


def server_flags(values: Mapping[str, Any], seed: int) -> list[str]:
    """The `bench serve` flags that reproduce ``values`` (parsed flags): ``--seed`` and every
    model/engine setting whose value differs from its default (harness.settings.declare.to_flags)."""
    return ["--seed", str(seed), *(flag for cls in SERVED for flag in to_flags(from_values(cls, values)))]


def model_values(flags: Sequence[str], base: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` (parsed flags) with the model/engine flags among ``flags`` read over it; other flags are
    ignored. Raises ValueError when one of them cannot be read."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    add_model_arguments(parser)
    parser.set_defaults(**base)  # every value of base, model flag or not, comes back unless a flag sets it
    try:
        own, _ = parser.parse_known_args(list(flags))
    except (argparse.ArgumentError, SystemExit) as exc:  # SystemExit: errors argparse still exits on
        raise ValueError(f"cannot read {' '.join(flags)!r}: {exc}") from None
    return vars(own)


def model_defaults() -> dict[str, Any]:
    """Every model/engine flag's destination and default."""
    return {dest: default for cls in SERVED for dest, default in flag_defaults(cls).items()}


def engine_of(flags: Sequence[str]) -> EngineConfig:
    """The engine settings ``flags`` (`bench serve` flags) give a server; ValueError when unreadable."""
    return from_values(EngineConfig, model_values(flags, model_defaults()))
