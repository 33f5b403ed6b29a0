"""A small Llama-style decoder with a paged KV cache.

RMSNorm, rotary position embeddings, a SwiGLU MLP and grouped-query attention.
Weights are random from a fixed seed: wirebench measures serving overhead, so
the model only has to cost what a real one of its shape costs.

The KV cache is preallocated and paged: per layer, K and V buffers of
``num_blocks x block_size`` cache slots of [n_kv_heads, head_dim]. A sequence's
*block table* (``harness.engine.kv_blocks``, from the scheduler) says which blocks
hold its positions; a step writes its rows' K/V through their cache slots and
attends by gathering each sequence's keys through its table.

One engine step is one ``forward_step`` over the step's token rows: first one
row per decoding sequence, then the prefill chunks of any number of sequences,
concatenated (varlen). Every norm, projection and MLP runs once over all rows
(where the FLOPs and most kernel launches are); attention is one ``paged_attention`` call a
layer for every row (``harness.engine.attention``): one varlen flash kernel on CUDA where
one serves, else the torch reference's two SDPA calls (the decode rows together, every prefill
chunk together), so a step's op count does not grow with its chunks.

``StepPlan`` (``harness.engine.step_plan``) is the step's layout in host ints:
everything the model needs to size its work is known on the host, so a step
never reads a device value back (see ``harness.engine.opcount``).
``prefill`` and ``decode`` are one-sequence / one-token conveniences over
``forward_step`` for tests and ``scripts/studies/model_bench/``: they address a
sequence by *slot*, a fixed table of contiguous blocks (``slot_blocks``), the
contiguous-KV reference layout the engine's tests compare the paged runs against.

``enable_compile`` runs the dense parts of every layer (norm, QKV projection
and rotary; output projection, residuals and MLP) through ``torch.compile``:
one graph shared by all layers, dynamic in the number of rows, so decode,
prefill and mixed steps reuse it. Attention and the cache writes stay eager.

Its sizes in bytes (weights, cache, a step's workspace) are ``harness.engine.device``'s.

Vocabulary: the embedding/LM-head width is ``max(preset vocab, tokenizer vocab)``
so a llama-8b-shaped head costs what it should, while the sampler only ever
picks ids below the tokenizer's vocab (see ``harness.engine.sampler``).

Shape legend: T tokens of a chunk, N rows of a step, B decode rows, C chunks, H
query heads, K kv heads, G = H // K query heads per kv head, D head dim, L cached
length, S cache slots, V vocab.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.engine import attention, attention_kernels
from harness.engine.staging import Stager, StepBuffers
from harness.engine.step_plan import Chunk, StepPlan

_HAS_RMS_NORM = hasattr(F, "rms_norm")


@dataclass(frozen=True)
class ModelConfig:
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int = 0  # 0: use the tokenizer's vocab size
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    vision_dim: int = 64  # width of the vision encoder's patch features

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def __post_init__(self) -> None:
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(f"bad head layout: dim={self.dim} heads={self.n_heads} kv={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even for rotary embeddings")


PRESETS: dict[str, ModelConfig] = {
    # CPU default: cheap enough that one thread keeps up with a real load.
    "tiny": ModelConfig(n_layers=2, dim=128, n_heads=4, n_kv_heads=1, ffn_dim=384),
    "small": ModelConfig(n_layers=4, dim=256, n_heads=8, n_kv_heads=2, ffn_dim=768),
    "medium": ModelConfig(n_layers=8, dim=512, n_heads=8, n_kv_heads=2, ffn_dim=1536, vision_dim=128),
    "llama-1b": ModelConfig(
        n_layers=16, dim=2048, n_heads=32, n_kv_heads=8, ffn_dim=8192, vocab_size=128256, vision_dim=256
    ),
    "llama-8b": ModelConfig(
        n_layers=32, dim=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=128256, vision_dim=256
    ),
}


def get_model_config(preset: str, tokenizer_vocab: int) -> ModelConfig:
    """The preset with its vocab resolved to max(preset vocab, tokenizer vocab)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; choose one of {sorted(PRESETS)}")
    cfg = PRESETS[preset]
    return replace(cfg, vocab_size=max(cfg.vocab_size, tokenizer_vocab))


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Normalise in float32 for bf16 stability, cast back, then scale."""
    xf = x.float()
    if _HAS_RMS_NORM:
        xf = F.rms_norm(xf, (xf.shape[-1],), eps=eps)
    else:  # torch < 2.4
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return xf.type_as(x) * weight


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, **factory: Any) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, **factory))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_tables(head_dim: int, max_len: int, theta: float, device: torch.device) -> tuple[Tensor, Tensor]:
    """cos/sin tables [max_len, head_dim // 2] in float32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(max_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (first half, second half) of the head dim.

    x: [N, heads, D]; cos/sin: [N, D/2] (already gathered at x's positions).
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).type_as(x)


@dataclass(frozen=True)
class StepBatch:
    """What every layer needs for one step, built once per step (``Transformer.make_batch``)."""

    plan: StepPlan
    row_slots: Tensor  # [N] cache slot each row's K/V is written to
    pos_rows: Tensor  # [N] position of each row
    cos: Tensor  # [N, D/2] rotary tables at the rows' positions
    sin: Tensor
    attn: attention.AttentionMeta  # what every layer's attention reads
    kernel: attention.Kernel  # the model's attention kernel


# -- the layers ----------------------------------------------------------------------


DenseIn = Callable[..., tuple[Tensor, Tensor, Tensor]]
DenseOut = Callable[..., Tensor]


def _dense_fns(cfg: ModelConfig) -> tuple[DenseIn, DenseOut]:
    """A layer's dense parts as pure functions of its weights (one compiled graph serves every layer)."""
    n_heads, n_kv, head_dim, eps = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.norm_eps
    qk_width = (n_heads + n_kv) * head_dim

    def attn_in(x: Tensor, norm_w: Tensor, wqkv: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        # x [N, dim] -> q [N, H, D], k/v [N, K, D], rotary applied to q and k in one go.
        n = x.shape[0]
        qkv = F.linear(rms_norm(x, norm_w, eps), wqkv)
        qk = apply_rope(qkv[:, :qk_width].reshape(n, n_heads + n_kv, head_dim), cos, sin)
        return qk[:, :n_heads], qk[:, n_heads:], qkv[:, qk_width:].reshape(n, n_kv, head_dim)

    def attn_out_ffn(x: Tensor, attn: Tensor, wo: Tensor, norm_w: Tensor, w13: Tensor, w2: Tensor) -> Tensor:
        x = x + F.linear(attn, wo)
        gate, up = F.linear(rms_norm(x, norm_w, eps), w13).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, w2)

    return attn_in, attn_out_ffn


class Attention(nn.Module):
    k_cache: Tensor  # [num_blocks x block_size, K, D], a buffer: block b's token i at slot b*block_size+i
    v_cache: Tensor

    def __init__(self, cfg: ModelConfig, cache_slots: int, **factory: Any) -> None:
        super().__init__()
        kv_dim = cfg.n_kv_heads * cfg.head_dim
        # One fused projection for q, k, v: fewer, larger matmuls.
        self.wqkv = nn.Linear(cfg.dim, cfg.dim + 2 * kv_dim, bias=False, **factory)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False, **factory)
        shape = (cache_slots, cfg.n_kv_heads, cfg.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, **factory), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, **factory), persistent=False)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, batch: StepBatch) -> Tensor:
        """Write the rows' K/V into the cache, attend; q [N, H, D], k/v [N, K, D] -> [N, H*D]."""
        self.k_cache.index_copy_(0, batch.row_slots, k)
        self.v_cache.index_copy_(0, batch.row_slots, v)
        return attention.paged_attention(q, self.k_cache, self.v_cache, batch.attn, batch.kernel)


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig, **factory: Any) -> None:
        super().__init__()
        self.w13 = nn.Linear(cfg.dim, 2 * cfg.ffn_dim, bias=False, **factory)  # gate and up, fused
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False, **factory)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, cache_slots: int, **factory: Any) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps, **factory)
        self.attn = Attention(cfg, cache_slots, **factory)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps, **factory)
        self.ffn = FeedForward(cfg, **factory)

    def forward(self, x: Tensor, batch: StepBatch, attn_in: DenseIn, attn_out_ffn: DenseOut) -> Tensor:
        q, k, v = attn_in(x, self.attn_norm.weight, self.attn.wqkv.weight, batch.cos, batch.sin)
        a = self.attn(q, k, v, batch)
        return attn_out_ffn(x, a, self.attn.wo.weight, self.ffn_norm.weight, self.ffn.w13.weight, self.ffn.w2.weight)


