"""A small Llama-style decoder with a per-slot KV cache.

RMSNorm, rotary position embeddings, a SwiGLU MLP and grouped-query attention.
Weights are random from a fixed seed: wirebench measures serving overhead, so
the model only has to cost what a real one of its shape costs.

The KV cache is preallocated: per layer, K and V buffers of shape
[max_num_seqs, n_kv_heads, max_model_len, head_dim]. Each running sequence owns
one *slot* (an index into the first dimension) for its lifetime; the scheduler
hands slots out.

One engine step is one ``forward_step`` over the step's token rows: first one
row per decoding sequence, then the prefill chunks of any number of sequences,
concatenated (varlen). Every norm, projection and MLP runs once over all rows
(where the FLOPs and most kernel launches are); only attention is per group:
the decode rows together, each prefill chunk on its own (``harness.engine.attention``).

``StepPlan`` (``harness.engine.step_plan``) is the step's layout in host ints:
everything the model needs to size its work is known on the host, so a step
never reads a device value back (see ``harness.engine.opcount``).
``prefill`` and ``decode`` are one-sequence / one-token conveniences over
``forward_step`` for tests and ``scripts/studies/model_bench/``.

``enable_compile`` runs the dense parts of every layer (norm, QKV projection
and rotary; output projection, residuals and MLP) through ``torch.compile``:
one graph shared by all layers, dynamic in the number of rows, so decode,
prefill and mixed steps reuse it. Attention and the cache writes stay eager.

Its sizes in bytes (weights, cache, a step's workspace) are ``harness.engine.device``'s.

Vocabulary: the embedding/LM-head width is ``max(preset vocab, tokenizer vocab)``
so a llama-8b-shaped head costs what it should, while the sampler only ever
picks ids below the tokenizer's vocab (see ``harness.engine.sampler``).

Shape legend: T tokens of a chunk, N rows of a step, B decode rows, H query
heads, K kv heads, G = H // K query heads per kv head, D head dim, L cached
length, S slots attended by the decode rows, V vocab.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.engine import attention
from harness.engine.staging import Stager
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
    slot_rows: Tensor  # [N] cache slot of each row
    pos_rows: Tensor  # [N] position of each row
    cos: Tensor  # [N, D/2] rotary tables at the rows' positions
    sin: Tensor
    decode_slots: Tensor  # [B]
    decode_mask: Tensor | None  # [S, 1, 1, L]: key j visible to slot s's query
    chunk_masks: tuple[Tensor | None, ...]  # per chunk: None (starts at 0: is_causal) or [G*T, end]


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
    k_cache: Tensor  # [max_num_seqs, K, max_model_len, D], a buffer
    v_cache: Tensor

    def __init__(self, cfg: ModelConfig, max_num_seqs: int, max_model_len: int, **factory: Any) -> None:
        super().__init__()
        kv_dim = cfg.n_kv_heads * cfg.head_dim
        # One fused projection for q, k, v: fewer, larger matmuls.
        self.wqkv = nn.Linear(cfg.dim, cfg.dim + 2 * kv_dim, bias=False, **factory)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False, **factory)
        shape = (max_num_seqs, cfg.n_kv_heads, max_model_len, cfg.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, **factory), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, **factory), persistent=False)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, batch: StepBatch) -> Tensor:
        """Write the rows' K/V into the cache, attend; q [N, H, D], k/v [N, K, D] -> [N, H*D]."""
        self.k_cache[batch.slot_rows, :, batch.pos_rows] = k
        self.v_cache[batch.slot_rows, :, batch.pos_rows] = v
        plan = batch.plan
        parts = []
        row = plan.n_decode
        if row:
            # A view of the first n_slots slots, not a gather: no copy of the cache.
            n_slots, max_len = plan.n_slots, plan.max_len
            keys, values = self.k_cache[:n_slots, :, :max_len], self.v_cache[:n_slots, :, :max_len]
            parts.append(attention.decode(q[:row], keys, values, batch.decode_slots, batch.decode_mask))
        for c, mask in zip(plan.chunks, batch.chunk_masks, strict=True):
            sl = slice(row, row + c.length)
            if mask is None:  # from position 0 the chunk is all the keys there are: no read of the cache
                parts.append(attention.fresh_chunk(q[sl], k[sl], v[sl]))
            else:
                keys, values = self.k_cache[c.slot, :, : c.end], self.v_cache[c.slot, :, : c.end]
                parts.append(attention.cached_chunk(q[sl], keys, values, mask))
            row += c.length
        return parts[0] if len(parts) == 1 else torch.cat(parts)


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig, **factory: Any) -> None:
        super().__init__()
        self.w13 = nn.Linear(cfg.dim, 2 * cfg.ffn_dim, bias=False, **factory)  # gate and up, fused
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False, **factory)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, max_num_seqs: int, max_model_len: int, **factory: Any) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps, **factory)
        self.attn = Attention(cfg, max_num_seqs, max_model_len, **factory)
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
        self, cfg: ModelConfig, max_num_seqs: int, max_model_len: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        super().__init__()
        if cfg.vocab_size <= 0:
            raise ValueError("ModelConfig.vocab_size must be resolved (see get_model_config)")
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.cfg = cfg
        self.max_num_seqs, self.max_model_len = max_num_seqs, max_model_len
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim, **factory)
        self.layers = nn.ModuleList(Block(cfg, max_num_seqs, max_model_len, **factory) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps, **factory)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False, **factory)
        cos, sin = rope_tables(cfg.head_dim, max_model_len, cfg.rope_theta, device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self._attn_in, self._attn_out_ffn = _dense_fns(cfg)
        self.compiled = False
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

    def make_batch(self, plan: StepPlan, slot_rows: Tensor, pos_rows: Tensor, lengths: Tensor) -> StepBatch:
        """Per-step tensors from the plan and its ``index_lists`` already on the device.

        Dispatches only device ops (aranges, compares, gathers): no value is read back.
        """
        plan.check(self.max_num_seqs, self.max_model_len)
        group = self.cfg.n_heads // self.cfg.n_kv_heads
        # A chunk from position 0 needs no mask (is_causal), which keeps the flash kernel eligible.
        masks = [None if c.start == 0 else attention.cached_chunk_mask(c, group, self.device) for c in plan.chunks]
        return StepBatch(
            plan,
            slot_rows,
            pos_rows,
            self.rope_cos[pos_rows],
            self.rope_sin[pos_rows],
            slot_rows[: plan.n_decode],
            attention.decode_mask(lengths, plan.max_len) if plan.n_decode else None,
            tuple(masks),
        )

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

    def stage(self, plan: StepPlan, *extra: list[int]) -> tuple[StepBatch, list[Tensor]]:
        """The plan's batch plus ``extra`` int lists on the device, in one host-to-device transfer."""
        slots, positions, lengths = plan.index_lists()
        staged = self._stager.ints(slots, positions, lengths, *extra)
        return self.make_batch(plan, staged[0], staged[1], staged[2]), staged[3:]

    def prefill(self, x: Tensor, slot: int, start: int, all_logits: bool = False) -> Tensor:
        """Run a chunk of one sequence; fills its KV cache at [start, start+T).

        x: [T, dim] input embeddings (token embeddings, images spliced in).
        Returns logits [V] of the chunk's last position (what sampling needs),
        or [T, V] for every position when ``all_logits``.
        """
        t = x.shape[0]
        plan = StepPlan(chunks=[Chunk(slot, start, t)])
        plan.check(self.max_num_seqs, self.max_model_len)
        batch, _ = self.stage(plan)
        if all_logits:
            return self.forward_step(x, batch)
        return self.forward_step(x, batch, torch.arange(t - 1, t, device=self.device))[0]

    def decode(self, x: Tensor, slots: Tensor | list[int], positions: Tensor | list[int]) -> Tensor:
        """One token for each of B sequences.

        x: [B, dim] embeddings of each sequence's newest token; slots, positions:
        B distinct slots and the positions of their new tokens (each attends to
        its sequence's positions [0, positions[b]]). Tensors are read back to
        the host here (a sync); the engine passes lists through ``forward_step``.
        Returns logits [B, V] in float32.
        """
        s = slots.tolist() if isinstance(slots, Tensor) else list(slots)
        p = positions.tolist() if isinstance(positions, Tensor) else list(positions)
        batch, _ = self.stage(StepPlan(s, p))
        return self.forward_step(x, batch)

    def sdpa_backends(self) -> dict[str, str]:
        """The SDPA kernel torch picks for each attention call this model makes (``attention.sdpa_backends``)."""
        first = self.layers[0]
        assert isinstance(first, Block)
        return attention.sdpa_backends(first.attn.k_cache, self.cfg.n_heads)


def build_model(
    cfg: ModelConfig, max_num_seqs: int, max_model_len: int, device: torch.device, dtype: torch.dtype, seed: int
) -> Transformer:
    """Allocate the model and its cache directly on ``device`` and init from ``seed``.

    The same seed gives the same weights on the same device type; CPU and CUDA
    generators differ, so weights differ across device types.
    """
    model = Transformer(cfg, max_num_seqs, max_model_len, device, dtype)
    model.init_weights(seed)
    return model.eval().requires_grad_(False)
