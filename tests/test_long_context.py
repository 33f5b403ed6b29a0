"""Prompt-size bounds follow the served context: a trace-length prompt is served when it fits.

Production prompts reach 126-191k tokens. On `bench serve --executor sim --max-model-len 131072` a
~120k-token prompt must be served; one over the context, or over the byte bound derived from it,
gets a 400 with an OpenAI-style body. The bounds themselves (FrontendSettings) are checked
without a server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from harness.engine.config import EngineConfig
from harness.frontend.settings import (
    FrontendSettings,
    json_elements_for,
    prompt_bytes_for,
    request_bytes_for,
)
from harness.tokenizers.tokenizer import load_tokenizer

from serve_process import MODEL, ServeProcess, post, start_serve

CONTEXT = 131_072
OLD_PROMPT_BYTES = 256 * 1024  # the fixed bound that refused every 64k and 120k trace prompt
OLD_JSON_ELEMENTS = 65_536
WORD = "hello "  # the embedded tokenizer: one token a word, 6 bytes a token


def repeated_words(tokens: int) -> str:
    return WORD * tokens


# --- the bounds, derived ---------------------------------------------------------------------------


def test_the_prompt_bounds_follow_the_context() -> None:
    long, short = FrontendSettings(max_model_len=CONTEXT), FrontendSettings(max_model_len=2_048)
    for settings in (long, short):
        n = settings.max_model_len
        assert settings.max_prompt_bytes == prompt_bytes_for(n)
        assert settings.max_request_bytes == request_bytes_for(prompt_bytes_for(n))
        assert settings.max_json_elements == json_elements_for(n)
        assert settings.limits().max_prompt_tokens == n
    # A 120k-token prompt of 6-byte tokens, and 120k token ids as JSON, fit the long context's bounds.
    assert len(repeated_words(120_000).encode()) <= long.max_prompt_bytes
    assert len(json.dumps({"prompt": [131_071] * 120_000})) <= long.max_request_bytes
    assert long.max_json_elements > 120_000
    # Each grows with the context.
    assert long.max_prompt_bytes > short.max_prompt_bytes > 0
    assert long.max_request_bytes > short.max_request_bytes
    assert long.max_json_elements > short.max_json_elements


def test_a_given_bound_replaces_the_derived_one() -> None:
    s = FrontendSettings(max_model_len=CONTEXT, max_prompt_bytes=1_000, max_json_elements=50)
    assert (s.max_prompt_bytes, s.max_json_elements) == (1_000, 50)
    assert s.max_request_bytes == request_bytes_for(1_000)  # the body's bound follows the prompt's
    assert FrontendSettings(max_request_bytes=7_000).max_request_bytes == 7_000
    with pytest.raises(ValueError, match="max_prompt_bytes"):
        FrontendSettings(max_prompt_bytes=0)


def test_settings_from_the_engine_derive_from_its_context() -> None:
    s = FrontendSettings.from_engine_config(EngineConfig(max_model_len=CONTEXT), max_prompt_bytes=None)
    assert s.max_prompt_bytes == prompt_bytes_for(CONTEXT)
    # An override of the context itself is seen by the derived bounds too.
    s = FrontendSettings.from_engine_config(EngineConfig(), max_model_len=CONTEXT)
    assert s.max_json_elements == json_elements_for(CONTEXT)


# --- a real server with a 131,072-token context -----------------------------------------------------


@pytest.fixture(scope="module")
def long_server() -> Iterator[ServeProcess]:
    server = start_serve("--executor", "sim", "--max-model-len", str(CONTEXT), codec="msgspec-packed")
    yield server
    server.stop()


async def stream_completion(base_url: str, body: dict[str, Any]) -> tuple[int, list[Any]]:
    """(status, each SSE event parsed: a dict, or the string "[DONE]")."""
    url = f"{base_url}/v1/completions"
    async with aiohttp.ClientSession() as session, session.post(url, json={**body, "stream": True}) as resp:
        raw = (await resp.read()).decode()
    events: list[Any] = []
    for block in raw.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return resp.status, events


def assert_openai_error(status: int, body: Any, want_status: int, words: str) -> None:
    assert status == want_status, body
    error = body["error"]
    assert error["code"] == want_status and error["type"] == "invalid_request_error", body
    assert words in error["message"], body


def test_a_120k_token_prompt_streams_to_its_end(long_server: ServeProcess) -> None:
    prompt = repeated_words(120_000)
    tokens = len(load_tokenizer().encode(prompt))
    assert 119_000 <= tokens <= CONTEXT - 4, tokens
    assert len(prompt.encode()) > OLD_PROMPT_BYTES  # what the fixed byte bound refused
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "stream_options": {"include_usage": True}}
    status, events = asyncio.run(stream_completion(long_server.base_url, body))
    assert status == 200, events
    assert events[-1] == "[DONE]"
    finishes = [e["choices"][0]["finish_reason"] for e in events[:-1] if isinstance(e, dict) and e["choices"]]
    assert finishes[-1] == "length"
    usage = events[-2]["usage"]
    assert usage["prompt_tokens"] == tokens and usage["completion_tokens"] == 4, usage


def test_a_120k_token_id_prompt_is_served(long_server: ServeProcess) -> None:
    ids = [7] * 120_000  # more JSON elements than the fixed bound allowed
    assert len(ids) > OLD_JSON_ELEMENTS
    body = {"model": MODEL, "prompt": ids, "max_tokens": 4}
    status, out = asyncio.run(post(long_server.base_url, "/v1/completions", body))
    assert status == 200, out
    assert out["usage"]["prompt_tokens"] == 120_000 and out["choices"][0]["finish_reason"] == "length", out


def test_a_prompt_over_the_context_gets_the_400(long_server: ServeProcess) -> None:
    prompt = repeated_words(140_000)  # under the byte bound, over the context in tokens
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
    status, out = asyncio.run(post(long_server.base_url, "/v1/completions", body))
    assert_openai_error(status, out, 400, f"maximum context length is {CONTEXT} tokens")
    status, out = asyncio.run(post(long_server.base_url, "/v1/completions", {**body, "prompt": [7] * (CONTEXT + 1)}))
    assert_openai_error(status, out, 400, f"over this model's context of {CONTEXT}")


def test_a_prompt_over_the_byte_bound_is_refused_before_tokenizing(long_server: ServeProcess) -> None:
    limit = prompt_bytes_for(CONTEXT)
    body = {"model": MODEL, "prompt": "x" * (limit + 1), "max_tokens": 4}
    status, out = asyncio.run(post(long_server.base_url, "/v1/completions", body))
    assert_openai_error(status, out, 400, f"over the limit of {limit} bytes")
    assert "--max-prompt-bytes" in out["error"]["message"]
    # The server still serves after the refusals.
    small = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    status, out = asyncio.run(post(long_server.base_url, "/v1/completions", small))
    assert status == 200, out


# --- tekken's chat encoding is bounded before it runs ---------------------------------------------


def test_tekken_chat_over_the_byte_bound_is_refused_before_it_is_encoded(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mistral_common")
    from aiohttp.test_utils import TestClient, TestServer

    from harness.frontend.app import build_app
    from harness.tokenizers.tekken import TekkenTokenizer

    from fake_engine import FakeEngine

    tok = load_tokenizer("tekken")
    assert isinstance(tok, TekkenTokenizer)
    encoded: list[int] = []
    encode_chat = tok.encode_chat

    def counted(messages: Any) -> Any:
        encoded.append(len(messages))
        return encode_chat(messages)

    monkeypatch.setattr(tok, "encode_chat", counted)
    settings = FrontendSettings(max_model_len=64)

    async def go() -> list[tuple[int, Any]]:
        app = build_app(FakeEngine(tok.encode("ok")), tok, settings)
        async with TestClient(TestServer(app)) as client:
            out = []
            for text in ("x" * (settings.max_prompt_bytes + 1), "hi"):
                body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 2}
                resp = await client.post("/v1/chat/completions", json=body)
                out.append((resp.status, await resp.json()))
            return out

    (big_status, big), (small_status, small) = asyncio.run(go())
    assert_openai_error(big_status, big, 400, "bytes")
    assert small_status == 200, small
    assert encoded == [1]  # only the small request reached tekken's encoder
