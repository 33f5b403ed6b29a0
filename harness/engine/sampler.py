"""Token sampling: logit bias and penalties, then greedy, temperature, top-k,
top-p and min-p, with seeds; on the device, with no host sync.

Random rows are drawn by an exponential race: with E_i ~ Exp(1) independent,
argmax_i p_i / E_i is distributed as the categorical p (the index of the
smallest of the Exp(p_i) variables E_i / p_i). The noise is drawn for the whole
vocabulary in token order, so a row's draw depends only on its probabilities
and its generator, never on a read of a device value (``torch.multinomial``
with a check of its inputs needs one per call).

A request with ``SamplingParams.seed`` gets its own ``torch.Generator``, which
draws its row's noise (one kernel per seeded row, no sync), so its tokens do
not depend on what else is in the batch: every filter is applied per row, and
a row with no filters comes out of the filter step bit-identical. Unseeded
requests share one engine generator (seeded from ``EngineConfig.seed``) that
draws all their noise at once. Rows whose probabilities are not finite (inf or
NaN logits) fall back to greedy, chosen on the device with ``torch.where``.

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

Per-row parameters (temperatures, filters, row indices, suppressed and biased
ids, token histories) cross to the device through ``harness.engine.staging``:
pinned memory and non-blocking copies, never ``torch.tensor(list)``.

``sample_fixed`` is the same arithmetic in fixed shapes over padded rows and the whole vocabulary
(every filter applied, each off where a row does not use it), for a decode step captured as a CUDA
graph (``harness.engine.cuda_graphs``); its noise is drawn outside the graph by the calls above.
Bias, penalties and suppressed ids are not in it: such steps run ``sample_columns``.

Not implemented: logprobs (the frontend refuses them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from harness.engine.staging import Stager
from harness.wire.messages import SamplingParams

_GREEDY_EPS = 1e-5
# ``Sampler.sample_fixed``'s variants: a CUDA graph is captured for each (shapes fixed, choices not).
FIXED_VARIANTS = ("greedy", "plain", "filtered")


@dataclass
class SampleRow:
    """What the sampler needs for one row of the logits."""

    params: SamplingParams
    generator: torch.Generator | None = None  # a seeded request's own generator
    suppress_token_ids: list[int] | None = None  # e.g. EOS/stop ids before min_tokens
    # Token history, read only when ``uses_penalties(params)``; None means none.
    prompt_token_ids: Sequence[int] | None = None
    output_token_ids: Sequence[int] | None = None  # generated so far, oldest first
    # params.logit_bias as (ids, biases) in the vocabulary, when the caller made it once (Sampler.bias_lists)
    bias: tuple[list[int], list[float]] | None = None


@dataclass
class SampleColumns:
    """A step's sampling inputs as columns, one entry per logits row (``Sampler.sample_columns``).

    ``top_k`` is 0 and ``top_p`` 1.0 where that filter is off, as in ``SamplingParams``; the
    float columns are float64, so comparisons see the params' own values.
    """

    temperature: np.ndarray
    top_p: np.ndarray
    top_k: np.ndarray  # int64
    min_p: np.ndarray
    greedy: np.ndarray  # bool
    # logits row -> the request's own generator, for seeded non-greedy rows only
    generators: dict[int, torch.Generator]
    # (logits row, ids it must not pick), only for rows that have any
    suppress: list[tuple[int, list[int]]]
    # The rows with a logit bias or penalties, with what those need (few rows in most steps).
    biased: dict[int, SampleRow] = field(default_factory=dict)
    penalized: dict[int, SampleRow] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.temperature)

    @classmethod
    def of_rows(cls, rows: list[SampleRow]) -> SampleColumns:
        params = [r.params for r in rows]
        return cls(
            np.array([p.temperature for p in params], dtype=np.float64),
            np.array([p.top_p for p in params], dtype=np.float64),
            np.array([p.top_k for p in params], dtype=np.int64),
            np.array([p.min_p for p in params], dtype=np.float64),
            np.array([is_greedy(p) for p in params], dtype=np.bool_),
            {i: r.generator for i, r in enumerate(rows) if r.generator is not None and not is_greedy(r.params)},
            [(i, r.suppress_token_ids) for i, r in enumerate(rows) if r.suppress_token_ids],
            {i: r for i, r in enumerate(rows) if r.params.logit_bias},
            {i: r for i, r in enumerate(rows) if uses_penalties(r.params)},
        )


def is_greedy(params: SamplingParams) -> bool:
    return params.temperature < _GREEDY_EPS


def uses_penalties(params: SamplingParams) -> bool:
    """Whether the row needs its token history (any penalty off its neutral value)."""
    return params.repetition_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0


def _argmax(logits: Tensor) -> Tensor:
    """Greedy pick per row, with NaN logits treated as never chosen."""
    return logits.masked_fill(logits.isnan(), float("-inf")).argmax(dim=-1)


def _race(probs: Tensor, noise: Tensor, logits: Tensor) -> Tensor:
    """The exponential race's pick per row (``logits``' argmax where probs are not usable); clamps ``noise``."""
    # Exp(1) may return 0: keep the ratio finite (a zero-probability token stays at 0).
    picks = (probs / noise.clamp_min_(torch.finfo(noise.dtype).tiny)).argmax(dim=-1)
    usable = torch.isfinite(probs).all(dim=-1) & (probs.sum(dim=-1) > 0)
    return torch.where(usable, picks, _argmax(logits))


class Sampler:
    def __init__(self, vocab_size: int, seed: int, device: torch.device, stager: Stager | None = None) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.stager = stager or Stager(device)

    def request_generator(self, params: SamplingParams) -> torch.Generator | None:
        """A fresh generator for a seeded, non-greedy request; None otherwise."""
        if params.seed is None or is_greedy(params):
            return None
        return torch.Generator(device=self.device).manual_seed(params.seed % (1 << 64))

    def sample(self, logits: Tensor, rows: list[SampleRow]) -> list[int]:
        """logits: [N, >= vocab_size] -> N token ids on the host."""
        if logits.shape[0] != len(rows):
            raise ValueError(f"{logits.shape[0]} logit rows for {len(rows)} sample rows")
        if not rows:
            return []
        return self.stager.fetch(self.sample_tensor(logits, rows))

    def sample_tensor(self, logits: Tensor, rows: list[SampleRow]) -> Tensor:
        """logits: [N, >= vocab_size] -> [N] int64 token ids, left on the device.

        Dispatches no op that reads a device value on the host; the caller
        fetches the result once for the whole step.
        """
        if logits.shape[0] != len(rows) or not rows:
            raise ValueError(f"{logits.shape[0]} logit rows for {len(rows)} sample rows")
        return self.sample_columns(logits, SampleColumns.of_rows(rows))

    def sample_columns(self, logits: Tensor, cols: SampleColumns) -> Tensor:
        """``sample_tensor`` for rows given as columns (``harness.engine.input_batch``): the same draws."""
        n = len(cols)
        if logits.shape[0] != n or not n:
            raise ValueError(f"{logits.shape[0]} logit rows for {n} sample rows")
        logits = logits[:, : self.vocab_size].float()
        # Both work out of place: the caller's logits stay as they were.
        if cols.biased:
            biased = sorted(cols.biased)
            logits = self._with_logit_bias(logits, [cols.biased[i] for i in biased], biased)
        if cols.penalized:
            penalized = sorted(cols.penalized)
            logits = self._with_penalties(logits, [cols.penalized[i] for i in penalized], penalized)
        logits = self._with_suppressed(logits, cols.suppress)
        rand = np.flatnonzero(~cols.greedy)
        if not rand.size:
            return _argmax(logits)
        shared, seeded = self._random_rows(cols, rand)
        order = np.concatenate([shared, seeded])
        top_k, top_p, min_p = cols.top_k[order], cols.top_p[order], cols.min_p[order]
        filters = bool(((top_k > 0) | (top_p < 1.0) | (min_p > 0.0)).any())
        whole = order.size == n and bool((order == np.arange(n)).all())
        ints = self.stager.ints(
            np.zeros(0, np.int64) if whole else order,
            np.where(top_k > 0, top_k, self.vocab_size) if filters else np.zeros(0, np.int64),
        )
        none = np.zeros(0, np.float64)
        floats = self.stager.floats(
            cols.temperature[order],
            # inf / 0 where a filter is off, so its comparisons are never true.
            np.where(top_p < 1.0, top_p, np.inf) if filters else none,
            min_p if filters else none,
        )
        idx, top_k_t = ints
        temps, top_p_t, min_p_t = floats
        sub = logits if whole else logits.index_select(0, idx)
        scaled = sub / temps[:, None]
        probs = self._probs(scaled, top_k_t, top_p_t, min_p_t) if filters else torch.softmax(scaled, dim=-1)
        noise = torch.empty_like(probs)
        self._draw_noise(noise, shared.size, seeded, cols.generators)
        picks = _race(probs, noise, sub)
        if whole:
            return picks
        return _argmax(logits).index_copy_(0, idx, picks)

    @staticmethod
    def _random_rows(cols: SampleColumns, rand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The non-greedy rows ``rand`` split into shared-generator rows and seeded rows, each in row order."""
        gens = cols.generators
        is_seeded = np.fromiter((i in gens for i in rand.tolist()), dtype=np.bool_, count=rand.size)
        return rand[~is_seeded], rand[is_seeded]

    def _draw_noise(self, noise: Tensor, n_shared: int, seeded: np.ndarray, gens: dict[int, torch.Generator]) -> None:
        """Exp(1) noise into ``noise``'s first rows: the shared-generator rows' in one draw, then one
        draw per seeded row from its own generator (so a seeded row's noise ignores the batch)."""
        if n_shared:
            noise[:n_shared].exponential_(generator=self.generator)
        for j, i in enumerate(seeded.tolist(), start=n_shared):
            noise[j].exponential_(generator=gens[i])

    # -- the fixed-shape path of a CUDA graph (harness.engine.cuda_graphs) ------------------------

    @staticmethod
    def graph_safe(cols: SampleColumns) -> bool:
        """Whether ``sample_fixed`` can sample these rows: no logit bias, penalties or suppressed ids
        (those need per-step lists of data-dependent length; such a step runs ``sample_columns``)."""
        return not (cols.biased or cols.penalized or any(ids for _, ids in cols.suppress))

    def fixed_inputs(self, cols: SampleColumns, rows: int) -> tuple[np.ndarray, np.ndarray, str]:
        """A step's columns as ``sample_fixed``'s inputs, padded to ``rows``.

        Returns ints [3, rows] (top-k, greedy, noise row), floats [3, rows] (temperature, top-p,
        min-p) and the step's variant (``FIXED_VARIANTS``): greedy (every row), filtered (a random
        row has a filter) or plain. Padding rows are greedy; their picks are dropped. The step's
        noise is drawn by ``draw_fixed_noise``.
        """
        n, vocab = len(cols), self.vocab_size
        ints = np.zeros((3, rows), dtype=np.int64)
        floats = np.zeros((3, rows), dtype=np.float64)
        ints[0], ints[1], floats[0], floats[1] = vocab, 1, 1.0, np.inf  # every filter off, greedy
        order = np.concatenate(self._random_rows(cols, np.flatnonzero(~cols.greedy)))
        top_k, top_p, min_p = cols.top_k[order], cols.top_p[order], cols.min_p[order]
        ints[0, order] = np.where(top_k > 0, top_k, vocab)
        ints[1, :n] = cols.greedy
        ints[2, order] = np.arange(order.size)
        floats[0, order] = cols.temperature[order]
        floats[1, order] = np.where(top_p < 1.0, top_p, np.inf)
        floats[2, order] = min_p
        if not order.size:
            return ints, floats, "greedy"
        return ints, floats, "filtered" if ((top_k > 0) | (top_p < 1.0) | (min_p > 0.0)).any() else "plain"

    def draw_fixed_noise(self, cols: SampleColumns, noise: Tensor) -> None:
        """The step's Exp(1) noise into ``noise``'s first rows, by the calls ``sample_columns`` makes
        (same shapes, generators and order), so a graph's tokens are the eager step's."""
        shared, seeded = self._random_rows(cols, np.flatnonzero(~cols.greedy))
        self._draw_noise(noise, shared.size, seeded, cols.generators)

    def sample_fixed(self, logits: Tensor, ints: Tensor, floats: Tensor, noise: Tensor, variant: str) -> Tensor:
        """``sample_columns`` in fixed-shape ops over every row and the whole vocabulary, no host sync:
        logits [R, >= vocab], ints/floats [3, R] and noise [>= R, vocab] from ``fixed_inputs`` -> [R].

        Row by row the same arithmetic as ``sample_columns``, whose step-wide choices ``variant``
        makes: greedy (an argmax alone), plain (a softmax) or filtered (``_probs``); so a row's pick
        matches the eager one for the same noise.
        """
        logits = logits[:, : self.vocab_size].float()
        if variant == "greedy":
            return _argmax(logits)
        top_k, greedy, noise_row = ints.unbind(0)
        temps, top_p, min_p = floats.unbind(0)
        scaled = logits / temps[:, None]
        probs = self._probs(scaled, top_k, top_p, min_p) if variant == "filtered" else torch.softmax(scaled, dim=-1)
        picks = _race(probs, noise.index_select(0, noise_row), logits)
        return torch.where(greedy != 0, _argmax(logits), picks)

    def _probs(self, logits: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor) -> Tensor:
        """Softmax after top-k, then top-p and min-p, per row; in token order.

        The filters are decided on the sorted row and applied as a mask in
        token order, so a row with every filter off is left bit-identical.
        """
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        ranks = torch.arange(sorted_logits.shape[-1], device=logits.device)[None, :]
        beyond_k = ranks >= top_k[:, None]
        probs = torch.softmax(sorted_logits.masked_fill(beyond_k, float("-inf")), dim=-1)
        # top-p: drop a token when the mass before it already reaches top_p
        # (the first token is always kept); min-p: drop tokens below min_p
        # times the most likely one. Both on the top-k-renormalised mass.
        drop = beyond_k | (probs.cumsum(dim=-1) - probs >= top_p[:, None])
        drop |= probs < min_p[:, None] * probs[:, :1]
        drop[:, 0].fill_(False)  # fill_, not a setitem of a Python scalar (which lifts it into a tensor)
        drop = torch.zeros_like(drop).scatter_(1, order, drop)
        return torch.softmax(logits.masked_fill(drop, float("-inf")), dim=-1)

    def _with_suppressed(self, logits: Tensor, suppress: list[tuple[int, list[int]]]) -> Tensor:
        """A copy of logits with each (row, ids)'s ids at -inf on that row (all of a row never)."""
        at_row: list[int] = []
        at_tok: list[int] = []
        for i, suppressed in suppress:
            if suppressed:
                ids = [t for t in suppressed if 0 <= t < self.vocab_size]
                if len(ids) < self.vocab_size:  # never suppress everything
                    at_row += [i] * len(ids)
                    at_tok += ids
        if not at_row:
            return logits
        r, t = self.stager.ints(at_row, at_tok)
        return logits.index_put((r, t), logits.new_full((), float("-inf")))

    def bias_lists(self, params: SamplingParams) -> tuple[list[int], list[float]] | None:
        """params.logit_bias as (token ids, biases), ids outside the vocabulary dropped; None without one.
        The executor makes it once per request: a step only concatenates."""
        if not params.logit_bias:
            return None
        kept = [(t, b) for t, b in params.logit_bias.items() if 0 <= t < self.vocab_size]
        return [t for t, _ in kept], [b for _, b in kept]

    def _with_logit_bias(self, logits: Tensor, rows: list[SampleRow], idx: list[int]) -> Tensor:
        """A copy of logits with rows[j]'s bias added on row idx[j] (ids outside the vocabulary ignored)."""
        at_row: list[int] = []
        at_tok: list[int] = []
        vals: list[float] = []
        for j, row in zip(idx, rows, strict=True):
            ids, biases = row.bias if row.bias is not None else self.bias_lists(row.params) or ([], [])
            at_row += [j] * len(ids)
            at_tok += ids
            vals += biases
        r, t = self.stager.ints(at_row, at_tok)
        (v,) = self.stager.floats(vals)
        return logits.index_put((r, t), v.to(logits.dtype), accumulate=True)

    def _flat_bins(self, id_lists: list[Sequence[int]], device: torch.device) -> Tensor:
        """Every list's ids as bins of one flat [len(id_lists) * vocab + 1] space, on ``device``.

        List j's id t becomes j * vocab + t, so one scatter serves every row;
        ids outside the vocabulary go to the spare last bin, which callers
        drop. Computed on the host (the ids are there) and sent in one
        non-blocking copy.
        """
        vocab, n = self.vocab_size, len(id_lists)
        parts = [np.asarray(ids, dtype=np.int64) for ids in id_lists]
        flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        row = np.repeat(np.arange(n, dtype=np.int64), [len(p) for p in parts])
        keep = (flat >= 0) & (flat < vocab)
        (bins,) = self.stager.ints(np.where(keep, row * vocab + flat, n * vocab))
        return bins if bins.device == device else bins.to(device)

    def _with_penalties(self, logits: Tensor, rows: list[SampleRow], idx: list[int]) -> Tensor:
        """logits with repetition, then presence and frequency penalties applied on rows ``idx``.

        Out of place. Each block runs only when some row uses it; a row at its
        neutral value in a block that runs comes out bit-identical (x / 1, x * 1,
        x - 0).
        """
        dev, n, vocab = logits.device, len(rows), self.vocab_size
        whole = n == logits.shape[0]  # idx is increasing, so it is every row
        at = None if whole else self.stager.ints(idx)[0]
        x = logits if at is None else logits.index_select(0, at)
        out_bins = self._flat_bins([r.output_token_ids or () for r in rows], dev)

        def column(values: list[float]) -> Tensor:
            return self.stager.floats(values)[0].to(x.dtype)[:, None]

        rep = [r.params.repetition_penalty for r in rows]
        if any(p != 1.0 for p in rep):
            # Seen in the prompt or the output: a mask, so a scatter of True will do.
            seen = torch.zeros(n * vocab + 1, dtype=torch.bool, device=dev)
            prompt_bins = self._flat_bins(
                [(r.prompt_token_ids or ()) if p != 1.0 else () for r, p in zip(rows, rep, strict=True)], dev
            )
            seen.index_fill_(0, out_bins, True).index_fill_(0, prompt_bins, True)
            seen = seen[:-1].view(n, vocab)
            r_col = column(rep)
            x = torch.where(seen, torch.where(x > 0, x / r_col, x * r_col), x)
        presence = [r.params.presence_penalty for r in rows]
        frequency = [r.params.frequency_penalty for r in rows]
        if any(presence) or any(frequency):
            # A scatter-add, not bincount: bincount sizes its output from the data (a sync on CUDA).
            counts = torch.zeros(n * vocab + 1, dtype=x.dtype, device=dev)
            counts.index_add_(0, out_bins, torch.ones(out_bins.shape[0], dtype=x.dtype, device=dev))
            counts = counts[:-1].view(n, vocab)
            # where(), not a product with (counts > 0): an inf/NaN penalty then
            # spoils only the tokens it applies to, not the whole row.
            x = x - torch.where(counts > 0, column(frequency) * counts + column(presence), 0.0)
        return x if at is None else logits.index_copy(0, at, x)
