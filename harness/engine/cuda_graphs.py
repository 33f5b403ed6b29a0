"""CUDA graphs for the torch executor's decode-only steps (``EngineConfig.cuda_graphs``).

A decode step of B rows launches hundreds of small kernels (every layer's norms, projections,
gathers, attention, the sampler's ops); on a GPU their launch time can exceed their run time.
A CUDA graph records one step's kernels once and replays them with one launch. A graph
replays fixed shapes on fixed addresses, so:

- Steps are padded to a *bucket* of rows (1, 2, 4, 8, then multiples of 8 up to the
  engine's ``max_num_seqs``, as vLLM does); one graph per bucket and sampler variant (greedy,
  a plain softmax, or top-k/top-p/min-p filters), captured at start from the largest bucket down,
  sharing one memory pool (a smaller graph reuses the larger one's memory: replays never
  overlap, and a replay's tokens are fetched before the next).
- Each bucket owns static input buffers: one int64 buffer (token ids, positions, cache slots,
  the sampler's int columns, block tables padded to a whole ``max_model_len``) and one float32
  buffer (temperature, top-p, min-p). The host's part of a step (``prepare``) stages its values
  in fresh tensors (one non-blocking copy each); the device's part (``replay``) copies them into
  the static buffers, so a step can be prepared while the one before it replays.
- Attention: a varlen kernel that reads the cache in place through the block tables (vLLM's
  FlashAttention build, ``harness.engine.attention_kernels``) takes the step as fixed shapes (one
  query a row; each row's key count and table in the static buffers; at most ``max_model_len``
  keys), so the graphs use it where the model does. Otherwise (the torch reference, or a kernel
  that packs the step's keys, sized by the step) the graphs run the reference over a whole
  ``max_model_len`` of keys a row, masked past each row's position: more gathering than an eager
  step of short sequences.
- Padding rows write their K/V into a *scratch block*, one block past those the scheduler
  hands out (``scratch_blocks``), attend only to it, and their tokens are dropped.
- Sampling runs inside the graph through ``Sampler.sample_fixed`` (no host sync, no
  data-dependent shape); its noise is drawn just before the replay by the same calls as the
  eager sampler's, so seeded and unseeded streams are the eager ones (bit for bit on the CPU; on
  a GPU the padded batch's kernels may round a near tie the other way).

Steps that are not graph-safe run eagerly and are counted by reason: a prefill chunk in the
step, more rows than the largest bucket, a request with a logit bias, penalties or logprobs,
or suppressed ids (``min_tokens``); every step, when the capture failed (its error is kept).

``emulate`` (tests only): "capture" keeps the step's callable after one warm-up call and
"replay" calls it on the same static buffers, so bucketing, padding, the scratch block and the
buffer plumbing run for real on a CPU; only ``torch.cuda.CUDAGraph`` itself is left out.
"""

from __future__ import annotations

import gc
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor

from harness.engine.attention import REFERENCE
from harness.engine.config import EngineConfig
from harness.engine.input_batch import InputBatch
from harness.engine.model import Transformer
from harness.engine.sampler import FIXED_VARIANTS, SampleColumns, Sampler
from harness.engine.staging import Stager
from harness.engine.step import ScheduledChunk
from harness.engine.step_plan import StepPlan

_STEP = 8  # bucket spacing past 8 rows
log = logging.getLogger("wirebench.engine")


def bucket_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, 16, 24, ...: up to the first that holds ``max_num_seqs`` rows."""
    sizes: list[int] = []
    size = 1
    while not sizes or sizes[-1] < max_num_seqs:
        sizes.append(size)
        size = size * 2 if size < _STEP else size + _STEP
    return sizes


def scratch_blocks(config: EngineConfig) -> int:
    """KV blocks the model holds past the scheduler's: one for padding rows when graphs are on."""
    return 1 if config.cuda_graphs else 0


def refusal(config: EngineConfig) -> str | None:
    """Why the engine cannot run ``config``'s CUDA graphs (said at start, in one line), or None."""
    if not config.cuda_graphs:
        return None
    if config.device == "cpu":
        return "--cuda-graphs needs a CUDA device; --device cpu runs on the CPU"
    if not torch.cuda.is_available():
        return "--cuda-graphs needs a CUDA device; this machine has none"
    return None


class _Emulated:
    """Tests on a CPU: the captured step is its callable, called again on the same buffers."""

    def __init__(self, fn: Callable[[], Tensor]) -> None:
        self.fn = fn

    def replay(self) -> Tensor:
        return self.fn()


