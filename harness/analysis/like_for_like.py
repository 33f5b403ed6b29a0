"""Can arms be judged against each other?  The settings that shape latency must match.

The arms of one bench run agree by construction; arms gathered from separate
sources (the ``bench load`` rounds of two servers, run files of several runs)
may have run another workload, rate, executor, block size, or on another
machine, which changes every figure whatever the change under test does. The
gate, ``bench compare`` and ``bench report`` refuse such arms (exit 2) with each
difference named, instead of reading the difference as a verdict; with
``--unlike`` the last two show their figures side by side, without verdicts.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.analysis.documents import ResultsError, own_send_times
from harness.analysis.runs import RunEntry
from harness.analysis.verdicts import Arm, Comparison, judged_figures
from harness.engine.config import EngineConfig
from harness.engine.step_time import LINEAR, fixed_ms_of, step_time_model
from harness.frontend.served import ServedSettings
from harness.loadgen.settings import LoadSettings
from harness.settings.declare import comparable
from harness.workloads.registry import datasets
from harness.workloads.spec import WorkloadSpec

# The experiment plan's comparable settings (harness.experiment.settings.RunPlan declares them), named
# here because analysis sits below experiment in the layers (tests/test_layout.py); a test holds them equal.
PLAN_SETTINGS = ("block_size", "duet", "block_gap", "pin_servers")


def compared_settings() -> tuple[str, ...]:
    """The flags of a run that change what it measures: the workload's and every registered dataset's,
    what is served, the load's (each declared with its setting, harness.settings.declare) and the plan's.
    A flag missing from an older document is not compared, except those in DEFAULTS."""
    workload = comparable(WorkloadSpec, *(d.options for d in datasets()))
    return (*workload, *comparable(ServedSettings, EngineConfig, LoadSettings), *PLAN_SETTINGS)


# What an absent flag meant: block_size's absence sequential turns, image_reuse's no image repeated.
DEFAULTS = {"block_size": 0, "duet": False, "pin_servers": "", "image_reuse": 0.0}
# The flag that shows unlike arms' figures side by side, without verdicts (bench compare, bench report).
UNLIKE_FLAG = "--unlike"
UNLIKE_HINT = f"{UNLIKE_FLAG} shows their figures side by side, without verdicts"
MACHINE = ("hostname", "machine", "cpu_model", "cpu_usable")  # from a run file's metadata, when both have it


def run_settings(entry: RunEntry) -> dict[str, Any]:
    """The settings of one run, from its run file (none for a run embedded in a compact compare file)."""
    if entry.doc is None:
        return {}
    meta = entry.doc.get("metadata") or {}
    flags = meta.get("flags") or {}
    out = {key: flags.get(key, DEFAULTS.get(key)) for key in compared_settings() if key in flags or key in DEFAULTS}
    if own_send_times(entry.doc):  # each request went at its own time: rate and burstiness played no part
        out.pop("burstiness", None)
    elif flags.get("request_rate") is not None:
        out["request_rate"] = flags["request_rate"]
    if "sim_step_fixed_ms" in out or "sim_step_per_token_ms" in out:
        # The knobs' flags default to None (the step model's own) since the models came; earlier runs
        # recorded linear's 2.0 and 0.01. Compare what the engine ran, not how it was spelled.
        # A model's own fixed part can change between versions (llama8b-h100: 2.0 ms, then 4.0): when the
        # flag was left to it, the engine's report of the step model says what it ran.
        fixed = flags.get("sim_step_fixed_ms")
        if fixed is None:
            fixed = fixed_ms_of((meta.get("engine") or {}).get("sim_step"))
        with contextlib.suppress(ValueError, TypeError):  # a model this version does not know: as recorded
            model = step_time_model(
                flags.get("sim_step_model") or LINEAR,
                fixed,
                flags.get("sim_step_per_token_ms"),
            )
            out["sim_step_fixed_ms"], out["sim_step_per_token_ms"] = model.fixed_ms, model.per_token_ms
    overlapped = (meta.get("engine") or {}).get("overlapped")
    if overlapped is not None:  # what the engine said its loop ran
        out["no_async_scheduling"] = not overlapped
    elif "executor" in flags and (flags["executor"] != "sim" or "no_async_scheduling" not in flags):
        # Runs from before the engine said so: torch ran in series, and so did sim before the setting.
        out["no_async_scheduling"] = True
    out.update({key: meta[key] for key in MACHINE if key in meta})
    return out


class UnlikeArms(ResultsError):
    """Verdicts asked of arms whose settings differ; ``lines`` names each difference."""

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__("the arms ran with different settings: " + "; ".join(lines))
        self.lines = list(lines)


@dataclass(frozen=True)
class Difference:
    """One setting in which an arm's runs differ from the reference arm's, or from each other's."""

    arm: str
    setting: str
    text: str  # 'ARM: name: BASE_LABEL BASE_VALUE, ARM ARM_VALUE'


def differences(arms: Sequence[Arm]) -> list[Difference]:
    """Each setting in which an arm's runs differ from the first arm's (its first run with a file),
    or in which one arm's runs differ among themselves (runs pooled from several folders or files).
    Arms from one bench run agree by construction; arms from separate sources may not."""
    if not arms:
        return []
    base = _first_settings(arms[0])
    out = []
    for index, arm in enumerate(arms):
        runs = [s for r in arm.runs if (s := run_settings(r))]
        for key in dict.fromkeys(k for s in runs for k in s):
            values = _distinct(s[key] for s in runs if key in s)
            if index == 0 or key not in base:  # against its own runs only
                if len(values) > 1:
                    out.append(Difference(arm.label, key, f"{arm.label}: {key}: its runs differ: {_listed(values)}"))
            elif values != [base[key]]:
                text = f"{arm.label}: {key}: {arms[0].label} {base[key]!r}, {arm.label} {_listed(values)}"
                out.append(Difference(arm.label, key, text))
    return out


def arm_differences(arms: Sequence[Arm]) -> list[str]:
    """``differences`` as lines, e.g. 'head: num_prompts: base 100, head 999'."""
    return [d.text for d in differences(arms)]


def not_judged_line(found: Sequence[Difference]) -> str:
    """The header shown above the figures of unlike arms, where verdicts would be."""
    settings = ", ".join(dict.fromkeys(d.setting for d in found))
    return f"not judged: the arms differ in {settings}"


def refusal(prog: str, lines: Sequence[str], hint: str = UNLIKE_HINT) -> str:
    """Unlike arms asked for verdicts: the error, one line per difference, then how to look anyway."""
    return "\n".join(
        [
            f"{prog}: error: the arms ran with different settings, so no verdict is drawn:",
            *(f"  {line}" for line in lines),
            f"{prog}: hint: {hint}",
        ]
    )


def side_by_side(arms: Sequence[Arm]) -> Comparison:
    """The arms' figures (median over rounds) without a verdict: the figures some run measured."""
    runs = [r for arm in arms for r in arm.measured]
    shown = [f for f in judged_figures(runs) if any(math.isfinite(v) for a in arms for v in a.values(f.key))]
    return Comparison(list(arms), shown)


def _first_settings(arm: Arm) -> dict[str, Any]:
    return next((s for r in arm.runs if (s := run_settings(r))), {})


def _distinct(values: Iterable[Any]) -> list[Any]:
    """The values in order, each once (settings may be lists or dicts: compared by ==, not hashed)."""
    out: list[Any] = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _listed(values: Sequence[Any]) -> str:
    return " / ".join(repr(v) for v in values)
