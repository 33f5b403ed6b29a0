"""Named experiments ``bench run --preset NAME`` sets up: defaults that flags given still override.

``seed-10245`` replays the measurement wirebench was born from: vLLM PR #10245 ("[V1] Use pickle
for serializing EngineCoreRequest & Add multimodal inputs to EngineCoreRequest", 2024-11-12),
``benchmark_serving.py --dataset-name sonnet --num-prompts 1000 --request-rate 40`` against
``vllm serve meta-llama/Llama-3.1-8B-Instruct`` on one H100. The PR changed V1 code, so it must
have run V1 (VLLM_USE_V1=1; the thread's command does not show it), whose EngineCore set
max_num_seqs 1024 and a 2048-token budget per step for the API server, over whatever the flags
said (vllm/v1/engine/core.py, before the PR and in v0.6.4); V0's limits for a 128K context (256
sequences, 512 tokens) did not apply. The PR changed the requests' codec only (its engine still
encoded outputs with msgpack), so every arm's outputs are msgspec. The GPU is the
``llama8b-h100`` step-time model (harness/engine/step_time.py); everything else is this
project's real loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.engine.step_time import LLAMA8B_H100_FIXED_MS
from harness.experiment.server_flags import model_values

SEED_10245 = "seed-10245"

PRESETS: dict[str, dict[str, Any]] = {
    SEED_10245: {
        "codec": "msgspec",  # the seed's main branch; add pickle for its question
        # The PR pickled requests only: EngineCoreOutputs stayed msgpack in both arms.
        "output_codec": "msgspec",
        "dataset_name": "sonnet",
        "num_prompts": 1000,
        "request_rate": 40.0,
        # 516 with our tokenizer gives the seed's 509 prompt tokens a request (509,089 for 1000 with Llama-3's).
        "sonnet_input_len": 516,
        "sonnet_output_len": 150,
        "sonnet_prefix_len": 200,
        "executor": "sim",
        "sim_step_model": "llama8b-h100",
        # Given, not left to the model's default, so run files record the value the fit chose.
        "sim_step_fixed_ms": LLAMA8B_H100_FIXED_MS,
        # vLLM 0.6.4 ran schedule, forward and update in series; the fixed ms was fitted so.
        "no_async_scheduling": True,
        # V1's EngineCore under `vllm serve` (UsageContext.OPENAI_API_SERVER), whatever the flags said.
        "max_num_seqs": 1024,
        "max_num_batched_tokens": 2048,
        # Only the GPU is modelled: no extra API-server work (a run may add some; docs/seed.md).
        "frontend_cpu_us_per_token": 0.0,
        # Two client processes: each reads half of a step's chunks, so the client's event loop lags 2.7 ms
        # at p99 here instead of 4.6 (2 cores, quiet; measured with V0's limits, ~190 chunks a step).
        "workers": 2,
    },
}


def _as_flag(key: str, value: Any) -> str:
    """'--flag value'; a switch (a bool) is its flag alone when on."""
    flag = f"--{key.replace('_', '-')}"
    if isinstance(value, bool):
        return flag if value else f"no {flag}"
    return f"{flag} {value}"


def preset_help() -> str:
    return "; ".join(
        f"{name}: " + ", ".join(_as_flag(k, v) for k, v in values.items()) for name, values in PRESETS.items()
    )


# The settings that make the modelled GPU the one fitted to the seed (docs/seed.md).
FITTED_SETTINGS = (
    "executor",
    "sim_step_model",
    "sim_step_fixed_ms",
    "no_async_scheduling",
    "max_num_seqs",
    "max_num_batched_tokens",
    "frontend_cpu_us_per_token",
)


def departures_from_fit(name: str, values: dict[str, Any]) -> list[str]:
    """The fitted settings a run changed from preset ``name``'s, as '--flag value'."""
    preset = PRESETS[name]
    return [
        _as_flag(key, values.get(key)) for key in FITTED_SETTINGS if key in preset and values.get(key) != preset[key]
    ]


def arm_departures(name: str, values: dict[str, Any], arm_flags: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Per arm label with ``--arm-flags``: the fitted settings that arm ran away from preset ``name``'s,
    its own flags read over the run's (``values``). Arms without flags run the run's settings."""
    out: dict[str, list[str]] = {}
    for label, flags in arm_flags.items():
        try:
            own = model_values(flags, values)
        except ValueError:  # its server read them; this report must not fail on them
            out[label] = [f"flags not read here ({' '.join(flags)})"]
            continue
        out[label] = departures_from_fit(name, own)
    return out