class _Captured:
    def __init__(self, graph: torch.cuda.CUDAGraph, out: Tensor) -> None:
        self.graph, self.out = graph, out

    def replay(self) -> Tensor:
        self.graph.replay()
        return self.out


@dataclass
class GraphStep:
    """A decode step ``DecodeGraphs.prepare`` took: its bucket and inputs, staged for ``replay``."""

    bucket: int
    rows: int  # real rows; the rest of the bucket is padding
    variant: str  # which sampler variant's graph replays (``FIXED_VARIANTS``)
    ints: Tensor  # the bucket's int buffer's values
    floats: Tensor  # its float buffer's, flat
    cols: SampleColumns  # for the noise draws


def _regions(b: int, max_blocks: int) -> dict[str, slice]:
    """Where each input of a bucket of ``b`` rows lies in its int64 buffer: ids, positions, cache
    slots, the sampler's ints [3, b], block tables [b, max_blocks], then FlashAttention's varlen
    lists (cu_seqlens_q, seqlens_k, cu_seqlens_k) for a kernel that reads the cache in place."""
    sizes = {
        "ids": b,
        "positions": b,
        "slots": b,
        "sampling": 3 * b,
        "tables": b * max_blocks,
        "cu_q": b + 1,
        "k_lens": b,
        "cu_k": b + 1,
    }
    out, at = {}, 0
    for name, size in sizes.items():
        out[name], at = slice(at, at + size), at + size
    return out


@dataclass
class _Bucket:
    """One bucket's static buffers and its graphs, by sampler variant."""

    rows: int
    ints: Tensor  # the int64 inputs, laid out by ``_regions``
    floats: Tensor  # [3, rows]: temperature, top-p, min-p
    padding: np.ndarray  # ``ints`` of an all-padding step, the template each step's inputs are written over
    at: dict[str, slice]  # ``_regions``
    graphs: dict[str, _Emulated | _Captured] = field(default_factory=dict)

    def part(self, name: str) -> Tensor:
        return self.ints[self.at[name]]


