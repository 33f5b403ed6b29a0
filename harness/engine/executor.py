"""Executors: run one scheduled step and return the sampled tokens.

``TorchExecutor`` runs the model of ``harness.engine.model`` (plus the vision encoder
and sampler): each step is one forward over its decode rows and every prefill
chunk, fed by one non-blocking host-to-device copy and read back by one
device-to-host copy of the sampled ids. ``SimExecutor`` runs no model and only
spends the time a step is modelled to take. Both take a ``SchedulerOutput`` and return a
``ModelRunnerOutput``, so the engine loop does not know which it has.

Per-request state (sampling params, seeded generator, image embeddings and,
only for requests with penalties, their token history) is created the first
time a request appears in ``new_requests`` and dropped when its id shows up
in ``finished_req_ids``; so is its row of the persistent batch
(``harness.engine.input_batch``), whose columns feed the sampler. A request
whose inputs can't be processed (say, an image that fails to decode) is
reported in ``ModelRunnerOutput.errors`` instead of failing the step for everyone.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from harness.engine.config import EngineConfig
from harness.engine.device import (
    MemoryPlan,
    check_fits,
    count_params,
    device_warning,
    kv_bytes_per_token,
    resolve_device,
    resolve_dtype,
    synchronize,
    workspace_bytes,
)
from harness.engine.input_batch import InputBatch
from harness.engine.logprobs import sim_logprobs, top_logprobs
from harness.engine.model import build_model, get_model_config
from harness.engine.sampler import Sampler, SampleRow, uses_penalties
from harness.engine.sim_gpu import DeviceStats, SimDevice, StepHandle
from harness.engine.staging import Stager, StepBuffers, step_token_ids
from harness.engine.step import ModelRunnerOutput, NewRequest, ScheduledChunk, SchedulerOutput
from harness.engine.step_plan import Chunk, StepPlan
from harness.engine.step_time import step_time_model
from harness.engine.vision import build_vision_encoder, to_pixels
from harness.wire.messages import Logprobs, SamplingParams

log = logging.getLogger("wirebench.engine")


class Executor(Protocol):
    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput: ...

    def info(self) -> dict[str, Any]:
        """What ran the steps, for result metadata."""
        ...


def make_executor(config: EngineConfig) -> Executor:
    if config.executor == "torch":
        return TorchExecutor(config)
    if config.executor == "sim":
        return SimExecutor(config)
    raise ValueError(f"unknown executor {config.executor!r}; choose 'torch' or 'sim'")


def _error_text(exc: BaseException) -> str:
    return f"could not process the request's inputs: {type(exc).__name__}: {exc}"


def splice_images(x: Tensor, start: int, images: list[tuple[int, Tensor]]) -> None:
    """Overwrite, in place, the rows of a chunk that fall inside image placeholders.

    x: [T, dim] embeddings of positions [start, start+T); images: (placeholder
    offset, embeddings [N, dim]) pairs. A placeholder may span several chunks:
    each chunk takes the slice of the image's rows that lies inside it.
    """
    end = start + x.shape[0]
    for offset, emb in images:
        lo, hi = max(start, offset), min(end, offset + emb.shape[0])
        if lo < hi:
            x[lo - start : hi - start] = emb[lo - offset : hi - offset]


@dataclass
class _TorchState:
    params: SamplingParams
    generator: torch.Generator | None
    # (placeholder offset, embeddings [image_tokens, dim]) per image
    images: list[tuple[int, Tensor]] = field(default_factory=list)
    # Token history for the sampler's penalties; None (no tracking) when all are default.
    prompt_ids: list[int] | None = None
    output_ids: list[int] | None = None
    # logit_bias as (token ids, biases) within the vocabulary: made once at admission, not every step.
    bias: tuple[list[int], list[float]] | None = None


class TorchExecutor:
    """The model, vision encoder and sampler on one device; one ``forward_step`` per engine step.

    A step's decode rows and every prefill chunk (of any number of requests)
    run as one batch; all of the step's integer inputs reach the device in one
    non-blocking copy into preallocated buffers (``harness.engine.staging.StepBuffers``),
    images as their raw bytes;
    the sampled ids come back in one copy, the step's only host sync.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        self.device_warning = device_warning(config.device, self.device)
        if self.device_warning:
            log.warning("%s", self.device_warning)
        if self.device.type == "cpu":
            torch.set_num_threads(config.num_threads)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.model_config = get_model_config(config.model_preset, config.vocab_size)
        mc = self.model_config
        cache_tokens = config.kv_capacity  # the paged cache: num_kv_blocks x kv_block_size
        self.memory = check_fits(
            MemoryPlan(
                weights=count_params(mc) * self.dtype.itemsize,
                kv_cache=cache_tokens * kv_bytes_per_token(mc, self.dtype),
                workspace=workspace_bytes(
                    mc, self.dtype, config.max_num_batched_tokens, config.max_num_seqs, config.max_model_len
                ),
                kv_tokens=cache_tokens,
            ),
            self.device,
        )
        self.model = build_model(
            mc,
            config.max_num_seqs,
            config.max_model_len,
            self.device,
            self.dtype,
            config.seed,
            num_blocks=config.num_kv_blocks,
            block_size=config.kv_block_size,
        )
        self.vision = build_vision_encoder(
            mc.vision_dim, mc.dim, config.image_tokens, self.device, self.dtype, config.seed + 1
        )
        self.stager = Stager(self.device)
        # A step's int inputs (token ids, positions, cache slots, tables) cross in these, reused every step.
        self.step_buffers = StepBuffers(self.device)
        self.sampler = Sampler(config.vocab_size, config.seed, self.device, self.stager)
        self.states: dict[str, _TorchState] = {}
        self.logprob_ids: set[str] = set()  # running requests that asked for logprobs: most steps have none
        # Requests with a logit bias or penalties: the sampler needs more of them than columns hold.
        self.special_ids: set[str] = set()
        # A row per live request: its sampling columns and block table.
        self.batch = InputBatch(config.max_num_seqs, -(-config.max_model_len // config.kv_block_size))
        self.sdpa = self.model.sdpa_backends()
        self.compile_s: float | None = None
        if config.compile:
            started = time.perf_counter()
            self.model.enable_compile()
            self._warm_up()
            self.compile_s = time.perf_counter() - started
        synchronize(self.device)

    def _warm_up(self) -> None:
        """Compile now rather than in the first requests' TTFT: 1 row, then 2 and 3 (dynamic rows)."""
        with torch.inference_mode():
            for n in (1, 2, 3):
                # Block 0 is rewritten before any request reads it.
                plan = StepPlan(chunks=[Chunk([0], 0, n)])
                batch, (ids,) = self.model.stage(plan, [0] * n)
                self.model.forward_step(self.model.embed(ids), batch)
        synchronize(self.device)

    def info(self) -> dict[str, Any]:
        cfg = self.config
        info: dict[str, Any] = {
            "executor": "torch",
            "device": str(self.device),
            "device_name": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu",
            "dtype": str(self.dtype).removeprefix("torch."),
            "model_preset": cfg.model_preset,
            "model": asdict(self.model_config),
            "num_params": sum(p.numel() for p in self.model.parameters()),
            **limits_info(cfg),
            "kv_cache_bytes": self.model.kv_cache_bytes,
            "memory": self.memory.as_gib(),
            "sdpa": self.sdpa,
            "compile": cfg.compile,
            "torch_threads": torch.get_num_threads(),
            "torch_version": torch.__version__,
        }
        if self.compile_s is not None:
            info["compile_s"] = round(self.compile_s, 1)
        if self.device_warning:
            info["device_warning"] = self.device_warning
        if self.device.type == "cuda" and "math" in self.sdpa.values():
            slow = ", ".join(k for k, v in self.sdpa.items() if v == "math")
            info["sdpa_warning"] = f"SDPA runs its math fallback for {slow}: attention scores are materialized"
        return info

    def _new_state(self, nr: NewRequest) -> _TorchState:
        params = nr.request.sampling_params
        st = _TorchState(params, self.sampler.request_generator(params), bias=self.sampler.bias_lists(params))
        if uses_penalties(params):
            st.prompt_ids, st.output_ids = nr.request.prompt_token_ids, []
        for item, pr in zip(nr.request.mm_inputs or [], nr.request.mm_placeholders or [], strict=True):
            # Computed once per request; raw pixels cross to the device and are converted there.
            st.images.append((pr.offset, self.vision.encode(item, self.stager.tensor)))
        return st

    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        t0 = time.perf_counter()
        errors: dict[str, str] = {}
        sampled: dict[str, int] = {}
        logprobs: dict[str, Logprobs] = {}
        with torch.inference_mode():
            for rid in sched.finished_req_ids:
                self.states.pop(rid, None)
                self.logprob_ids.discard(rid)
                self.special_ids.discard(rid)
                self.batch.remove(rid)
            for nr in sched.new_requests:
                try:
                    st = self.states[nr.request_id] = self._new_state(nr)
                    self.batch.add(nr.request_id, st.params, st.generator)
                    if st.params.logprobs is not None:
                        self.logprob_ids.add(nr.request_id)
                    if st.params.logit_bias or st.output_ids is not None:
                        self.special_ids.add(nr.request_id)
                except Exception as exc:  # bad payload: fail this request, not the step
                    errors[nr.request_id] = _error_text(exc)
            decodes = [c for c in sched.decodes if c.request_id in self.states]
            prefills = [c for c in sched.prefills if c.request_id in self.states]
            if decodes or prefills:
                sampled, logprobs = self._run(decodes, prefills)
            if not sampled:  # nothing fetched: wait here, so the step's time covers its kernels
                synchronize(self.device)
        return ModelRunnerOutput(sampled, errors, time.perf_counter() - t0, logprobs=logprobs)

    def _run(
        self, decodes: list[ScheduledChunk], prefills: list[ScheduledChunk]
    ) -> tuple[dict[str, int], dict[str, Logprobs]]:
        """One forward over decode rows then prefill chunks; sample where a chunk reaches the end."""
        sample_chunks = decodes + [c for c in prefills if c.sample]
        rids = [c.request_id for c in sample_chunks]
        batch_rows = self.batch.rows(rids)
        decode_blocks: list[Sequence[int]] = [c.block_ids for c in decodes]
        positions = [c.start_pos for c in decodes]
        plan = StepPlan(decode_blocks, positions, [Chunk(c.block_ids, c.start_pos, len(c.token_ids)) for c in prefills])
        if decodes:  # their tables from the persistent batch: only blocks new since the last step are copied
            width = -(-(max(positions) + 1) // self.config.kv_block_size)
            plan.decode_table, plan.decode_table_lens = self.batch.tables(
                batch_rows[: len(decodes)], decode_blocks, width, self.config.num_kv_blocks
            )
        # Prompt chunks that arrived packed (int32 views) are cast as arrays, never one Python int per token.
        token_ids = step_token_ids([c.token_ids[0] for c in decodes], [c.token_ids for c in prefills])
        last = plan.last_rows()
        rows = list(range(len(decodes))) + [r for r, c in zip(last, prefills, strict=True) if c.sample]
        every_row = len(rows) == plan.n_rows  # a pure decode step: no row selection
        batch, (ids, row_idx) = self.model.stage(plan, token_ids, [] if every_row else rows, buffers=self.step_buffers)
        x = self.model.embed(ids)  # [N, dim]
        at = plan.n_decode
        for c in prefills:
            images = self.states[c.request_id].images
            if images:
                splice_images(x[at : at + len(c.token_ids)], c.start_pos, images)
            at += len(c.token_ids)
        logits = self.model.forward_step(x, batch, None if every_row else row_idx)
        if not sample_chunks:
            return {}, {}
        suppress = [(i, c.suppress_token_ids) for i, c in enumerate(sample_chunks) if c.suppress_token_ids]
        cols = self.batch.columns(batch_rows, suppress)
        if self.special_ids:  # the few rows that need their state: bias lists, token history
            for i, c in enumerate(sample_chunks):
                if c.request_id in self.special_ids:
                    row = self._sample_row(c)
                    if row.params.logit_bias:
                        cols.biased[i] = row
                    if uses_penalties(row.params):
                        cols.penalized[i] = row
        tokens = self.sampler.sample_columns(logits, cols)
        wanted = self.logprob_ids
        asked = [i for i, c in enumerate(sample_chunks) if c.request_id in wanted] if wanted else []
        logprobs: dict[str, Logprobs] = {}
        if asked:
            at_rows = torch.tensor(asked, device=logits.device)
            ks = [self.states[sample_chunks[i].request_id].params.logprobs or 0 for i in asked]
            found = top_logprobs(logits[at_rows], tokens[at_rows], ks, self.config.vocab_size)
            logprobs = {sample_chunks[i].request_id: lp for i, lp in zip(asked, found, strict=True)}
        picked = self.stager.fetch_array(tokens)
        # Where each sampled row's token is fed next: the decode's position + 1, or its chunk's end.
        ends = np.concatenate(
            [
                np.asarray(plan.decode_positions, dtype=np.int64) + 1,
                np.array([ch.end for ch, c in zip(plan.chunks, prefills, strict=True) if c.sample], dtype=np.int64),
            ]
        )
        self.batch.record(batch_rows, picked, ends)
        return dict(zip(rids, picked.tolist(), strict=True)), logprobs

    def _sample_row(self, c: ScheduledChunk) -> SampleRow:
        st = self.states[c.request_id]
        if st.output_ids is None:  # default penalties: no history to keep
            return SampleRow(st.params, st.generator, c.suppress_token_ids, bias=st.bias)
        # The history holds the output tokens fed so far: a decode feeds the newest (the scheduler's
        # record of it); a preempted request's recompute chunk may end with outputs it has not seen.
        missing = c.start_pos + len(c.token_ids) - len(st.prompt_ids or ()) - len(st.output_ids)
        if missing > 0:
            st.output_ids.extend(int(t) for t in c.token_ids[len(c.token_ids) - missing :])
        return SampleRow(
            st.params,
            st.generator,
            c.suppress_token_ids,
            prompt_token_ids=st.prompt_ids,
            output_token_ids=st.output_ids,
            bias=st.bias,
        )


def limits_info(config: EngineConfig) -> dict[str, Any]:
    """The engine's admission limits, for its info dict (both executors)."""
    return {
        "max_num_seqs": config.max_num_seqs,
        # The tokenizer's vocabulary (what the sampler draws from; the LM head is at least as wide).
        "vocab_size": config.vocab_size,
        "max_model_len": config.max_model_len,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "long_prefill_token_threshold": config.long_prefill_token_threshold,
        # What the paged KV cache holds (num_kv_blocks x kv_block_size) ...
        "kv_cache_tokens": config.kv_capacity,
        "kv_cache_tokens_set": config.kv_cache_tokens is not None,
        # ... and what that allows at the worst case of a whole max_model_len each.
        "max_seqs_at_max_model_len": min(config.max_num_seqs, config.kv_capacity // config.max_model_len),
        "kv_block_size": config.kv_block_size,
        "prefix_caching": config.prefix_caching,
    }


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


@dataclass
class _SimState:
    key: int
    avoid: set[int]
    logprobs: int | None = None  # the request's SamplingParams.logprobs


class SimExecutor:
    """No model: a step takes the time ``harness.engine.step_time`` models for it (``sim_step_model``;
    the default, ``linear``, is ``sim_step_fixed_ms + sim_step_per_token_ms * tokens``), on a modelled
    GPU of its own, a thread (``harness.engine.sim_gpu``): ``launch`` returns at once with a handle.

    Tokens are a deterministic hash of (seed, request id, image checksums,
    position) in [0, vocab_size), never the request's EOS id (nor, before
    min_tokens, a suppressed id). Image payloads are still read (converted to
    pixels and summed once per request), so a codec can't win by not
    delivering them.
    """

    def __init__(self, config: EngineConfig) -> None:
        if config.vocab_size < 2:
            raise ValueError("SimExecutor needs vocab_size >= 2 to avoid the EOS id")
        self.config = config
        self.states: dict[str, _SimState] = {}
        self.step_time = step_time_model(config.sim_step_model, config.sim_step_fixed_ms, config.sim_step_per_token_ms)
        self.device = SimDevice()  # the modelled GPU: a worker thread that runs launched steps in order

    def info(self) -> dict[str, Any]:
        return {
            "executor": "sim",
            "sim_step_model": self.step_time.name,
            "sim_step_fixed_ms": self.step_time.fixed_ms,
            "sim_step_per_token_ms": self.step_time.per_token_ms,
            "sim_step_description": self.step_time.describe(),
            **limits_info(self.config),
        }

    def _new_state(self, nr: NewRequest) -> _SimState:
        key = zlib.crc32(nr.request_id.encode()) ^ (self.config.seed << 32)
        for item in nr.request.mm_inputs or []:
            key = _splitmix64(key ^ zlib.crc32(to_pixels(item).numpy().tobytes()))
        eos_ids = {t for t in (nr.request.eos_token_id, self.config.eos_token_id) if t is not None}
        return _SimState(key, eos_ids, nr.request.sampling_params.logprobs)

    def _token(self, st: _SimState, position: int, suppress: list[int] | None) -> int:
        vocab = self.config.vocab_size
        tok = _splitmix64(st.key + position) % vocab
        avoid = st.avoid | set(suppress or ())
        if len(avoid) >= vocab:
            return tok
        while tok in avoid:
            tok = (tok + 1) % vocab
        return tok

    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        """Launch the step and wait for it: the engine loop in series."""
        return self.launch(sched).wait()

    def launch(self, sched: SchedulerOutput, continuous: bool = False) -> StepHandle[ModelRunnerOutput]:
        """Hand the step to the modelled GPU (``harness.engine.sim_gpu``) and return at once.

        The host does what a real executor's host does before a launch (per-request state, the
        step's shape); the tokens are drawn on the device thread and known only through the
        handle. ``continuous``: the engine had work since the previous step ended. The modelled
        time starts as the call does: the fitted step times include the host's input preparation.
        """
        launched_ns = time.monotonic_ns()
        # Cached tokens attention reads: a walk over the step's chunks, only for a model that charges them.
        context = sum(c.start_pos + len(c.token_ids) for c in sched.chunks) if self.step_time.kv_ms_per_token else 0
        duration_s = self.step_time.step_ms(sched.total_num_tokens, context) / 1e3
        errors: dict[str, str] = {}
        for rid in sched.finished_req_ids:
            self.states.pop(rid, None)
        for nr in sched.new_requests:
            try:
                self.states[nr.request_id] = self._new_state(nr)
            except Exception as exc:  # bad payload: fail this request, not the step
                errors[nr.request_id] = _error_text(exc)
        rows = []
        for c in sched.chunks:
            st = self.states.get(c.request_id)
            if c.sample and st is not None:
                rows.append((c.request_id, st, c.start_pos + len(c.token_ids), c.suppress_token_ids))

        def sample() -> ModelRunnerOutput:
            vocab = self.config.vocab_size
            sampled = {}
            logprobs = {}
            for rid, st, position, suppress in rows:
                tok = sampled[rid] = self._token(st, position, suppress)
                if st.logprobs is not None:
                    logprobs[rid] = sim_logprobs(tok, st.logprobs, st.key + position, vocab)
            return ModelRunnerOutput(sampled, errors, duration_s, logprobs=logprobs)

        return self.device.launch(duration_s, sample, continuous, launched_ns)

    def device_stats(self) -> DeviceStats:
        """The modelled GPU's busy and idle time so far."""
        return self.device.stats