class Transformer(nn.Module):
    """The decoder plus its KV cache. Build with ``build_model``."""

    rope_cos: Tensor  # [max_model_len, D/2], buffers
    rope_sin: Tensor

    def __init__(
        self,
        cfg: ModelConfig,
        max_num_seqs: int,
        max_model_len: int,
        device: torch.device,
        dtype: torch.dtype,
        num_blocks: int | None = None,
        block_size: int = 16,
    ) -> None:
        super().__init__()
        if cfg.vocab_size <= 0:
            raise ValueError("ModelConfig.vocab_size must be resolved (see get_model_config)")
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.cfg = cfg
        self.max_num_seqs, self.max_model_len = max_num_seqs, max_model_len
        self.block_size = block_size
        # Blocks a whole max_model_len takes: what the slot conveniences give each slot.
        self.blocks_per_slot = -(-max_model_len // block_size)
        self.num_blocks = num_blocks if num_blocks is not None else max_num_seqs * self.blocks_per_slot
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim, **factory)
        slots = self.num_blocks * block_size
        self.layers = nn.ModuleList(Block(cfg, slots, **factory) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps, **factory)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False, **factory)
        cos, sin = rope_tables(cfg.head_dim, max_model_len, cfg.rope_theta, device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self._attn_in, self._attn_out_ffn = _dense_fns(cfg)
        self.compiled = False
        # Chosen once: a varlen kernel where one imports and passes its probe on CUDA, else the reference.
        self.attention_kernel = attention_kernels.select(
            device, dtype, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, block_size
        )
        self._stager = Stager(device)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Normal weights with std fan_in**-0.5, from one generator on the model's device.

        Variance-preserving: embeddings have unit std, every projection keeps
        its input's scale, so attention and MLP outputs are as large as the
        residual they join and the output really depends on the context (with
        GPT-2's std 0.02 an untrained tiny model is nearly a bigram table and
        ignores, say, an image in its prompt). The LM head gives logits of
        about unit std: sampling is neither uniform nor one-hot.
        """
        gen = torch.Generator(device=self.output.weight.device).manual_seed(seed)
        self.tok_embeddings.weight.normal_(0.0, 1.0, generator=gen)
        for lin in self.modules():
            if isinstance(lin, nn.Linear):
                lin.weight.normal_(0.0, lin.in_features**-0.5, generator=gen)

    @property
    def device(self) -> torch.device:
        return self.output.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.output.weight.dtype

    @property
    def kv_cache_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for name, b in self.named_buffers() if name.endswith("_cache"))

    def enable_compile(self, **options: Any) -> None:
        """Run each layer's dense parts through ``torch.compile`` (one graph for all layers, dynamic rows)."""
        attn_in, attn_out_ffn = _dense_fns(self.cfg)
        self._attn_in = torch.compile(attn_in, **options)
        self._attn_out_ffn = torch.compile(attn_out_ffn, **options)
        self.compiled = True

    def embed(self, token_ids: Tensor) -> Tensor:
        """[N] int64 -> [N, dim]."""
        return self.tok_embeddings(token_ids)

    def make_batch(self, plan: StepPlan, staged: list[Tensor], kernel: attention.Kernel | None = None) -> StepBatch:
        """Per-step tensors from the plan and its ``index_lists`` already on the device, then its
        ``varlen_lists`` where the attention kernel reads them (``attention.step_meta``);
        ``kernel``: the model's unless given (CUDA graphs choose their own).

        Dispatches only device ops (aranges, compares, gathers), a fixed number whatever the
        number of sequences: no value is read back.
        """
        row_slots, pos_rows = staged[:2]
        group = self.cfg.n_heads // self.cfg.n_kv_heads
        kernel = self.attention_kernel if kernel is None else kernel
        meta = attention.step_meta(plan, staged, self.block_size, self.dtype, group, kernel)
        return StepBatch(plan, row_slots, pos_rows, self.rope_cos[pos_rows], self.rope_sin[pos_rows], meta, kernel)

    def forward_step(self, x: Tensor, batch: StepBatch, rows: Tensor | None = None) -> Tensor:
        """Run one step: x [N, dim] embeddings of the plan's rows -> float32 logits.

        Logits of ``rows`` only (an index tensor), or of every row when None:
        the LM head runs only where logits are used.
        """
        if x.shape[0] != batch.plan.n_rows:
            raise ValueError(f"{x.shape[0]} input rows for a plan of {batch.plan.n_rows}")
        for layer in self.layers:
            x = layer(x, batch, self._attn_in, self._attn_out_ffn)
        if rows is not None:
            x = x.index_select(0, rows)
        return self.output(self.norm(x)).float()

    def stage(
        self, plan: StepPlan, *extra: Sequence[int] | np.ndarray, buffers: StepBuffers | None = None
    ) -> tuple[StepBatch, list[Tensor]]:
        """The plan's batch plus ``extra`` int lists on the device, in one host-to-device transfer.

        Through ``buffers`` (the executor's, reused every step) when given: the tensors are then
        valid until the next call with them; else into fresh ones.
        """
        plan.check(self.num_blocks, self.block_size, self.max_model_len)
        stage = self._stager.ints if buffers is None else buffers.ints
        varlen = plan.varlen_lists(self.block_size) if self.attention_kernel.varlen else ()
        staged = stage(*plan.index_lists(self.block_size), *varlen, *extra)
        n = 5 + len(varlen)
        return self.make_batch(plan, staged[:n]), staged[n:]

    def slot_blocks(self, slot: int) -> list[int]:
        """The block table of ``slot`` in the conveniences below: a whole max_model_len of contiguous
        blocks, ``slot x blocks_per_slot`` on (a contiguous KV cache, laid out in blocks)."""
        if not 0 <= slot < self.num_blocks // self.blocks_per_slot:
            raise ValueError(f"slot {slot} outside [0, {self.num_blocks // self.blocks_per_slot})")
        return list(range(slot * self.blocks_per_slot, (slot + 1) * self.blocks_per_slot))

    def prefill(self, x: Tensor, slot: int, start: int, all_logits: bool = False) -> Tensor:
        """Run a chunk of one sequence; fills its KV cache at [start, start+T).

        x: [T, dim] input embeddings (token embeddings, images spliced in).
        Returns logits [V] of the chunk's last position (what sampling needs),
        or [T, V] for every position when ``all_logits``.
        """
        t = x.shape[0]
        batch, _ = self.stage(StepPlan(chunks=[Chunk(self.slot_blocks(slot), start, t)]))
        if all_logits:
            return self.forward_step(x, batch)
        return self.forward_step(x, batch, torch.arange(t - 1, t, device=self.device))[0]

    def decode(self, x: Tensor, slots: Tensor | list[int], positions: Tensor | list[int]) -> Tensor:
        """One token for each of B sequences.

        x: [B, dim] embeddings of each sequence's newest token; slots (``slot_blocks``), positions:
        B distinct slots and the positions of their new tokens (each attends to
        its sequence's positions [0, positions[b]]). Tensors are read back to
        the host here (a sync); the engine passes lists through ``forward_step``.
        Returns logits [B, V] in float32.
        """
        s = slots.tolist() if isinstance(slots, Tensor) else list(slots)
        p = positions.tolist() if isinstance(positions, Tensor) else list(positions)
        batch, _ = self.stage(StepPlan([self.slot_blocks(i) for i in s], p))
        return self.forward_step(x, batch)

    def sdpa_backends(self) -> dict[str, str]:
        """The SDPA kernel torch picks for each call of the torch reference (``attention.sdpa_backends``),
        and the attention kernel the model runs: ``attention`` its name, ``attention_calls_per_layer``
        its launches a layer (at most, the reference), ``attention_note`` why not a kernel on CUDA.
        """
        first = self.layers[0]
        assert isinstance(first, Block)
        kernel = self.attention_kernel
        out = attention.sdpa_backends(first.attn.k_cache, self.cfg.n_heads)
        out |= {"attention": kernel.name, "attention_calls_per_layer": str(kernel.calls_per_layer)}
        if kernel.note:  # a label value elsewhere: no ',' or '=' (harness.server_metrics.engine_info splits on them)
            out["attention_note"] = kernel.note.replace(",", ";").replace("=", ":")
        return out


def build_model(
    cfg: ModelConfig,
    max_num_seqs: int,
    max_model_len: int,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    num_blocks: int | None = None,
    block_size: int = 16,
) -> Transformer:
    """Allocate the model and its cache (``num_blocks`` of ``block_size`` tokens; default a whole
    max_model_len per sequence) directly on ``device`` and init from ``seed``.

    The same seed gives the same weights on the same device type; CPU and CUDA
    generators differ, so weights differ across device types.
    """
    model = Transformer(cfg, max_num_seqs, max_model_len, device, dtype, num_blocks, block_size)
    model.init_weights(seed)
    return model.eval().requires_grad_(False)