class DecodeGraphs:
    """The decode steps' CUDA graphs: built and captured by ``decode_graphs``; then, per step,
    ``prepare`` on the host and ``replay`` on the device (the executor's two halves of a step)."""

    def __init__(
        self,
        model: Transformer,
        sampler: Sampler,
        max_num_seqs: int,
        scratch_block: int,
        emulate: bool = False,
    ) -> None:
        if scratch_block >= model.num_blocks:
            raise ValueError(f"scratch block {scratch_block} is not in the model's {model.num_blocks} blocks")
        self.model, self.sampler, self.emulate = model, sampler, emulate
        self.stager = Stager(model.device)
        self.device = model.device
        self.scratch_block = scratch_block  # the scheduler hands out blocks [0, scratch_block)
        self.block_size = model.block_size
        self.max_blocks = model.blocks_per_slot  # a whole max_model_len of blocks a row
        # A varlen kernel that reads keys in place through the block tables takes fixed shapes (one
        # query a row, max_model_len keys at most): the graphs use it. One that packs the step's keys
        # sizes them by the step's lengths, which a graph cannot: the reference serves instead.
        kernel = model.attention_kernel
        self.varlen = kernel.varlen and not kernel.packed_keys
        self.kernel = kernel if self.varlen else REFERENCE
        self.attention = self.kernel.name
        self.sizes = bucket_sizes(max_num_seqs)
        # Shared by every bucket: the sampler's Exp(1) noise, drawn into its first rows before a replay.
        self.noise = torch.ones(self.sizes[-1], sampler.vocab_size, device=self.device)
        self.buckets = {b: self._bucket(b) for b in self.sizes}
        self.replays: Counter[int] = Counter()  # by bucket
        self.variants: Counter[str] = Counter()  # replays by sampler variant
        self.eager: Counter[str] = Counter()  # by reason
        self.capture_s: float | None = None
        self.error: str | None = None  # why the capture failed (then every step runs eagerly)

    def _bucket(self, b: int) -> _Bucket:
        at = _regions(b, self.max_blocks)
        padding = np.zeros(at["cu_k"].stop, dtype=np.int64)
        # A padding row: token 0 at position 0 of the scratch block, greedy, every filter off.
        padding[at["slots"]] = self.scratch_block * self.block_size
        padding[at["sampling"]][:b] = self.sampler.vocab_size  # top-k off
        padding[at["sampling"]][b : 2 * b] = 1  # greedy
        padding[at["tables"]] = self.scratch_block
        padding[at["cu_q"]] = np.arange(b + 1)  # one query a row, in every step
        padding[at["k_lens"]] = 1
        padding[at["cu_k"]] = np.arange(b + 1)
        floats = torch.zeros(3, b, device=self.device)
        floats[0].fill_(1.0)  # temperature
        floats[1].fill_(float("inf"))  # top-p off
        ints = torch.from_numpy(padding.copy()).to(self.device)
        return _Bucket(b, ints, floats, padding, at)

    def bucket_for(self, rows: int) -> int | None:
        """The smallest bucket that holds ``rows`` rows; None past the largest."""
        return next((b for b in self.sizes if b >= rows), None)

    def _step(self, bk: _Bucket, variant: str) -> Tensor:
        """One padded decode step on ``bk``'s static buffers -> its tokens [rows]: what a graph records."""
        b, model = bk.rows, self.model
        # A plan for the shapes alone (every row at the last position: keys [0, max_model_len)); the
        # rows' real positions and tables are the buffers' values, which the mask and gathers read.
        shapes = StepPlan([()] * b, [model.max_model_len - 1] * b)
        none = bk.ints[:0]
        staged = [bk.part("slots"), bk.part("positions"), bk.part("tables"), none, none]
        if self.varlen:
            staged += [bk.part("cu_q"), bk.part("k_lens"), bk.part("cu_k"), bk.part("tables")]
        batch = model.make_batch(shapes, staged, self.kernel)
        logits = model.forward_step(model.embed(bk.part("ids")), batch)
        return self.sampler.sample_fixed(logits, bk.part("sampling").view(3, b), bk.floats, self.noise, variant)

    def capture(self) -> None:
        """Capture every bucket's graphs, largest first (emulated: keep each step's callable).

        A capture that fails (an op that syncs, memory) is said in the log and the info, and every
        step then runs eagerly: the engine still serves, and a run says why it had no graphs.
        """
        started = time.perf_counter()
        try:
            with torch.inference_mode():
                if self.emulate:
                    for b in reversed(self.sizes):
                        for variant in FIXED_VARIANTS:
                            fn = partial(self._step, self.buckets[b], variant)
                            fn()  # the warm-up a capture makes: it writes only the scratch block
                            self.buckets[b].graphs[variant] = _Emulated(fn)
                else:
                    self._capture_cuda()
        except Exception as exc:
            lines = str(exc).strip().splitlines()
            self.error = f"{type(exc).__name__}: {lines[0][:300] if lines else '(no message)'}"
            for bk in self.buckets.values():
                bk.graphs.clear()
            log.warning("CUDA graph capture failed, decode steps run eagerly: %s", self.error)
        self.capture_s = time.perf_counter() - started

    def _capture_cuda(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.device)
        # Each capture starts with a full gc.collect (torch.cuda.graph): with the heap frozen meanwhile
        # it scans only what is new, not the whole loaded engine, once per graph.
        frozen_here = gc.get_freeze_count() == 0
        if frozen_here:
            gc.freeze()
        try:
            for b in reversed(self.sizes):  # largest first: the smaller graphs reuse its pool memory
                bk = self.buckets[b]
                for variant in FIXED_VARIANTS:
                    # A warm-up on a side stream first (lazy inits, allocator), as torch's docs ask.
                    side.wait_stream(torch.cuda.current_stream(self.device))
                    with torch.cuda.stream(side):
                        self._step(bk, variant)
                    torch.cuda.current_stream(self.device).wait_stream(side)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        out = self._step(bk, variant)
                    bk.graphs[variant] = _Captured(graph, out)
        finally:
            if frozen_here:
                gc.unfreeze()
        torch.cuda.synchronize(self.device)

    def prepare(
        self,
        batch: InputBatch,
        rows: np.ndarray,
        decodes: Sequence[ScheduledChunk],
        prefills: Sequence[ScheduledChunk],
        cols: SampleColumns | None,
        exclude: set[str],
    ) -> GraphStep | None:
        """The host's part of a graph step: its inputs staged (not yet in the static buffers), or
        None (counted by reason): the step runs eagerly.

        ``rows``: the decodes' rows of the persistent ``batch``; ``cols``: their sampling columns;
        ``exclude``: the requests with a logit bias, penalties or logprobs (they run eagerly).
        """
        n = len(decodes)
        bucket = self.bucket_for(n)
        reason = None
        if self.error is not None:
            reason = "capture_failed"
        elif prefills or not decodes or cols is None:
            reason = "prefill"
        elif bucket is None:
            reason = "rows"
        elif exclude and any(c.request_id in exclude for c in decodes):
            reason = "bias_penalties_logprobs"
        elif not self.sampler.graph_safe(cols):
            reason = "suppressed_ids"
        if reason is not None or bucket is None or cols is None:
            self.eager[reason or "rows"] += 1
            return None
        bk = self.buckets[bucket]
        positions = [c.start_pos for c in decodes]
        plan = StepPlan([c.block_ids for c in decodes], positions)
        plan.decode_table, plan.decode_table_lens = batch.tables(
            rows, plan.decode_blocks, self.max_blocks, self.scratch_block
        )
        plan.check(self.model.num_blocks, self.block_size, self.model.max_model_len)
        b, bs, at = bucket, self.block_size, bk.at
        host = bk.padding.copy()
        pos = np.asarray(positions, dtype=np.int64)
        host[at["positions"]][:n] = pos
        host[at["slots"]][:n] = plan.index_lists(bs)[0]  # a pure decode plan: its decode rows' slots
        host[at["tables"]].reshape(b, self.max_blocks)[:n] = plan.decode_table
        host[at["k_lens"]][:n] = pos + 1
        host[at["cu_k"]][1:] = np.cumsum(host[at["k_lens"]])
        sample_ints, floats, variant = self.sampler.fixed_inputs(cols, b)
        host[at["sampling"]] = sample_ints.reshape(-1)
        # Fresh staging tensors, not the static buffers: the step before may still be replaying.
        (ints,) = self.stager.ints(host)
        (floats_t,) = self.stager.floats(floats.reshape(-1))
        return GraphStep(b, n, variant, ints, floats_t, cols)

    def replay(self, step: GraphStep, ids: Tensor) -> Tensor:
        """The device's part: the step's inputs into its bucket's static buffers, its noise drawn,
        the graph replayed -> its tokens [rows], on the device (valid until the next replay).

        ``ids``: the step's input token ids as the executor staged them, those fed by the step
        before already filled in on the device (``prepare`` leaves the ids to this).
        """
        bk = self.buckets[step.bucket]
        bk.ints.copy_(step.ints, non_blocking=True)
        bk.part("ids")[: step.rows].copy_(ids, non_blocking=True)
        bk.floats.view(-1).copy_(step.floats, non_blocking=True)
        self.sampler.draw_fixed_noise(step.cols, self.noise)
        tokens = bk.graphs[step.variant].replay()
        self.replays[step.bucket] += 1
        self.variants[step.variant] += 1
        return tokens[: step.rows]

    def info(self) -> dict[str, Any]:
        """For the executor's info: what was captured, how many steps replayed and how many ran eagerly."""
        return {
            "enabled": True,
            "emulated": self.emulate,
            "attention": self.attention,  # the kernel the graphs attend with
            "captured": sorted(b for b, bk in self.buckets.items() if bk.graphs),
            "capture_s": None if self.capture_s is None else round(self.capture_s, 2),
            "replays": sum(self.replays.values()),
            "replays_by_bucket": {str(b): n for b, n in sorted(self.replays.items())},
            "replays_by_variant": dict(sorted(self.variants.items())),
            "eager_steps": sum(self.eager.values()),
            "eager_by_reason": dict(sorted(self.eager.items())),
            **({"error": self.error} if self.error is not None else {}),
        }


def decode_graphs(
    config: EngineConfig,
    model: Transformer,
    sampler: Sampler,
    emulate: bool = False,
) -> DecodeGraphs | None:
    """The executor's decode graphs, captured; None when ``config.cuda_graphs`` is off.

    Raises ValueError off CUDA (``refusal`` says so before the engine starts); ``emulate`` is for tests.
    """
    if not config.cuda_graphs:
        return None
    if model.device.type != "cuda" and not emulate:
        raise ValueError(refusal(config) or f"--cuda-graphs needs a CUDA device; the model is on {model.device}")
    graphs = DecodeGraphs(model, sampler, config.max_num_seqs, config.num_kv_blocks, emulate)
    graphs.capture()
    return graphs
