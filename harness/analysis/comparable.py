"""Can two compare documents be judged against each other?  The settings that shape latency must match.

The gate compares a current run with a baseline; a different workload, rate,
executor, block size or machine changes every figure whatever the codec does,
so such a pair is refused (exit 2) with each difference named, instead of
reading the difference as a regression.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.analysis.documents import read_json

# The flags of a run that change what it measures (workload, engine, load shape); a flag missing from
# an older document is not compared, except block_size, whose absence meant sequential turns (0).
SETTINGS = (
    "dataset_name",
    "dataset_path",
    "num_prompts",
    "sonnet_input_len",
    "sonnet_output_len",
    "sonnet_prefix_len",
    "random_input_len",
    "random_output_len",
    "random_range_ratio",
    "images_per_request",
    "image_width",
    "image_height",
    "image_format",
    "endpoint",
    "seed",
    "model_preset",
    "device",
    "dtype",
    "executor",
    "sim_step_fixed_ms",
    "sim_step_per_token_ms",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "mm_payload",
    "mm_tensor_size",
    "mm_tensor_dtype",
    "burstiness",
    "max_concurrency",
    "block_size",
)
DEFAULTS = {"block_size": 0}
MACHINE = ("machine", "cpu_model", "cpu_usable")  # from the document's metadata.machine, when both have it


def metadata(path: str | Path) -> dict[str, Any]:
    """A compare document's metadata ({} when it has none)."""
    return read_json(Path(path)).get("metadata") or {}


def differences(current: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    """Each setting the two documents' metadata disagree on, as 'name: baseline X, current Y'."""
    out = []
    flags_now, flags_then = current.get("flags") or {}, baseline.get("flags") or {}
    for key in SETTINGS:
        now, then = flags_now.get(key, DEFAULTS.get(key)), flags_then.get(key, DEFAULTS.get(key))
        compared = key in DEFAULTS or (key in flags_now and key in flags_then)
        if compared and now != then:
            out.append(f"{key}: baseline {then!r}, current {now!r}")
    rate_now, rate_then = current.get("request_rate") or {}, baseline.get("request_rate") or {}
    auto_now, auto_then = bool(rate_now.get("auto")), bool(rate_then.get("auto"))
    fixed_rates_differ = not auto_now and not auto_then and rate_now.get("rate") != rate_then.get("rate")
    if rate_now and rate_then and (auto_now != auto_then or fixed_rates_differ):
        out.append(f"request rate: baseline {_rate(rate_then)}, current {_rate(rate_now)}")
    machine_now, machine_then = current.get("machine") or {}, baseline.get("machine") or {}
    for key in MACHINE:
        if key in machine_now and key in machine_then and machine_now[key] != machine_then[key]:
            out.append(f"machine {key}: baseline {machine_then[key]!r}, current {machine_now[key]!r}")
    return out


def _rate(note: dict[str, Any]) -> str:
    return "auto (half the probed capacity)" if note.get("auto") else f"{note.get('rate')} req/s"
