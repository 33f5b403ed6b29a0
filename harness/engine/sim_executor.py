"""The ``sim`` executor: no model, each step only takes the time it is modelled to take.

Its steps run on a modelled GPU of their own (``harness.engine.device_thread``), so the engine loop
overlaps with them as it would with a real device (``harness.engine.overlap``).
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from typing import Any

from harness.engine.config import EngineConfig, limits_info
from harness.engine.device_thread import DeviceStats, DeviceThread, StepHandle
from harness.engine.executor import error_text
from harness.engine.logprobs import sim_logprobs
from harness.engine.step import ModelRunnerOutput, NewRequest, SchedulerOutput
from harness.engine.step_time import step_time_model
from harness.engine.vision import to_pixels


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
    GPU of its own, a thread (``harness.engine.device_thread``): ``launch`` returns at once with a handle.

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
        self.device = DeviceThread()  # the modelled GPU: a worker thread that runs launched steps in order
        self.overlap_pays = True  # the modelled GPU leaves the host free
        self.launches_in_series = True  # in series too: a step's span is the modelled GPU's

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
        """Hand the step to the modelled GPU (``harness.engine.device_thread``) and return at once.

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
                errors[nr.request_id] = error_text(exc)
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
