"""Where the engine runs: device and dtype from the config's words, whether that
silently left a GPU unused, what the model and its cache take and whether that
fits, and a sync for timing."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from harness.processes import machine_limits

if TYPE_CHECKING:
    from harness.engine.config import EngineConfig
    from harness.engine.model import ModelConfig

GIB = 1 << 30


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


def visible_gpu() -> str | None:
    """How a GPU shows itself to this machine, whatever torch thinks; None when none does.

    ``nvidia-smi -L`` listing a GPU, or an NVIDIA device node (the same tests as
    scripts/gpu_check.sh; ``WIREBENCH_NVIDIA_DEV_GLOB`` replaces the node glob).
    """
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        gpus = [line.strip() for line in out.splitlines() if line.startswith("GPU ")]
        if gpus:
            return f"nvidia-smi -L lists {gpus[0]}" + (f" and {len(gpus) - 1} more" if len(gpus) > 1 else "")
    nodes = sorted(glob.glob(os.environ.get("WIREBENCH_NVIDIA_DEV_GLOB", "/dev/nvidia[0-9]*")))
    if nodes:
        return f"device node {nodes[0]} exists"
    return None


def device_warning(requested: str, device: torch.device) -> str | None:
    """A loud sentence when ``--device auto`` fell back to the CPU although a GPU is visible."""
    if requested != "auto" or device.type != "cpu":
        return None
    gpu = visible_gpu()
    if gpu is None:
        return None
    cuda = torch.version.cuda
    build = f"a CUDA {cuda} build" if cuda else "a CPU-only build"
    return (
        f"--device auto fell back to the CPU although a GPU is visible ({gpu}): torch {torch.__version__} is "
        f"{build} and torch.cuda.is_available() is False. These figures are CPU figures. Install a CUDA torch "
        "(TORCH_SPEC=... scripts/setup.sh; scripts/gpu_check.sh says why torch cannot use the GPU), "
        "or pass --device cpu to mean it."
    )


# -- memory: what the model, its cache and a step take -----------------------------


def count_params(cfg: ModelConfig) -> int:
    """Parameters of a ``harness.engine.model.Transformer`` of ``cfg`` (untied embedding and LM head, as Llama 3)."""
    kv_dim = cfg.n_kv_heads * cfg.head_dim
    attn = cfg.dim * (cfg.dim + 2 * kv_dim) + cfg.dim * cfg.dim
    ffn = cfg.dim * 2 * cfg.ffn_dim + cfg.ffn_dim * cfg.dim
    return 2 * cfg.vocab_size * cfg.dim + cfg.n_layers * (attn + ffn + 2 * cfg.dim) + cfg.dim


def kv_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """K and V of one token in every layer."""
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * dtype.itemsize


def workspace_bytes(cfg: ModelConfig, dtype: torch.dtype, max_rows: int, max_seqs: int, max_len: int) -> int:
    """A generous estimate of a step's temporaries beyond weights and cache.

    Activations of ``max_rows`` rows (residual, norm, QKV, the MLP's fused
    gate/up and its product), the sampler's float32 and int64 copies of up to
    ``max_seqs`` rows of logits, attention scores should SDPA fall back to its
    math kernel for a prefill chunk of ``max_rows`` tokens against ``max_len``
    keys, the keys and values attention gathers out of the paged cache (one
    layer's, for ``max_seqs`` sequences of ``max_len``: ``harness.engine.attention``),
    and 1 GiB of allocator slack.
    """
    e = dtype.itemsize
    kv_dim = cfg.n_kv_heads * cfg.head_dim
    activations = max_rows * (4 * cfg.dim + (cfg.dim + 2 * kv_dim) + 3 * cfg.ffn_dim) * e
    sampler = max_seqs * cfg.vocab_size * 32
    scores = cfg.n_heads * min(max_rows, max_len) * max_len * 4
    gathered = 2 * max_seqs * max_len * kv_dim * e
    return activations + sampler + scores + gathered + GIB


@dataclass(frozen=True)
class MemoryPlan:
    """What the engine will hold on its device, in bytes (the workspace is an estimate)."""

    weights: int
    kv_cache: int
    workspace: int
    kv_tokens: int  # tokens the paged cache holds (--kv-cache-tokens, default max_num_seqs x max_model_len)
    free: int | None = None  # free device memory before allocating (CUDA only)
    total: int | None = None

    @property
    def needed(self) -> int:
        return self.weights + self.kv_cache + self.workspace

    def as_gib(self) -> dict[str, float]:
        out = {"weights_gib": self.weights, "kv_cache_gib": self.kv_cache, "workspace_gib_estimate": self.workspace}
        if self.free is not None and self.total is not None:
            out.update(free_gib_at_start=self.free, total_gib=self.total)
        return {k: round(v / GIB, 2) for k, v in out.items()}

    def shortfall(self, where: str) -> str | None:
        """Why it does not fit in ``free`` and what to lower; None when it fits (or free is unknown).

        An error rather than a quiet clamp (vLLM's gpu_memory_utilization shrinks
        its paged cache instead): the cache's size is --kv-cache-tokens (by default
        --max-num-seqs x --max-model-len), which a benchmark must report as the user
        set it, not as the engine chose.
        """
        if self.free is None or self.needed <= self.free:
            return None
        per_token = max(self.kv_cache // max(self.kv_tokens, 1), 1)
        fits = max(self.free - self.weights - self.workspace, 0) // per_token
        total = f" of {self.total / GIB:.1f} GiB" if self.total is not None else ""
        return (
            f"the engine needs {self.needed / GIB:.1f} GiB on {where} but {self.free / GIB:.1f} GiB{total} are "
            f"free: weights {self.weights / GIB:.1f} GiB, KV cache {self.kv_cache / GIB:.1f} GiB "
            f"({self.kv_tokens} tokens, {per_token // 1024} KiB a token), workspace ~{self.workspace / GIB:.1f} GiB. "
            f"About {fits} KV tokens fit: set --kv-cache-tokens to at most that (its default is --max-num-seqs x "
            "--max-model-len)."
        )


def check_fits(plan: MemoryPlan, device: torch.device) -> MemoryPlan:
    """On CUDA: ``plan`` with the device's free memory filled in, or ValueError (``shortfall``)."""
    if device.type != "cuda":
        return plan
    free, total = torch.cuda.mem_get_info(device)
    plan = replace(plan, free=free, total=total)
    error = plan.shortfall(str(device))
    if error:
        raise ValueError(error)
    return plan


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels, so a step's wall time covers its compute (no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cpu_memory_asks(config: EngineConfig) -> list[machine_limits.SizeAsk]:
    """On the CPU, the torch engine's weights and KV cache are this machine's memory from its start (on
    CUDA the engine checks its device's free memory itself, ``check_fits``), checked at start by bench serve
    (harness.processes.machine_limits)."""
    from harness.engine.model import get_model_config

    if config.executor != "torch" or config.device == "cuda":
        return []
    try:
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device)
        model = get_model_config(config.model_preset, config.vocab_size)
    except ValueError:  # the engine says why at its start
        return []
    if device.type != "cpu":
        return []
    weights = count_params(model) * dtype.itemsize
    default = "" if config.kv_cache_tokens is not None else "; its default is --max-num-seqs x --max-model-len"
    return [
        machine_limits.SizeAsk(
            "--kv-cache-tokens",
            config.kv_capacity,
            unit=kv_bytes_per_token(model, dtype),
            shared=False,
            fixed=weights,
            what=f" with the {config.model_preset} model's {machine_limits.human(weights)} of weights{default}",
            fixed_advice="the weights alone do not fit: choose a smaller --model-preset or --dtype",
        )
    ]
