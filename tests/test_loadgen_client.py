"""The streaming request function: SSE parsing, token counting, and every failure kept, never raised."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator

import aiohttp
import pytest

from harness.loadgen.client import (
    CHAT_COMPLETIONS,
    COMPLETIONS,
    RequestRecord,
    SSEDecoder,
    build_payload,
    encode_payload,
    failure_key,
    send_request,
)
from harness.workloads.datasets import user_message
from harness.workloads.sample import SampleRequest

from fake_openai_server import FakeConfig, FakeOpenAIServer

TTFT, GAP = 0.05, 0.01


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(FakeConfig(ttft_s=TTFT, token_gap_s=GAP)) as srv:
        yield srv


@pytest.fixture(scope="module")
def server_2tok() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(FakeConfig(ttft_s=TTFT, token_gap_s=GAP, tokens_per_chunk=2)) as srv:
        yield srv


def _send(
    base_url: str,
    prompt: str,
    *,
    endpoint: str = COMPLETIONS,
    max_tokens: int = 6,
    continuous: bool = True,
    timeout_s: float | None = 10.0,
) -> RequestRecord:
    sample = SampleRequest(prompt=prompt, prompt_len=3, expected_output_len=max_tokens)
    body = encode_payload(build_payload(sample, "fake-model", endpoint, continuous_usage=continuous))
    record = RequestRecord(0, 3, max_tokens, 0.0)

    async def go() -> RequestRecord:
        async with aiohttp.ClientSession() as session:
            return await send_request(
                session,
                base_url + endpoint,
                body,
                record,
                origin=0.0,
                chat=endpoint == CHAT_COMPLETIONS,
                timeout_s=timeout_s,
            )

    return asyncio.run(go())


# --- SSE parsing ----------------------------------------------------------------------


def test_sse_decoder_handles_split_lines_crlf_comments_and_multiline_data() -> None:
    dec = SSEDecoder()
    assert dec.feed(b'data: {"a"') == []
    assert dec.feed(b": 1}\r\n\r\n: keep-alive\n\nevent: x\ndata: one\ndata: two\n\ndata:[DONE]") == [
        '{"a": 1}',
        "one\ntwo",
    ]
    assert dec.flush() == ["[DONE]"]


def test_payloads() -> None:
    sample = SampleRequest("hi", 1, 7, ("data:image/png;base64,AAAA",))
    chat = build_payload(sample, "m", CHAT_COMPLETIONS)
    assert chat["messages"][0]["content"] == [
        {"type": "text", "text": "hi"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]
    assert chat["max_tokens"] == 7 and chat["ignore_eos"] is True and chat["stream"] is True
    assert chat["temperature"] == 0.0
    assert chat["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert json.loads(encode_payload(chat)) == chat
    with pytest.raises(ValueError, match="chat"):
        build_payload(sample, "m", COMPLETIONS)
    # Text-only chat content is the plain string datasets.chat_prompt_len counted.
    text_only = build_payload(SampleRequest("hi", 1, 3), "m", CHAT_COMPLETIONS)
    assert text_only["messages"] == [user_message("hi")] == [{"role": "user", "content": "hi"}]
    plain = build_payload(SampleRequest("hi", 1, 3), "m", COMPLETIONS, continuous_usage=False)
    assert plain["prompt"] == "hi" and plain["stream_options"] == {"include_usage": True}


# --- successful streams ---------------------------------------------------------------


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT_COMPLETIONS])
def test_success_records_every_chunk(server: FakeOpenAIServer, endpoint: str) -> None:
    rec = _send(server.base_url, "hello there", endpoint=endpoint, max_tokens=6)
    assert rec.success, rec.error
    assert rec.error == ""
    assert rec.output_tokens == 6
    assert rec.chunk_tokens == [1] * 6
    assert rec.usage_per_chunk
    assert rec.prompt_tokens == 2
    assert rec.generated_text == " t0 t1 t2 t3 t4 t5"
    assert rec.ttft == rec.chunk_times[0] >= TTFT
    assert rec.latency >= rec.chunk_times[-1] >= TTFT + 5 * GAP
    assert rec.chunk_times == sorted(rec.chunk_times)


def test_two_token_chunks_are_counted_from_usage(server_2tok: FakeOpenAIServer) -> None:
    rec = _send(server_2tok.base_url, "x", max_tokens=7)
    assert rec.success, rec.error
    assert rec.chunk_tokens == [2, 2, 2, 1]
    assert rec.output_tokens == 7


def test_without_per_chunk_usage_each_chunk_is_one_token_and_the_total_comes_from_final_usage(
    server_2tok: FakeOpenAIServer,
) -> None:
    rec = _send(server_2tok.base_url, "x", max_tokens=6, continuous=False)
    assert rec.success, rec.error
    assert not rec.usage_per_chunk
    assert rec.chunk_tokens == [1, 1, 1]
    assert rec.output_tokens == 6  # the final usage chunk wins


# --- failures: kept, never raised -------------------------------------------------------


def test_http_error_keeps_status_and_body(server: FakeOpenAIServer) -> None:
    rec = _send(server.base_url, "FAIL500")
    assert not rec.success
    assert rec.error.startswith("HTTP 500")
    assert "injected failure" in rec.error
    assert (rec.status, rec.error_message) == (500, "injected failure")
    assert failure_key(rec) == (500, "injected failure")


@pytest.mark.parametrize(
    "marker, expected",
    [
        ("CUTSTREAM", "payload"),  # aiohttp: "Response payload is not completed"
        ("NODONE", "before data: [DONE]"),
        ("BADJSON", "malformed SSE data"),
        ("ERROREVENT", "engine died"),
    ],
)
def test_broken_streams_fail_with_their_error(server: FakeOpenAIServer, marker: str, expected: str) -> None:
    rec = _send(server.base_url, marker)
    assert not rec.success
    assert expected.lower() in rec.error.lower()


def test_connection_refused_is_an_error_not_an_exception() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rec = _send(f"http://127.0.0.1:{port}", "hi")
    assert not rec.success
    assert rec.error.startswith("connection failed")
    assert failure_key(rec) == (0, rec.error)  # no response: counted under what went wrong


def test_timeout_is_an_error(server: FakeOpenAIServer) -> None:
    rec = _send(server.base_url, "slow", timeout_s=TTFT / 2)
    assert not rec.success
    assert rec.error.startswith("timeout after")


@pytest.mark.parametrize("chat", [False, True])
def test_the_typed_chunk_decode_reads_every_chunk_as_the_generic_json_path_does(chat: bool) -> None:
    from harness.loadgen import client as client_mod

    key = "delta" if chat else "text"

    def piece(text: object) -> dict:
        return {"delta": {"content": text}} if chat else {"text": text}

    events = [
        {"id": "cmpl-1", "choices": [{**piece(""), "index": 0}]},  # role-only / empty
        {"id": "cmpl-1", "choices": [piece("Hel")], "usage": {"prompt_tokens": 7, "completion_tokens": 1}},
        {"id": "cmpl-2", "choices": [piece("lo")], "usage": {"prompt_tokens": 7, "completion_tokens": 3}},
        {"choices": [piece(None)], "usage": {"completion_tokens": 3.0}},  # a float: the generic path
        {"choices": [{key: None}], "usage": None, "extra": [1, {"x": 2}]},
        {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}},
    ]

    def fold(force_generic: bool) -> client_mod.RequestRecord:
        rec = client_mod.RequestRecord(index=0, prompt_len=7, expected_output_len=4, planned_send=0.0)
        state = client_mod._StreamState(rec, chat)
        for i, ev in enumerate(events):
            data = json.dumps(ev)
            if force_generic:
                state._generic(data, float(i))
            else:
                state.event(data, float(i))
        state.event("[DONE]", 9.0)
        state.finish()
        return rec

    typed, generic = fold(False), fold(True)
    assert typed == generic
    assert typed.generated_text == "Hello" and typed.output_tokens == 4 and typed.server_id == "cmpl-1"
    assert typed.chunk_tokens == [1, 2] and typed.prompt_tokens == 7


def test_an_error_chunk_still_fails_the_stream_with_its_type() -> None:
    from harness.loadgen import client as client_mod

    rec = client_mod.RequestRecord(index=0, prompt_len=1, expected_output_len=1, planned_send=0.0)
    state = client_mod._StreamState(rec, False)
    with pytest.raises(client_mod.StreamError, match="server error in stream"):
        state.event(json.dumps({"error": {"message": "boom", "type": "internal_error"}}), 0.0)
    assert rec.error_type == "internal_error"


def test_an_error_key_even_null_and_a_malformed_choice_take_the_old_path() -> None:
    from harness.loadgen import client as client_mod

    rec = client_mod.RequestRecord(index=0, prompt_len=1, expected_output_len=1, planned_send=0.0)
    state = client_mod._StreamState(rec, False)
    with pytest.raises(client_mod.StreamError, match="server error in stream"):
        state.event(json.dumps({"error": None, "choices": [{"text": "x"}]}), 0.0)
    with pytest.raises(AttributeError):  # send_request records it as the request's failure
        client_mod._StreamState(rec, False).event(json.dumps({"choices": ["x"]}), 0.0)
    with pytest.raises(TypeError):
        client_mod._StreamState(rec, False).event(json.dumps({"choices": [{"text": 5}]}), 0.0)
