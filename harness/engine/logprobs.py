"""Top-K logprobs of sampled tokens, as vLLM's sampler returns them (``SamplingParams.logprobs = K``).

From the model's raw logits (vLLM's default ``raw_logprobs``: before bias,
penalties and temperature), over the tokenizer's vocabulary: a float32
log-softmax per row, its K largest entries, and the sampled token's logprob and
rank (1 + how many tokens are strictly more likely). Only the rows that asked
are computed, and they cross to the host in one fetch.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from harness.wire.messages import Logprobs


def top_logprobs(logits: Tensor, tokens: Tensor, ks: list[int], vocab_size: int) -> list[Logprobs]:
    """``Logprobs`` of one position for each row of ``logits`` (rows = the requests that asked, K each)."""
    if not ks:
        return []
    lp = torch.log_softmax(logits[:, :vocab_size].float(), dim=-1)
    k_max = max(max(ks), 1)
    top = lp.topk(min(k_max, lp.shape[-1]), dim=-1)
    sampled = lp.gather(1, tokens[:, None].long())
    ranks = (lp > sampled).sum(dim=-1, keepdim=True) + 1
    # One host copy: [rows, 1 + k] values, [rows, 1 + k] ids, [rows, 1] ranks.
    values = torch.cat([sampled, top.values], dim=1).cpu().tolist()
    ids = torch.cat([tokens[:, None].long(), top.indices], dim=1).cpu().tolist()
    rank_list = ranks.squeeze(1).cpu().tolist()
    return [
        Logprobs(token_ids=[row_ids[: 1 + k]], logprobs=[row_values[: 1 + k]], ranks=[rank])
        for row_ids, row_values, rank, k in zip(ids, values, rank_list, ks, strict=True)
    ]


def sim_logprobs(token: int, k: int, key: int, vocab_size: int) -> Logprobs:
    """Made-up logprobs for the sim executor: the same shape and bytes as real ones, no model.

    The sampled token is the most likely; the others are hashed ids with falling logprobs.
    """
    ids = [token, token] + [(key + 7919 * i) % vocab_size for i in range(1, k)]
    first = -0.05 - (key % 97) / 100.0
    # float32 values, as a model's: they survive a codec that carries float32 (vllm) exactly.
    values = [float(np.float32(v)) for v in [first, first] + [first - 0.75 * i for i in range(1, k)]]
    return Logprobs(token_ids=[ids[: 1 + k]], logprobs=[values[: 1 + k]], ranks=[1])
