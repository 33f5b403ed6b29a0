"""How long the ``sim`` executor's step takes: the modelled GPU time of one engine step.

``linear`` (the default) is ``sim_step_fixed_ms + sim_step_per_token_ms x tokens``: a knob, not a GPU.

``llama8b-h100`` stands for Llama-3.1-8B in bf16 on one H100 SXM, as vLLM 0.6.4's V1 engine ran it
for PR #10245 (eager mode, chunked prefill). A step of ``tokens`` rows (decode rows + prefill
tokens) whose attention reads ``context`` cached tokens takes

    fixed + dense(tokens) + kv_read x context

- ``dense``: the 32 layers' projections and MLP, interpolated between measured points. The points
  are Vidur's H100 bf16 profile of Llama-2-7B (microsoft/vidur, data/profiling/compute/h100/
  meta-llama/Llama-2-7b-hf/mlp.csv, commit 7d47513; its per-layer times summed over 32 layers),
  scaled by 1.078: Llama-3.1-8B has 218 M weights per layer in those matrices against Llama-2-7B's
  202 M. Flat near the time it takes to read the weights up to ~128 rows (memory-bound), then
  19-23 µs per row (compute-bound).
- ``kv_read``: 128 KiB of K and V per cached token (32 layers x 8 KV heads x 128 dims x 2 x bf16,
  from the model's config.json) at 2.7 TB/s, 80% of the H100 SXM's 3.35 TB/s (NVIDIA's datasheet).
- ``fixed``: everything else per step: the LM head's 1 GB of weights (0.3-0.4 ms), the sampler,
  eager mode's kernel launches and V1's per-step input preparation (v0.6.4's V1 captured no CUDA
  graphs unless VLLM_TORCH_COMPILE_LEVEL=3). The one figure fitted to the seed itself: 4.0 ms puts
  the ``msgspec`` arm's median ITL, the length of a typical step and the figure a busy API server
  touches least, at the seed's 22.06 ms on this machine with V1's limits (1024 sequences, 2048
  tokens a step; docs/seed.md). Earlier presets ran V0's limits (256, 512) with 2.0 ms, fitted to
  mean TTFT instead.

Only the GPU's time is modelled: the codecs, sockets, frontend and client stay real.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

LINEAR = "linear"
LLAMA8B_H100 = "llama8b-h100"

# (rows in the step, ms): Vidur's H100 Llama-2-7B MLP + projection times over 32 layers, x 1.078.
_LLAMA8B_H100_DENSE = (
    (1, 6.04),
    (64, 6.32),
    (128, 6.87),
    (256, 9.86),
    (512, 12.91),
    (1024, 22.66),
    (2048, 43.46),
    (4096, 89.98),
)
_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2
_KV_BYTES_PER_S = 2.7e12
LLAMA8B_H100_FIXED_MS = 4.0


@dataclass(frozen=True)
class StepTimeModel:
    """A step's modelled time from the rows it runs and the cached tokens its attention reads."""

    name: str
    fixed_ms: float
    per_token_ms: float = 0.0  # linear: every row alike
    dense: tuple[tuple[int, float], ...] = ()  # piecewise-linear (rows, ms); extrapolated past the last
    kv_ms_per_token: float = 0.0

    def step_ms(self, tokens: int, context_tokens: int) -> float:
        return (
            self.fixed_ms + self.per_token_ms * tokens + self._dense_ms(tokens) + self.kv_ms_per_token * context_tokens
        )

    def _dense_ms(self, tokens: int) -> float:
        points = self.dense
        if not points or tokens <= 0:
            return 0.0
        if tokens <= points[0][0]:
            return points[0][1]
        i = min(bisect_left(points, (tokens, float("-inf"))), len(points) - 1)
        (x0, y0), (x1, y1) = points[i - 1], points[i]
        return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)

    def describe(self) -> str:
        text = f"{self.name}: {self.fixed_ms:g} ms"
        if self.per_token_ms:
            text += f" + {self.per_token_ms:g} ms per token"
        if self.dense:
            text += f" + the dense layers (Vidur's H100 profile, {len(self.dense)} points)"
        if self.kv_ms_per_token:
            text += f" + {self.kv_ms_per_token * 1e6:.1f} ns per cached token read"
        return text


def fixed_ms_of(description: Any) -> float | None:
    """The fixed part in a ``describe()`` text ('NAME: 4 ms + ...', as engines report it); None without one."""
    match = re.match(r"[\w.-]+: ([0-9.]+(?:e[-+]?[0-9]+)?) ms", description) if isinstance(description, str) else None
    return float(match.group(1)) if match else None


STEP_MODELS = (LINEAR, LLAMA8B_H100)


def step_time_model(name: str, fixed_ms: float | None = None, per_token_ms: float | None = None) -> StepTimeModel:
    """The named model; a knob left None takes the model's own value."""
    if name == LINEAR:
        return StepTimeModel(
            LINEAR,
            2.0 if fixed_ms is None else fixed_ms,
            per_token_ms=0.01 if per_token_ms is None else per_token_ms,
        )
    if name == LLAMA8B_H100:
        return StepTimeModel(
            LLAMA8B_H100,
            LLAMA8B_H100_FIXED_MS if fixed_ms is None else fixed_ms,
            per_token_ms=per_token_ms or 0.0,
            dense=_LLAMA8B_H100_DENSE,
            kv_ms_per_token=_KV_BYTES_PER_TOKEN / _KV_BYTES_PER_S * 1e3,
        )
    raise ValueError(f"unknown sim step model {name!r}; choose one of {', '.join(STEP_MODELS)}")
