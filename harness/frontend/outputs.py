"""The engine's outputs become OpenAI responses: detokenize, apply stop strings, build chunks.

``Relay`` turns each ``EngineCoreOutput`` into the text it adds (incremental
detokenization, then stop strings, which are a frontend matter: the engine
only knows token ids). ``stream`` yields one SSE chunk per engine output and
``collect`` builds the whole non-streaming response; both raise the engine
client's errors and leave turning them into HTTP statuses or SSE error
events to the app (``harness.frontend.app``), which holds the one table.

A stream keeps only what it has still to send: each chunk's text and logprobs
are dropped once yielded, the stop-string filter holds only the unsent tail and
the detokenizer a short window, so its memory does not grow with its length.
Only ``collect``, which builds the response at the end, keeps the whole text
and every token's logprobs.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from harness.frontend.errors import EngineRequestError, RequestRejectedError
from harness.frontend.inputs import Prepared
from harness.frontend.logprobs import LogprobsRenderer
from harness.tokenizers.tokenizer import TextTokenizer
from harness.wire.messages import EngineCoreOutput, FinishReason


class IncompleteOutputError(EngineRequestError):
    """The engine's outputs ended before the request finished (a server-side error)."""


# --- stop strings ------------------------------------------------------------------


class StopMatcher:
    """An Aho–Corasick automaton over the stop strings, fed one character at a time.

    Its state is the longest tail of the text fed so far that begins some stop string, so
    the text to hold back and whether a stop string just ended are known in O(1) per
    character: the work per token is linear in the token's text, whatever the number and
    length of the stop strings (which the protocol bounds anyway). Built once per request.
    """

    def __init__(self, stops: list[str]) -> None:
        self._goto: list[dict[str, int]] = [{}]
        self._depth = [0]
        ends = [0]  # length of a stop string ending exactly at the node (0: none)
        for stop in stops:
            node = 0
            for ch in stop:
                nxt = self._goto[node].get(ch)
                if nxt is None:
                    nxt = len(self._goto)
                    self._goto[node][ch] = nxt
                    self._goto.append({})
                    self._depth.append(self._depth[node] + 1)
                    ends.append(0)
                node = nxt
            ends[node] = len(stop)
        self._fail = [0] * len(self._goto)
        # The longest stop string ending at a node, its own or one along the failure links: the
        # longest one has the earliest start.
        self._match = list(ends)
        queue = list(self._goto[0].values())
        for node in queue:
            for ch, nxt in self._goto[node].items():
                queue.append(nxt)
                f = self._fail[node]
                while f and ch not in self._goto[f]:
                    f = self._fail[f]
                self._fail[nxt] = self._goto[f].get(ch, 0) if self._goto[f].get(ch, 0) != nxt else 0
                self._match[nxt] = ends[nxt] or self._match[self._fail[nxt]]
        self.state = 0

    def feed(self, ch: str) -> int:
        """Advance by one character; the length of the stop string that ends here (0: none)."""
        node = self.state
        while node and ch not in self._goto[node]:
            node = self._fail[node]
        node = self._goto[node].get(ch, 0)
        self.state = node
        return self._match[node]

    @property
    def partial(self) -> int:
        """How many characters at the end of the text could still begin a stop string."""
        return self._depth[self.state]


class StopStringFilter:
    """Applies stop strings to streamed text, holding back what could still start one.

    ``push`` returns the text that is safe to send now. A tail of the text that
    is the beginning of a stop string is held back until it is clear whether
    the stop string follows; ``final=True`` releases it. The text stops where the first
    stop string to be completed ends (the longest, so the earliest starting, of those that
    end there); it is cut before that string and ``stopped`` names it.

    ``keep_text=False`` (a stream) forgets text once it is sent: only the held-back
    tail stays, at most as long as the longest stop string, and ``text`` is unavailable.
    """

    def __init__(self, stops: list[str], keep_text: bool = True) -> None:
        self._stops = [s for s in stops if s]
        self._matcher = StopMatcher(self._stops) if self._stops else None
        self._keep = keep_text
        self._text = ""  # what is held back, after the sent text when it is kept
        self._sent = 0
        self.stopped: str | None = None

    @property
    def text(self) -> str:
        """Everything sent so far (the final output once finished)."""
        if not self._keep:
            raise RuntimeError("this filter forgets sent text (keep_text=False)")
        return self._text[: self._sent]

    def _send(self, end: int) -> str:
        """The text up to ``end`` not sent yet; marks it sent (and forgets it when not kept)."""
        out = self._text[self._sent : end]
        if self._keep:
            self._sent = end
        else:
            self._text, self._sent = self._text[end:], 0
        return out

    def push(self, new_text: str, final: bool = False) -> str:
        if self.stopped is not None:
            return ""
        start = len(self._text)
        self._text += new_text
        matcher = self._matcher
        if matcher is not None:
            for i, ch in enumerate(new_text):
                length = matcher.feed(ch)
                if length:
                    end = start + i + 1
                    # The stop string is still held back (the matcher's partial tail), so not yet forgotten.
                    self.stopped = self._text[end - length : end]
                    self._text = self._text[: end - length]
                    return self._send(len(self._text))
        if final or matcher is None:
            end = len(self._text)
        else:
            end = max(self._sent, len(self._text) - matcher.partial)
        return self._send(end)


