"""Token sampling: greedy, temperature, top-k, top-p and min-p, with seeds.

A request with ``SamplingParams.seed`` gets its own ``torch.Generator`` and is
sampled on its own row alone, so its tokens do not depend on what else is in
the batch. Unseeded requests share one engine generator (seeded from
``EngineConfig.seed``) and are sampled in one batched call.

Only ids below ``vocab_size`` (the tokenizer's) are ever picked, even when the
model's head is wider (see ``harness.model``).

Not implemented (accepted, ignored): presence/frequency/repetition penalties,
logit_bias, logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from harness.messages import SamplingParams

_GREEDY_EPS = 1e-5


@dataclass
class SampleRow:
    """What the sampler needs for one row of the logits."""

    params: SamplingParams
    generator: torch.Generator | None = None  # a seeded request's own generator
    suppress_token_ids: list[int] | None = None  # e.g. EOS/stop ids before min_tokens


def is_greedy(params: SamplingParams) -> bool:
    return params.temperature < _GREEDY_EPS


def _argmax(logits: Tensor) -> Tensor:
    """Greedy pick per row, with NaN logits treated as never chosen."""
    return logits.masked_fill(logits.isnan(), float("-inf")).argmax(dim=-1)


class Sampler:
    def __init__(self, vocab_size: int, seed: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def request_generator(self, params: SamplingParams) -> torch.Generator | None:
        """A fresh generator for a seeded, non-greedy request; None otherwise."""
        if params.seed is None or is_greedy(params):
            return None
        return torch.Generator(device=self.device).manual_seed(params.seed % (1 << 64))

    def sample(self, logits: Tensor, rows: list[SampleRow]) -> list[int]:
        """logits: [N, >= vocab_size] -> N token ids."""
        if logits.shape[0] != len(rows):
            raise ValueError(f"{logits.shape[0]} logit rows for {len(rows)} sample rows")
        if not rows:
            return []
        logits = logits[:, : self.vocab_size].float()
        for i, row in enumerate(rows):
            if row.suppress_token_ids:
                ids = [t for t in row.suppress_token_ids if 0 <= t < self.vocab_size]
                if len(ids) < self.vocab_size:  # never suppress everything
                    logits[i, ids] = float("-inf")
        out = torch.empty(len(rows), dtype=torch.long, device=logits.device)
        greedy = [i for i, r in enumerate(rows) if is_greedy(r.params)]
        if greedy:
            idx = torch.tensor(greedy, device=logits.device)
            out[idx] = _argmax(logits[idx])
        rand = [i for i, r in enumerate(rows) if not is_greedy(r.params)]
        shared = [i for i in rand if rows[i].generator is None]
        if shared:
            idx = torch.tensor(shared, device=logits.device)
            out[idx] = self._sample_group(logits[idx], [rows[i].params for i in shared], self.generator)
        for i in rand:
            gen = rows[i].generator
            if gen is not None:  # alone, filters included: independent of the batch
                out[i] = self._sample_group(logits[i : i + 1], [rows[i].params], gen)[0]
        return out.tolist()

    def _sample_group(self, logits: Tensor, params: list[SamplingParams], generator: torch.Generator) -> Tensor:
        """One token per row from the filtered distribution, drawn with ``generator``."""
        probs, order = self._filtered_probs(logits, params)
        # A row with NaN/inf probabilities (e.g. inf or NaN logits) would make
        # torch.multinomial raise and fail the whole step: it goes greedy instead.
        usable = torch.isfinite(probs).all(dim=-1) & (probs.sum(dim=-1) > 0)
        picks = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        if bool(usable.all()):
            picks = torch.multinomial(probs, 1, generator=generator)[:, 0]
        elif bool(usable.any()):
            ok = usable.nonzero()[:, 0]
            picks[ok] = torch.multinomial(probs[ok], 1, generator=generator)[:, 0]
        # picks index the sorted order when filters were applied
        tokens = picks if order is None else order.gather(1, picks[:, None])[:, 0]
        bad = (~usable).nonzero()[:, 0]
        if len(bad):
            tokens[bad] = _argmax(logits[bad])
        return tokens

    def _filtered_probs(self, logits: Tensor, params: list[SamplingParams]) -> tuple[Tensor, Tensor | None]:
        """Temperature, then top-k / top-p / min-p. Returns (probs [n, V], order or None).

        When any filter is on, probs are in descending-logit order and ``order``
        maps them back to token ids.
        """
        dev = logits.device
        temps = torch.tensor([p.temperature for p in params], device=dev, dtype=torch.float32)
        logits = logits / temps[:, None]
        top_k = [p.top_k if p.top_k > 0 else 0 for p in params]
        top_p = [p.top_p for p in params]
        min_p = [p.min_p for p in params]
        if not any(top_k) and all(p >= 1.0 for p in top_p) and not any(m > 0 for m in min_p):
            return torch.softmax(logits, dim=-1), None
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        vocab = sorted_logits.shape[-1]
        ranks = torch.arange(vocab, device=dev)[None, :]
        k = torch.tensor([k if k else vocab for k in top_k], device=dev)
        sorted_logits = sorted_logits.masked_fill(ranks >= k[:, None], float("-inf"))
        probs = torch.softmax(sorted_logits, dim=-1)
        # top-p: drop a token when the mass before it already reaches top_p
        # (the first token is always kept).
        p = torch.tensor(top_p, device=dev, dtype=torch.float32)
        mass_before = probs.cumsum(dim=-1) - probs
        drop = mass_before >= p[:, None]
        # min-p: drop tokens below min_p times the most likely one.
        mp = torch.tensor(min_p, device=dev, dtype=torch.float32)
        drop |= probs < (mp[:, None] * probs[:, :1])
        drop[:, 0] = False
        probs = probs.masked_fill(drop, 0.0)
        return probs / probs.sum(dim=-1, keepdim=True), order
