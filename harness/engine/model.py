"""A small Llama-style decoder with a per-slot KV cache, in one file.

RMSNorm, rotary position embeddings, a SwiGLU MLP and grouped-query attention.
Weights are random from a fixed seed: wirebench measures serving overhead, so
the model only has to cost what a real one of its shape costs.

The KV cache is preallocated: per layer, K and V buffers of shape
[max_num_seqs, n_kv_heads, max_model_len, head_dim]. Each running sequence owns
one *slot* (an index into the first dimension) for its lifetime; the scheduler
hands slots out. Two entry points:

- ``prefill``: a chunk of one sequence at positions [start, start+T), attending
  to its cached prefix plus itself causally (chunked prefill is just several
  calls with increasing ``start``).
- ``decode``: B sequences x 1 token each, at different positions (ragged KV
  lengths handled with a padding mask).

Vocabulary: the embedding/LM-head width is ``max(preset vocab, tokenizer vocab)``
so a llama-8b-shaped head costs what it should, while the sampler only ever
picks ids below the tokenizer's vocab (see ``harness.sampler``).

Shape legend: T tokens of a chunk, B batch, H query heads, K kv heads,
G = H // K query heads per kv head, D head dim, L cached length, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


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


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, **factory: Any) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, **factory))

    def forward(self, x: Tensor) -> Tensor:
        # Normalise in float32 for bf16 stability, then cast back.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


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
class PrefillBatch:
    """One chunk of one sequence: positions [start, start+T) of the sequence in ``slot``."""

    slot: int
    start: int
    cos: Tensor  # [T, D/2] rotary tables at the chunk's positions
    sin: Tensor


@dataclass(frozen=True)
class DecodeBatch:
    """One new token for each of B sequences, at ``positions[b]`` in ``slots[b]``."""

    slots: Tensor  # [B]
    positions: Tensor  # [B]
    cos: Tensor  # [B, D/2]
    sin: Tensor
    n_slots: int  # attend over slots [0, n_slots): a view of the cache, not a gather
    lengths_all: Tensor  # [n_slots] keys each slot row may see (1 for rows not in the batch)
    max_len: int  # longest KV length in the batch


class Attention(nn.Module):
    k_cache: Tensor  # [max_num_seqs, K, max_model_len, D], a buffer
    v_cache: Tensor

    def __init__(self, cfg: ModelConfig, max_num_seqs: int, max_model_len: int, **factory: Any) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.group = cfg.n_heads // cfg.n_kv_heads
        kv_dim = self.n_kv * self.head_dim
        # One fused projection for q, k, v: fewer, larger matmuls.
        self.wqkv = nn.Linear(cfg.dim, cfg.dim + 2 * kv_dim, bias=False, **factory)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False, **factory)
        shape = (max_num_seqs, self.n_kv, max_model_len, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, **factory), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, **factory), persistent=False)

    def _qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        # x: [N, dim] -> q [N, H, D], k/v [N, K, D], rotary applied to q and k.
        n = x.shape[0]
        kv_dim = self.n_kv * self.head_dim
        q, k, v = self.wqkv(x).split([self.n_heads * self.head_dim, kv_dim, kv_dim], dim=-1)
        q = apply_rope(q.view(n, self.n_heads, self.head_dim), cos, sin)
        k = apply_rope(k.view(n, self.n_kv, self.head_dim), cos, sin)
        return q, k, v.view(n, self.n_kv, self.head_dim)

    def forward(self, x: Tensor, batch: PrefillBatch | DecodeBatch) -> Tensor:
        if isinstance(batch, PrefillBatch):
            return self._prefill(x, batch)
        return self._decode(x, batch)

    def _prefill(self, x: Tensor, batch: PrefillBatch) -> Tensor:
        # x: [T, dim] for positions [start, start+T) of the sequence in `slot`.
        slot, start = batch.slot, batch.start
        t = x.shape[0]
        end = start + t
        q, k, v = self._qkv(x, batch.cos, batch.sin)
        self.k_cache[slot, :, start:end] = k.transpose(0, 1)  # [K, T, D]
        self.v_cache[slot, :, start:end] = v.transpose(0, 1)
        keys = self.k_cache[slot, :, :end]  # [K, L=end, D]
        values = self.v_cache[slot, :, :end]
        # GQA without repeating K/V: fold each kv head's G query heads into the
        # query length: q [T, H, D] -> [K, G*T, D], row g*T + i is query i of head g.
        q = (
            q.view(t, self.n_kv, self.group, self.head_dim)
            .permute(1, 2, 0, 3)
            .reshape(self.n_kv, self.group * t, self.head_dim)
        )
        # Causal with an offset: query i (position start+i) sees keys j <= start+i.
        pos_q = torch.arange(start, end, device=x.device)
        mask = torch.arange(end, device=x.device)[None, :] <= pos_q[:, None]  # [T, L]
        mask = mask.repeat(self.group, 1)  # [G*T, L]
        out = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask)[0]
        # [K, G*T, D] -> [T, H*D]
        out = out.view(self.n_kv, self.group, t, self.head_dim).permute(2, 0, 1, 3).reshape(t, -1)
        return self.wo(out)

    def _decode(self, x: Tensor, batch: DecodeBatch) -> Tensor:
        # x: [B, dim]; one new token per sequence at positions[b] in slots[b].
        b = x.shape[0]
        slots, positions, n_slots, max_len = batch.slots, batch.positions, batch.n_slots, batch.max_len
        q, k, v = self._qkv(x, batch.cos, batch.sin)  # q [B, H, D], k/v [B, K, D]
        self.k_cache[slots, :, positions] = k
        self.v_cache[slots, :, positions] = v
        # Attend over a view of the first n_slots slots instead of gathering
        # them (no copy of the cache): rows of slots not in the batch get a
        # dummy query and a one-key mask, and are dropped afterwards.
        keys = self.k_cache[:n_slots, :, :max_len]  # [S, K, L, D]
        values = self.v_cache[:n_slots, :, :max_len]
        q_all = q.new_zeros(n_slots, self.n_kv, self.group, self.head_dim)
        q_all[slots] = q.view(b, self.n_kv, self.group, self.head_dim)
        mask = torch.arange(max_len, device=x.device)[None, :] < batch.lengths_all[:, None]  # [S, L]
        out = F.scaled_dot_product_attention(q_all, keys, values, attn_mask=mask[:, None, None, :])
        return self.wo(out[slots].reshape(b, -1))  # [S, K, G, D] -> [B, H*D]


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig, **factory: Any) -> None:
        super().__init__()
        self.w13 = nn.Linear(cfg.dim, 2 * cfg.ffn_dim, bias=False, **factory)  # gate and up, fused
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False, **factory)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, max_num_seqs: int, max_model_len: int, **factory: Any) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps, **factory)
        self.attn = Attention(cfg, max_num_seqs, max_model_len, **factory)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps, **factory)
        self.ffn = FeedForward(cfg, **factory)

    def forward(self, x: Tensor, batch: PrefillBatch | DecodeBatch) -> Tensor:
        x = x + self.attn(self.attn_norm(x), batch)
        return x + self.ffn(self.ffn_norm(x))


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

    def embed(self, token_ids: Tensor) -> Tensor:
        """[N] int64 -> [N, dim]."""
        return self.tok_embeddings(token_ids)

    def prefill(self, x: Tensor, slot: int, start: int, all_logits: bool = False) -> Tensor:
        """Run a chunk of one sequence; fills its KV cache at [start, start+T).

        x: [T, dim] input embeddings (token embeddings, images spliced in).
        Returns logits [V] of the chunk's last position (what sampling needs),
        or [T, V] for every position when ``all_logits``.
        """
        t = x.shape[0]
        if t == 0 or start < 0 or start + t > self.max_model_len:
            raise ValueError(f"prefill chunk [{start}, {start + t}) outside [0, {self.max_model_len})")
        if not 0 <= slot < self.max_num_seqs:
            raise ValueError(f"slot {slot} outside [0, {self.max_num_seqs})")
        batch = PrefillBatch(slot, start, self.rope_cos[start : start + t], self.rope_sin[start : start + t])
        for layer in self.layers:
            x = layer(x, batch)
        h = x if all_logits else x[-1]  # the LM head only where logits are used
        return self.output(self.norm(h)).float()

    def decode(self, x: Tensor, slots: Tensor, positions: Tensor) -> Tensor:
        """One token for each of B sequences.

        x: [B, dim] embeddings of each sequence's newest token; slots, positions:
        [B] int64 (distinct slots; the token sits at ``positions[b]`` and
        attends to the sequence's positions [0, positions[b]]).
        Returns logits [B, V] in float32.
        """
        slots = slots.to(self.device)
        positions = positions.to(self.device)
        # Host-side sizes, computed once for all layers (one sync here, not per layer).
        n_slots = int(slots.max()) + 1
        max_len = int(positions.max()) + 1
        lengths_all = torch.ones(n_slots, dtype=torch.long, device=self.device)  # dummy rows see one key
        lengths_all[slots] = positions + 1
        batch = DecodeBatch(
            slots, positions, self.rope_cos[positions], self.rope_sin[positions], n_slots, lengths_all, max_len
        )
        for layer in self.layers:
            x = layer(x, batch)
        return self.output(self.norm(x)).float()


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
