"""One prepared request of a workload, shared by dataset loaders and the load generator."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SampleRequest:
    # The text prompt (for the chat endpoint: the user message's text part).
    prompt: str
    # Prompt length in tokens, counted with the server's tokenizer.
    prompt_len: int
    # max_tokens to ask for (sent with ignore_eos so the output has this length).
    expected_output_len: int
    # Images as data URLs (data:image/png;base64,...), encoded before the clock starts.
    image_data_urls: tuple[str, ...] = field(default_factory=tuple)
    # What /v1/completions receives, if not ``prompt``: for sonnet the
    # chat-formatted prompt, as benchmark_serving sends completion backends
    # (``prompt_len`` counts that text).
    completion_prompt: str | None = None
    # The chat messages to send instead of one user message of ``prompt`` (custom's "messages" lines).
    messages: tuple[dict[str, Any], ...] | None = None
    # Planned send time in seconds from the first request, for a dataset that carries its own
    # arrivals (trace timestamps); when every request has one they replace --request-rate's schedule.
    arrival_s: float | None = None
