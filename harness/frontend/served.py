"""The ``bench serve`` flags of what the frontend serves beyond the engine's config: the model's name,
its tokenizer, how images travel, request digests, extra API-server work. Declared once
(harness.settings.declare); ``bench run`` forwards them to every arm's server with the engine's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.frontend.images import MM_PAYLOADS, MmPayload
from harness.frontend.settings import FrontendSettings
from harness.settings.declare import flag_type, setting


def _non_negative_float(text: str) -> float:
    """A finite amount that may be 0 (ValueError otherwise)."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"not a number: {text!r}") from None
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"must be a finite number >= 0, got {text!r}")
    return value


non_negative_float = flag_type(_non_negative_float)


@dataclass(frozen=True)
class ServedSettings:
    served_model_name: str | None = setting(
        None, flag="--served-model-name", help="model id in the API (default: wirebench-<preset>)"
    )
    verify: bool = setting(
        False,
        flag="--verify",
        help="each request carries a digest of its token ids and images, checked by the engine after it "
        "crossed: a corrupted or swapped request fails instead of being served",
    )
    frontend_cpu_us_per_token: float = setting(
        0.0,
        flag="--frontend-cpu-us-per-token",
        type=non_negative_float,
        metavar="US",
        help="model a heavier API server: CPU microseconds the frontend's event loop spends on each output "
        "token as a step's outputs arrive, on top of its own work (vLLM 0.6.4's V1 detokenized and built "
        "each chunk in one loop; docs/seed.md). Default 0: none",
    )
    tokenizer: str | None = setting(
        None,
        flag="--tokenizer",
        help="path of a tokenizer.json, or 'tekken': Mistral's 131,072-token tokenizer and chat encoding "
        "through mistral-common (default: the embedded 4,096-token BPE)",
    )
    mm_payload: MmPayload = setting(
        FrontendSettings.mm_payload,
        flag="--mm-payload",
        choices=MM_PAYLOADS,
        help="images travel as PIL images or as processed pixel tensors",
        comparable=True,
    )
    mm_tensor_size: int = setting(
        FrontendSettings.mm_tensor_size,
        flag="--mm-tensor-size",
        help="side of processed pixel tensors",
        comparable=True,
    )
    mm_tensor_dtype: str = setting(
        FrontendSettings.mm_tensor_dtype,
        flag="--mm-tensor-dtype",
        help="dtype of processed pixel tensors",
        comparable=True,
    )
