"""Where the engine runs: device and dtype from the config's words, and a sync for timing."""

from __future__ import annotations

import torch


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' requested but torch.cuda.is_available() is False")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; choose auto or one of {sorted(table)}")
    return table[dtype]


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels, so a step's wall time covers its compute (no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
