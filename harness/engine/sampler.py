"""Token sampling: logit bias and penalties, then greedy, temperature, top-k,
top-p and min-p, with seeds.

A request with ``SamplingParams.seed`` gets its own ``torch.Generator`` and is
sampled on its own row alone, so its tokens do not depend on what else is in
the batch. Unseeded requests share one engine generator (seeded from
``EngineConfig.seed``) and are sampled in one batched call.

Only ids below ``vocab_size`` (the tokenizer's) are ever picked, even when the
model's head is wider (see ``harness.engine.model``).

Before any picking (greedy rows included: they change the argmax), as vLLM
does: ``logit_bias`` adds its bias to the listed token ids (ids outside the
vocabulary are ignored); ``repetition_penalty`` p (vLLM/HF) turns the logit x of
every token seen in the prompt or output into x / p when x > 0, else x * p;
``presence_penalty`` / ``frequency_penalty`` (OpenAI) subtract
``presence * (count > 0) + frequency * count`` over output tokens only. Rows
with default penalties and no bias skip all of this: the batch only pays for
the rows that use them.

Not implemented: logprobs (the frontend refuses them).
"""

from __future__ import annotations

from collections.abc import Sequence
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
    # Token history, read only when ``uses_penalties(params)``; None means none.
    prompt_token_ids: Sequence[int] | None = None
    output_token_ids: Sequence[int] | None = None  # generated so far, oldest first


def is_greedy(params: SamplingParams) -> bool:
    return params.temperature < _GREEDY_EPS


def uses_penalties(params: SamplingParams) -> bool:
    """Whether the row needs its token history (any penalty off its neutral value)."""
    return params.repetition_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0


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
        biased = [i for i, r in enumerate(rows) if r.params.logit_bias]
        penalized = [i for i, r in enumerate(rows) if uses_penalties(r.params)]
        # Both work out of place: the caller's logits stay as they were.
        if biased:
            logits = self._with_logit_bias(logits, [rows[i] for i in biased], biased)
        if penalized:
            logits = self._with_penalties(logits, [rows[i] for i in penalized], penalized)
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

    def _with_logit_bias(self, logits: Tensor, rows: list[SampleRow], idx: list[int]) -> Tensor:
        """A copy of logits with rows[j]'s bias added on row idx[j] (ids outside the vocabulary ignored)."""
        at_row: list[int] = []
        at_tok: list[int] = []
        vals: list[float] = []
        for j, row in zip(idx, rows, strict=True):
            for tok, bias in (row.params.logit_bias or {}).items():
                if 0 <= tok < self.vocab_size:
                    at_row.append(j)
                    at_tok.append(tok)
                    vals.append(bias)
        dev = logits.device
        return logits.index_put(
            (torch.tensor(at_row, dtype=torch.long, device=dev), torch.tensor(at_tok, dtype=torch.long, device=dev)),
            torch.tensor(vals, device=dev, dtype=logits.dtype),
            accumulate=True,
        )

    def _flat_bins(self, id_lists: list[Sequence[int]], device: torch.device) -> Tensor:
        """Every list's ids as bins of one flat [len(id_lists) * vocab + 1] space, on ``device``.

        List j's id t becomes j * vocab + t, so one bincount (or one scatter)
        serves every row; ids outside the vocabulary go to the spare last bin,
        which callers drop (filtering them out would force a device sync).
        The ids are gathered on the CPU and cross to the device in one copy.
        """
        vocab, n = self.vocab_size, len(id_lists)
        parts = [torch.as_tensor(ids, dtype=torch.long) for ids in id_lists]
        flat = torch.cat(parts)
        row = torch.repeat_interleave(torch.arange(n), torch.tensor([len(p) for p in parts], dtype=torch.long))
        keep = (flat >= 0) & (flat < vocab)
        return torch.where(keep, row * vocab + flat, n * vocab).to(device)

    def _with_penalties(self, logits: Tensor, rows: list[SampleRow], idx: list[int]) -> Tensor:
        """logits with repetition, then presence and frequency penalties applied on rows ``idx``.

        Out of place. Each block runs only when some row uses it; a row at its
        neutral value in a block that runs comes out bit-identical (x / 1, x * 1,
        x - 0).
        """
        dev, n, vocab = logits.device, len(rows), self.vocab_size
        whole = n == logits.shape[0]  # idx is increasing, so it is every row
        at = None if whole else torch.tensor(idx, device=dev)
        x = logits if at is None else logits[at]
        out_bins = self._flat_bins([r.output_token_ids or () for r in rows], dev)

        def column(values: list[float]) -> Tensor:
            return torch.tensor(values, device=dev, dtype=x.dtype)[:, None]

        rep = [r.params.repetition_penalty for r in rows]
        if any(p != 1.0 for p in rep):
            # Seen in the prompt or the output: a mask, so a scatter of True will do.
            seen = torch.zeros(n * vocab + 1, dtype=torch.bool, device=dev)
            seen[out_bins] = True
            seen[
                self._flat_bins(
                    [(r.prompt_token_ids or ()) if p != 1.0 else () for r, p in zip(rows, rep, strict=True)], dev
                )
            ] = True
            seen = seen[:-1].view(n, vocab)
            r_col = column(rep)
            x = torch.where(seen, torch.where(x > 0, x / r_col, x * r_col), x)
        presence = [r.params.presence_penalty for r in rows]
        frequency = [r.params.frequency_penalty for r in rows]
        if any(presence) or any(frequency):
            counts = torch.bincount(out_bins, minlength=n * vocab + 1)[:-1].view(n, vocab).to(x.dtype)
            # where(), not a product with (counts > 0): an inf/NaN penalty then
            # spoils only the tokens it applies to, not the whole row.
            x = x - torch.where(counts > 0, column(frequency) * counts + column(presence), 0.0)
        return x if at is None else logits.index_copy(0, at, x)

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