# --- responses ---------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def now() -> int:
    return int(time.time())


def completion_chunk(
    rid: str,
    model: str,
    created: int,
    text: str,
    finish_reason: str | None = None,
    stop_reason: int | str | None = None,
    usage_: dict | None = None,
    logprobs: dict | None = None,
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason, "stop_reason": stop_reason}
        ],
    }
    if usage_ is not None:
        chunk["usage"] = usage_
    return chunk


def chat_chunk(
    rid: str,
    model: str,
    created: int,
    text: str,
    first: bool,
    finish_reason: str | None = None,
    stop_reason: int | str | None = None,
    usage_: dict | None = None,
    logprobs: dict | None = None,
) -> dict[str, Any]:
    delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
            }
        ],
    }
    if usage_ is not None:
        chunk["usage"] = usage_
    return chunk


def usage_chunk(rid: str, model: str, created: int, chat: bool, usage_: dict) -> dict[str, Any]:
    """The last chunk with ``include_usage``: empty choices, the totals."""
    return {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_,
    }


def full_response(
    rid: str,
    model: str,
    created: int,
    chat: bool,
    text: str,
    finish_reason: str | None,
    stop_reason: int | str | None,
    usage_: dict,
    logprobs: dict | None = None,
) -> dict[str, Any]:
    """A non-streaming completion or chat completion; they differ only in how text is held."""
    held = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
    choice = {"index": 0, **held, "logprobs": logprobs, "finish_reason": finish_reason, "stop_reason": stop_reason}
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage_,
    }


# --- the relay -------------------------------------------------------------------


class Relay:
    """Engine outputs in, text pieces out: detokenize, apply stop strings, count tokens."""

    def __init__(self, tokenizer: TextTokenizer, prep: Prepared) -> None:
        # Only a response built at the end needs the whole text and every token's logprobs.
        keep = not prep.stream
        self.detok = tokenizer.incremental()
        self.filter = StopStringFilter(prep.stops, keep_text=keep)
        self.prompt_tokens = len(prep.request.prompt_token_ids)
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        asked = prep.request.sampling_params.logprobs is not None
        self.logprobs = LogprobsRenderer(tokenizer, prep.chat, keep_all=keep) if asked else None
        self.chunk_logprobs: dict | None = None  # the last output's, in the response's shape

    def add(self, out: EngineCoreOutput) -> str:
        """The text this output adds; sets finish_reason when the request is done."""
        # The engine client normally raises these itself; be safe if it does not.
        if out.finish_reason == FinishReason.REJECTED:
            raise RequestRejectedError(out.error or "the engine refused the request")
        if out.finish_reason == FinishReason.ERROR:
            raise EngineRequestError(out.error or "the engine failed serving the request")
        self.completion_tokens += len(out.new_token_ids)
        if self.logprobs is not None:
            self.chunk_logprobs = self.logprobs.render(out.new_logprobs)
        text = self.detok.add(out.new_token_ids)
        if out.finished:
            text += self.detok.flush()
        piece = self.filter.push(text, final=out.finished)
        if self.filter.stopped is not None:
            self.finish_reason, self.stop_reason = "stop", self.filter.stopped
        elif out.finished:
            reason = out.finish_reason.value if out.finish_reason is not None else "stop"
            self.finish_reason, self.stop_reason = reason, out.stop_reason
        return piece

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def usage(self) -> dict[str, int]:
        return usage(self.prompt_tokens, self.completion_tokens)


async def stream(
    prep: Prepared, relay: Relay, first: EngineCoreOutput, outputs: AsyncIterator[EngineCoreOutput]
) -> AsyncIterator[dict[str, Any]]:
    """One chunk per engine output, then the usage chunk if asked; raises on an engine error."""
    created = now()
    rid = prep.request.request_id
    out: EngineCoreOutput | None = first
    is_first = True
    while out is not None:
        text = relay.add(out)
        usage_ = relay.usage() if prep.options.continuous_usage_stats else None
        reason, stop, lp = relay.finish_reason, relay.stop_reason, relay.chunk_logprobs
        if prep.chat:
            yield chat_chunk(rid, prep.model, created, text, is_first, reason, stop, usage_, lp)
        else:
            yield completion_chunk(rid, prep.model, created, text, reason, stop, usage_, lp)
        is_first = False
        if relay.done:
            break
        out = await anext(outputs, None)
    if not relay.done:
        raise IncompleteOutputError("the engine ended the request without finishing it")
    if prep.options.include_usage:
        yield usage_chunk(rid, prep.model, created, prep.chat, relay.usage())


async def collect(
    prep: Prepared, relay: Relay, first: EngineCoreOutput, outputs: AsyncIterator[EngineCoreOutput]
) -> dict[str, Any]:
    """The whole non-streaming response body; raises on an engine error."""
    out: EngineCoreOutput | None = first
    while out is not None:
        relay.add(out)
        if relay.done:
            break
        out = await anext(outputs, None)
    if not relay.done:
        raise IncompleteOutputError("the engine ended the request without finishing it")
    return full_response(
        prep.request.request_id,
        prep.model,
        now(),
        prep.chat,
        relay.filter.text,
        relay.finish_reason,
        relay.stop_reason,
        relay.usage(),
        relay.logprobs.all if relay.logprobs is not None else None,
    )
