"""Executors: run one scheduled step and return the sampled tokens.

``TorchExecutor`` runs the model of ``harness.engine.model`` (plus the vision encoder
and sampler); ``SimExecutor`` runs no model and only spends the time a step is
modelled to take. Both take a ``SchedulerOutput`` and return a
``ModelRunnerOutput``, so the engine loop does not know which it has.

Per-request state (sampling params, seeded generator, image embeddings and,
only for requests with penalties, their token history) is created the first
time a request appears in ``new_requests`` and dropped when its id shows up
in ``finished_req_ids``. A request whose inputs can't be processed (say, an
image that fails to decode) is reported in ``ModelRunnerOutput.errors``
instead of failing the step for everyone.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from harness.engine.config import EngineConfig
from harness.engine.device import resolve_device, resolve_dtype, synchronize
from harness.engine.model import build_model, get_model_config
from harness.engine.sampler import Sampler, SampleRow, uses_penalties
from harness.engine.step import ModelRunnerOutput, NewRequest, ScheduledChunk, SchedulerOutput
from harness.engine.vision import build_vision_encoder, to_pixels
from harness.messages import SamplingParams


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


class TorchExecutor:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        if self.device.type == "cpu":
            torch.set_num_threads(config.num_threads)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.model_config = get_model_config(config.model_preset, config.vocab_size)
        self.model = build_model(
            self.model_config, config.max_num_seqs, config.max_model_len, self.device, self.dtype, config.seed
        )
        self.vision = build_vision_encoder(
            self.model_config.vision_dim,
            self.model_config.dim,
            config.image_tokens,
            self.device,
            self.dtype,
            config.seed + 1,
        )
        self.sampler = Sampler(config.vocab_size, config.seed, self.device)
        self.states: dict[str, _TorchState] = {}
        synchronize(self.device)

    def info(self) -> dict[str, Any]:
        return {
            "executor": "torch",
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "model_preset": self.config.model_preset,
            "model": asdict(self.model_config),
            "num_params": sum(p.numel() for p in self.model.parameters()),
            "torch_threads": torch.get_num_threads(),
            "torch_version": torch.__version__,
        }

    def _new_state(self, nr: NewRequest) -> _TorchState:
        params = nr.request.sampling_params
        st = _TorchState(params, self.sampler.request_generator(params))
        if uses_penalties(params):
            st.prompt_ids, st.output_ids = nr.request.prompt_token_ids, []
        for item, pr in zip(nr.request.mm_inputs or [], nr.request.mm_placeholders or [], strict=True):
            st.images.append((pr.offset, self.vision.encode(item)))  # computed once per request
        return st

    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        t0 = time.perf_counter()
        errors: dict[str, str] = {}
        with torch.inference_mode():
            for rid in sched.finished_req_ids:
                self.states.pop(rid, None)
            for nr in sched.new_requests:
                try:
                    self.states[nr.request_id] = self._new_state(nr)
                except Exception as exc:  # bad payload: fail this request, not the step
                    errors[nr.request_id] = _error_text(exc)

            logit_rows: list[Tensor] = []
            sample_chunks: list[ScheduledChunk] = []
            decodes = [c for c in sched.decodes if c.request_id in self.states]
            if decodes:
                dev = self.device
                tokens = torch.tensor([c.token_ids[0] for c in decodes], device=dev)
                slots = torch.tensor([c.slot for c in decodes], device=dev)
                positions = torch.tensor([c.start_pos for c in decodes], device=dev)
                logit_rows.append(self.model.decode(self.model.embed(tokens), slots, positions))  # [B, V]
                sample_chunks.extend(decodes)
            for c in sched.prefills:
                st = self.states.get(c.request_id)
                if st is None:
                    continue
                x = self.model.embed(torch.tensor(c.token_ids, device=self.device))  # [T, dim]
                splice_images(x, c.start_pos, st.images)
                last = self.model.prefill(x, c.slot, c.start_pos)  # [V]
                if c.sample:
                    logit_rows.append(last[None])
                    sample_chunks.append(c)

            rows = [self._sample_row(c) for c in sample_chunks]
            tokens_out = self.sampler.sample(torch.cat(logit_rows), rows) if rows else []
            synchronize(self.device)
        sampled = {c.request_id: t for c, t in zip(sample_chunks, tokens_out, strict=True)}
        return ModelRunnerOutput(sampled, errors, time.perf_counter() - t0)

    def _sample_row(self, c: ScheduledChunk) -> SampleRow:
        st = self.states[c.request_id]
        if st.output_ids is None:  # default penalties: no history to keep
            return SampleRow(st.params, st.generator, c.suppress_token_ids)
        # A chunk past the prompt is a decode, which feeds the newest output
        # token (the scheduler's record of it); prefill chunks hold prompt only.
        if c.start_pos >= len(st.prompt_ids or ()):
            st.output_ids.append(c.token_ids[0])
        return SampleRow(
            st.params,
            st.generator,
            c.suppress_token_ids,
            prompt_token_ids=st.prompt_ids,
            output_token_ids=st.output_ids,
        )


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def wait_until(deadline: float) -> None:
    """Sleep until ``perf_counter() >= deadline``, to within ~0.1 ms.

    Coarse ``time.sleep`` first, then a spin that still yields the GIL
    (``sleep(0)``) so the engine's socket threads keep running, as they would
    while torch computes.
    """
    while True:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            return
        if remaining > 1e-3:
            time.sleep(remaining - 8e-4)
        else:
            time.sleep(0)


@dataclass
class _SimState:
    key: int
    avoid: set[int]


class SimExecutor:
    """No model: a step takes ``sim_step_fixed_ms + sim_step_per_token_ms * tokens``.

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

    def info(self) -> dict[str, Any]:
        return {
            "executor": "sim",
            "sim_step_fixed_ms": self.config.sim_step_fixed_ms,
            "sim_step_per_token_ms": self.config.sim_step_per_token_ms,
        }

    def _new_state(self, nr: NewRequest) -> _SimState:
        key = zlib.crc32(nr.request_id.encode()) ^ (self.config.seed << 32)
        for item in nr.request.mm_inputs or []:
            key = _splitmix64(key ^ zlib.crc32(to_pixels(item).numpy().tobytes()))
        eos_ids = {t for t in (nr.request.eos_token_id, self.config.eos_token_id) if t is not None}
        return _SimState(key, eos_ids)

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
        t0 = time.perf_counter()
        cfg = self.config
        deadline = t0 + (cfg.sim_step_fixed_ms + cfg.sim_step_per_token_ms * sched.total_num_tokens) / 1e3
        errors: dict[str, str] = {}
        for rid in sched.finished_req_ids:
            self.states.pop(rid, None)
        for nr in sched.new_requests:
            try:
                self.states[nr.request_id] = self._new_state(nr)
            except Exception as exc:  # bad payload: fail this request, not the step
                errors[nr.request_id] = _error_text(exc)
        sampled = {}
        for c in sched.chunks:
            st = self.states.get(c.request_id)
            if c.sample and st is not None:
                sampled[c.request_id] = self._token(st, c.start_pos + len(c.token_ids), c.suppress_token_ids)
        wait_until(deadline)
        return ModelRunnerOutput(sampled, errors, time.perf_counter() - t0)
