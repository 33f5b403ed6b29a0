"""The data one engine step passes between scheduler and executor.

The scheduler fills a ``SchedulerOutput`` (what to run this step), the
executor returns a ``ModelRunnerOutput`` (what it sampled), and the scheduler
turns that into the step's ``EngineCoreOutput`` messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from harness.wire.messages import EngineCoreRequest, Logprobs


@dataclass
class NewRequest:
    """A request the executor sees for the first time in this step."""

    request_id: str
    request: EngineCoreRequest
    slot: int
    max_tokens: int  # resolved (None in the request means up to max_model_len)


@dataclass
class ScheduledChunk:
    """One request's tokens in this step: ``token_ids`` at positions [start_pos, start_pos+len)."""

    request_id: str
    slot: int
    token_ids: Sequence[int]  # a list, or a slice of a packed int32 prompt (a numpy view)
    start_pos: int
    # True when the chunk reaches the end of the known tokens, so the step
    # produces this request's next token.
    sample: bool
    # Token ids the sampler must not pick (EOS / stop ids before min_tokens).
    suppress_token_ids: list[int] | None = None
    # The request's KV block table (harness.engine.kv_blocks), covering at least [0, start_pos+len):
    # the scheduler's own list, to read during this step only (it grows and is replaced later).
    block_ids: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    step_index: int
    new_requests: list[NewRequest] = field(default_factory=list)
    decodes: list[ScheduledChunk] = field(default_factory=list)  # one token each
    prefills: list[ScheduledChunk] = field(default_factory=list)
    # Requests finished or aborted since the last executed step: free their state.
    # The executor must handle these before new_requests (a slot may be reused).
    finished_req_ids: list[str] = field(default_factory=list)
    total_num_tokens: int = 0
    # Requests preempted in this step (their blocks freed; they recompute later, their executor state stays).
    preempted_req_ids: list[str] = field(default_factory=list)

    @property
    def chunks(self) -> list[ScheduledChunk]:
        return self.decodes + self.prefills


@dataclass
class ModelRunnerOutput:
    """What one executed step produced."""

    sampled_token_ids: dict[str, int] = field(default_factory=dict)
    # Requests the executor could not serve (e.g. an undecodable image): request_id -> why.
    errors: dict[str, str] = field(default_factory=dict)
    execute_time_s: float = 0.0
    # For requests that asked for logprobs (SamplingParams.logprobs): request_id -> the sampled token's.
    logprobs: dict[str, Logprobs] = field(default_factory=dict)
