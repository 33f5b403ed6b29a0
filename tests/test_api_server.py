"""The OpenAI-compatible frontend against an in-process fake engine.

The fake (tests/fake_engine.py) isolates the HTTP layer; the real engine and
transport are covered by the end-to-end tests.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import functools
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import torch
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from harness.engine.config import EngineConfig
from harness.frontend.app import build_app
from harness.frontend.images import PixelBudget
from harness.frontend.inputs import FALLBACK_IMAGE_TOKEN_ID
from harness.frontend.outputs import StopStringFilter
from harness.frontend.protocol import ProtocolError
from harness.frontend.settings import FrontendSettings
from harness.server_metrics import prometheus
from harness.tokenizers.tokenizer import load_tokenizer
from harness.wire.messages import EngineCoreOutput, EngineCoreRequest, FinishReason
from harness.workloads.images import synthetic_image, to_data_url

from fake_engine import FakeEngine

TOK = load_tokenizer()
MODEL = "wirebench-tiny"
TEXT = "Hello world. The end of it all."
SCRIPT = TOK.encode(TEXT)  # what the fake engine "generates", one token per output


def arun(fn):
    """Run an async test function in a fresh event loop."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(asyncio.wait_for(fn(*args, **kwargs), timeout=30))

    return wrapper


@contextlib.asynccontextmanager
async def serve(engine: FakeEngine | None = None, tokenizer=TOK, **settings: Any) -> AsyncIterator[TestClient]:
    app = build_app(engine or FakeEngine(SCRIPT), tokenizer, FrontendSettings(**settings))
    async with TestClient(TestServer(app)) as client:
        yield client


def sse_events(raw: str) -> list[Any]:
    """The data payloads of an SSE body: parsed JSON, or the string "[DONE]"."""
    events = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def png_url(seed: int = 0, size: int = 24) -> str:
    return to_data_url(synthetic_image(size, size, seed), "png")


def chat_body(*parts: dict, **extra: Any) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": list(parts)}], **extra}


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def text_part(text: str) -> dict:
    return {"type": "text", "text": text}


def assert_error(status: int, body: dict, want_status: int, param: str | None = None) -> None:
    assert status == want_status, body
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert err["code"] == want_status and isinstance(err["type"], str)
    if param is not None:
        assert err["param"] == param


# --- non-streaming -------------------------------------------------------------------


@arun
async def test_completion_non_streaming_forwards_sampling_fields():
    engine = FakeEngine(SCRIPT)
    async with serve(engine) as client:
        body = {
            "model": MODEL,
            "prompt": "Shall I compare thee",
            "max_tokens": len(SCRIPT),
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 5,
            "min_p": 0.05,
            "seed": 42,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "repetition_penalty": 1.1,
            "stop_token_ids": [999],
            "ignore_eos": True,
            "min_tokens": 2,
            "user": "ignored-extra-field",
        }
        resp = await client.post("/v1/completions", json=body)
        out = await resp.json()
    assert resp.status == 200, out
    assert out["object"] == "text_completion" and out["model"] == MODEL and out["id"].startswith("cmpl-")
    choice = out["choices"][0]
    assert choice["text"] == TEXT and choice["finish_reason"] == "length"
    prompt_ids = TOK.encode("Shall I compare thee")
    assert out["usage"] == {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": len(SCRIPT),
        "total_tokens": len(prompt_ids) + len(SCRIPT),
    }
    (req,) = engine.requests
    assert isinstance(req, EngineCoreRequest)
    assert req.request_id == out["id"] and req.prompt == "Shall I compare thee"
    assert req.prompt_token_ids == prompt_ids and req.eos_token_id == TOK.eos_token_id
    sp = req.sampling_params
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.seed) == (
        len(SCRIPT),
        0.7,
        0.9,
        5,
        0.05,
        42,
    )
    assert (sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty) == (0.5, -0.5, 1.1)
    assert sp.stop_token_ids == [999] and sp.ignore_eos and sp.min_tokens == 2 and sp.n == 1
    assert req.mm_inputs is None and req.arrival_time > 0
    assert engine.aborted == [] and engine.closed_early == []


@arun
async def test_token_id_prompt_and_default_max_tokens():
    engine = FakeEngine(SCRIPT)
    async with serve(engine, max_model_len=40) as client:
        resp = await client.post("/v1/completions", json={"prompt": [10, 11, 12]})  # model may be omitted
        out = await resp.json()
        assert resp.status == 200, out
        assert engine.requests[-1].prompt is None and engine.requests[-1].prompt_token_ids == [10, 11, 12]
        assert engine.requests[-1].sampling_params.max_tokens == 16  # OpenAI's default
        # Near the end of the context the default shrinks to what fits.
        resp = await client.post("/v1/completions", json={"model": MODEL, "prompt": list(range(10, 40))})
        assert resp.status == 200
        assert engine.requests[-1].sampling_params.max_tokens == 10
        resp = await client.post("/v1/completions", json={"model": MODEL, "prompt": [[10, 11]]})
        assert resp.status == 200 and engine.requests[-1].prompt_token_ids == [10, 11]


@arun
async def test_chat_non_streaming():
    engine = FakeEngine(SCRIPT)
    async with serve(engine) as client:
        body = {
            "model": MODEL,
            "max_completion_tokens": 4,
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        }
        resp = await client.post("/v1/chat/completions", json=body)
        out = await resp.json()
    assert resp.status == 200, out
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    message = out["choices"][0]["message"]
    assert message["role"] == "assistant" and message["content"] == TOK.decode(SCRIPT[:4])
    req = engine.requests[0]
    assert req.prompt == TOK.apply_chat_template(body["messages"])  # type: ignore[arg-type]
    assert req.prompt_token_ids == TOK.encode(req.prompt)
    assert req.sampling_params.max_tokens == 4 and out["usage"]["completion_tokens"] == 4


# --- streaming ------------------------------------------------------------------------


@arun
async def test_completion_streaming_with_continuous_usage():
    async with serve() as client:
        body = {
            "model": MODEL,
            "prompt": "Once",
            "max_tokens": len(SCRIPT),
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        resp = await client.post("/v1/completions", json=body)
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        events = sse_events(await resp.text())
    assert events[-1] == "[DONE]"
    *chunks, final = events[:-1]
    assert len(chunks) == len(SCRIPT)  # one chunk per engine output
    assert "".join(c["choices"][0]["text"] for c in chunks) == TEXT
    assert [c["usage"]["completion_tokens"] for c in chunks] == list(range(1, len(SCRIPT) + 1))
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(SCRIPT) - 1) + ["length"]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == len(SCRIPT)
    assert final["usage"]["prompt_tokens"] == len(TOK.encode("Once"))


@arun
async def test_streaming_without_usage_options_has_no_usage():
    async with serve() as client:
        resp = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "Once", "max_tokens": 3, "stream": True}
        )
        events = sse_events(await resp.text())
    assert events[-1] == "[DONE]" and len(events) == 4
    assert all("usage" not in e for e in events[:-1])


@arun
async def test_chat_streaming_first_chunk_has_role():
    async with serve() as client:
        body = {
            **chat_body(text_part("Hi")),
            "max_tokens": 5,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        resp = await client.post("/v1/chat/completions", json=body)
        events = sse_events(await resp.text())
    assert events[-1] == "[DONE]"
    *chunks, final = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks) and chunks[0]["id"].startswith("chatcmpl-")
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:])
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == TOK.decode(SCRIPT[:5])
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert final["object"] == "chat.completion.chunk" and final["choices"] == []
    assert final["usage"]["completion_tokens"] == 5


# --- stop conditions ---------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("stop,want", [(" end", "Hello world. The"), (["zzz", "ld. T"], "Hello wor")])
@arun
async def test_stop_strings_truncate_and_abort(stream, stop, want):
    engine = FakeEngine(SCRIPT)
    async with serve(engine) as client:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 50, "stop": stop, "stream": stream}
        resp = await client.post("/v1/completions", json=body)
        if stream:
            events = sse_events(await resp.text())
            assert events[-1] == "[DONE]"
            text = "".join(e["choices"][0]["text"] for e in events[:-1])
            last = events[-2]["choices"][0]
        else:
            out = await resp.json()
            text, last = out["choices"][0]["text"], out["choices"][0]
    assert text == want
    assert last["finish_reason"] == "stop" and last["stop_reason"] in ([stop] if isinstance(stop, str) else stop)
    rid = engine.requests[0].request_id
    # The engine was still generating: the frontend must have stopped it.
    assert engine.aborted == [rid] and engine.closed_early == [rid]
    assert engine.requests[0].sampling_params.stop == ([stop] if isinstance(stop, str) else stop)


def test_stop_string_filter_holds_back_partial_matches():
    f = StopStringFilter(["STOP"])
    assert f.push("abcS") == "abc"  # "S" might begin "STOP"
    assert f.push("T") == ""
    assert f.push("x") == "STx"  # it did not
    assert f.push("yST") == "y"
    assert f.push("OPz") == "" and f.stopped == "STOP"
    assert f.push("more", final=True) == "" and f.text == "abcSTxy"
    g = StopStringFilter([])
    assert g.push("abc") == "abc" and g.text == "abc"
    h = StopStringFilter(["xyz", "xq"])
    assert h.push("abx") == "ab" and h.push("y") == "" and h.push("", final=True) == "xy"
    # Stop string spanning three pushes, earliest of two matches wins.
    k = StopStringFilter(["cde", "de"])
    assert k.push("abc") == "ab" and k.push("d") == "" and k.push("ef") == "" and k.text == "ab"
    assert k.stopped == "cde"


def _cut_reference(text: str, stops: list[str]) -> tuple[str, str | None]:
    """Brute force: the text before the first stop string to be completed (the longest ending there)."""
    for end in range(1, len(text) + 1):
        ending = [s for s in stops if s and text[:end].endswith(s)]
        if ending:
            stop = max(ending, key=len)
            return text[: end - len(stop)], stop
    return text, None


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abc", max_size=40),
    stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=5), max_size=4),
    cuts=st.lists(st.integers(0, 40), max_size=8),
)
def test_stop_string_filter_matches_a_brute_force_reference(text: str, stops: list[str], cuts: list[int]) -> None:
    f = StopStringFilter(stops)
    sent, start = "", 0
    for cut in sorted({min(c, len(text)) for c in cuts}) + [len(text)]:
        sent += f.push(text[start:cut], final=cut == len(text))
        start = cut
    want, stop = _cut_reference(text, stops)
    assert sent == want and f.text == want and f.stopped == stop


def test_stop_string_work_per_token_does_not_grow_with_the_stop_strings() -> None:
    # 60 stop strings of 10,000 characters froze the event loop for seconds with the old filter.
    stops = [("x" * 9_999) + chr(0x100 + i) for i in range(60)]
    f = StopStringFilter(stops)
    sent = "".join(f.push("xxxx") for _ in range(2_500))  # 10,000 x: all but the last 9,999 go out
    assert f.stopped is None and sent == "x"
    assert f.push(chr(0x101)) == "" and f.stopped == "x" * 9_999 + chr(0x101) and f.text == "x"


@arun
async def test_eos_and_stop_token_ids_finish_with_stop():
    eos = TOK.eos_token_id
    engine = FakeEngine([SCRIPT[0], SCRIPT[1], eos, SCRIPT[2]])
    async with serve(engine) as client:
        out = await (await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 10})).json()
        assert out["choices"][0]["finish_reason"] == "stop" and out["choices"][0]["text"] == TOK.decode(SCRIPT[:2])
        assert out["usage"]["completion_tokens"] == 3  # EOS counts, its text is skipped
        body = {"prompt": "x", "max_tokens": 4, "ignore_eos": True}
        out = await (await client.post("/v1/completions", json=body)).json()
        assert out["choices"][0]["finish_reason"] == "length" and out["usage"]["completion_tokens"] == 4
        body = {"prompt": "x", "max_tokens": 10, "stop_token_ids": [SCRIPT[1]]}
        out = await (await client.post("/v1/completions", json=body)).json()
        assert out["choices"][0]["finish_reason"] == "stop" and out["choices"][0]["stop_reason"] == SCRIPT[1]
    assert engine.aborted == []  # the engine finished each of them itself


# --- bad input -----------------------------------------------------------------------------

BAD_COMPLETIONS = [
    ({"model": "nope", "prompt": "x"}, 404, "model"),
    ({"model": MODEL}, 400, "prompt"),
    ({"prompt": 5}, 400, "prompt"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": ["a", "b"]}, 400, "prompt"),
    ({"prompt": [1, "a"]}, 400, "prompt"),
    ({"prompt": [1, 99999]}, 400, "prompt"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": True}, 400, "max_tokens"),
    ({"prompt": "x", "temperature": -0.1}, 400, "temperature"),
    ({"prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ({"prompt": "x", "top_k": -2}, 400, "top_k"),
    ({"prompt": "x", "min_p": 2}, 400, "min_p"),
    ({"prompt": "x", "presence_penalty": 3}, 400, "presence_penalty"),
    ({"prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty"),
    ({"prompt": "x", "n": 2}, 400, "n"),
    ({"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ({"prompt": "x", "logprobs": -1}, 400, "logprobs"),
    ({"prompt": "x", "logprobs": True}, 400, "logprobs"),
    ({"prompt": "x", "stop": 3}, 400, "stop"),
    ({"prompt": "x", "stop": [""]}, 400, "stop"),
    ({"prompt": "x", "stop_token_ids": [-1]}, 400, "stop_token_ids"),
    ({"prompt": "x", "stream": "yes"}, 400, "stream"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"prompt": "word " * 100, "max_tokens": 10}, 400, "max_tokens"),  # over max_model_len=64
    ({"prompt": "word " * 100}, 400, "prompt"),
    ([1, 2], 400, None),
]


@arun
async def test_bad_completion_requests_get_openai_errors():
    engine = FakeEngine(SCRIPT)
    async with serve(engine, max_model_len=64) as client:
        for body, status, param in BAD_COMPLETIONS:
            resp = await client.post("/v1/completions", json=body)
            assert_error(resp.status, await resp.json(), status, param)
        resp = await client.post("/v1/completions", data=b"{not json", headers={"Content-Type": "application/json"})
        assert_error(resp.status, await resp.json(), 400)
        metrics = prometheus.parse(await (await client.get("/metrics")).text())
    assert engine.requests == []
    rejected = metrics[(prometheus.REQUESTS, frozenset({("outcome", "rejected")}))]
    assert rejected == len(BAD_COMPLETIONS) + 1


BAD_CHATS = [
    {"model": MODEL, "messages": []},
    {"model": MODEL, "messages": "hi"},
    {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
    {"model": MODEL, "messages": [{"role": "user", "content": 5}]},
    chat_body({"type": "audio", "audio": "x"}),
    chat_body(image_part("https://example.com/cat.png")),
    chat_body({"type": "image_url", "image_url": {}}),
    chat_body(text_part("x"), max_completion_tokens=0),
    chat_body(image_part("data:image/png;base64,@@@not-base64@@@")),
    chat_body(image_part("data:image/png;base64," + base64.b64encode(b"plain text, no image").decode())),
    chat_body(image_part("data:text/plain;base64,aGVsbG8=")),
    chat_body(image_part("data:image/png,rawbytes")),
    chat_body(image_part(png_url(size=200))),  # over max_image_bytes below
    chat_body(*[image_part(png_url())] * 3),  # over max_images_per_request below
    chat_body(text_part("look: <|image|>")),  # marker typed into the text, no image sent
    chat_body(image_part(png_url()), max_tokens=60),  # 16 image tokens + template + 60 > 64
    chat_body(text_part("x"), logprobs=True, top_logprobs=21),  # over OpenAI's 20
    chat_body(text_part("x"), top_logprobs=2),  # top_logprobs without logprobs: true
    chat_body(text_part("x"), logprobs="yes"),
]


@arun
async def test_bad_chat_requests_and_images_get_400():
    engine = FakeEngine(SCRIPT)
    async with serve(engine, max_model_len=64, max_image_bytes=20_000, max_images_per_request=2) as client:
        for body in BAD_CHATS:
            resp = await client.post("/v1/chat/completions", json=body)
            out = await resp.json()
            assert_error(resp.status, out, 400)
    assert engine.requests == []


@arun
async def test_body_too_large_is_413():
    async with serve(max_request_bytes=1000) as client:
        resp = await client.post("/v1/completions", json={"prompt": "x" * 2000})
        assert_error(resp.status, await resp.json(), 413)


@arun
async def test_unknown_route_and_method_are_json():
    async with serve() as client:
        resp = await client.get("/v1/nothing")
        assert_error(resp.status, await resp.json(), 404)
        resp = await client.get("/v1/completions")
        assert_error(resp.status, await resp.json(), 405)


@arun
async def test_codec_rejection_is_400_with_its_message():
    engine = FakeEngine(SCRIPT, refuse_mm=lambda item: isinstance(item, Image.Image))
    async with serve(engine) as client:
        resp = await client.post("/v1/chat/completions", json=chat_body(image_part(png_url())))
        out = await resp.json()
        assert_error(resp.status, out, 400)
        assert "cannot carry" in out["error"]["message"]
        resp = await client.post("/v1/chat/completions", json=chat_body(text_part("no image")))
        assert resp.status == 200


class FailingEngine(FakeEngine):
    """An engine that fails while serving (a step error): the server's fault, not the client's."""

    async def generate(self, request: EngineCoreRequest, points=None):
        yield EngineCoreOutput(
            request.request_id,
            [],
            finished=True,
            finish_reason=FinishReason.ERROR,
            error="engine step failed: RuntimeError: boom",
        )


@arun
async def test_engine_failure_is_500_not_400():
    async with serve(FailingEngine(SCRIPT)) as client:
        resp = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
        out = await resp.json()
        assert resp.status == 500 and out["error"]["code"] == 500
        assert "engine step failed" in out["error"]["message"]
        resp = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3, "stream": True})
        events = sse_events(await resp.text())
        assert events[-1]["error"]["code"] == 500


# --- images -------------------------------------------------------------------------------------


def _check_placeholders(req: EngineCoreRequest, image_id: int, n: int, length: int, exclusive: bool = True) -> None:
    assert req.mm_placeholders is not None and len(req.mm_placeholders) == n
    ids = req.prompt_token_ids
    for pr in req.mm_placeholders:
        assert pr.length == length
        assert ids[pr.offset : pr.offset + pr.length] == [image_id] * length
    if exclusive:  # the image id appears nowhere else
        assert ids.count(image_id) == n * length
    ends = [p.offset + p.length for p in req.mm_placeholders]
    assert all(e <= o for e, o in zip(ends, [p.offset for p in req.mm_placeholders][1:]))


@arun
async def test_chat_with_images_pil_payload():
    engine = FakeEngine(SCRIPT)
    a, b = synthetic_image(40, 30, seed=1), synthetic_image(20, 20, seed=2)
    body = chat_body(
        text_part("Compare"),
        image_part(to_data_url(a, "png")),
        text_part("with"),
        image_part(to_data_url(b, "jpeg")),
        max_tokens=3,
    )
    async with serve(engine, image_tokens=5) as client:
        resp = await client.post("/v1/chat/completions", json=body)
        out = await resp.json()
    assert resp.status == 200, out
    req = engine.requests[0]
    assert [type(x) for x in req.mm_inputs] == [Image.Image, Image.Image]
    assert [x.size for x in req.mm_inputs] == [(40, 30), (20, 20)] and req.mm_inputs[0].mode == "RGB"
    assert req.mm_inputs[0].tobytes() == a.tobytes()  # PNG is lossless
    _check_placeholders(req, TOK.image_token_id, 2, 5)
    assert len(req.prompt_token_ids) == len(TOK.encode(req.prompt)) + 2 * (5 - 1)
    assert out["usage"]["prompt_tokens"] == len(req.prompt_token_ids)
    want_a = hashlib.sha256(b"RGB:40x30:" + a.tobytes()).hexdigest()
    assert req.mm_hashes[0] == want_a and len(req.mm_hashes[1]) == 64 and req.mm_hashes[1] != want_a


@arun
async def test_chat_with_image_tensor_payload():
    engine = FakeEngine(SCRIPT)
    async with serve(engine, mm_payload="tensor", image_tokens=4) as client:
        resp = await client.post("/v1/chat/completions", json=chat_body(image_part(png_url()), max_tokens=2))
        assert resp.status == 200, await resp.text()
        async with serve(engine, mm_payload="tensor", mm_tensor_size=32, mm_tensor_dtype="bfloat16") as small:
            resp = await small.post("/v1/chat/completions", json=chat_body(image_part(png_url()), max_tokens=2))
            assert resp.status == 200
    (item,) = engine.requests[0].mm_inputs
    pv = item["pixel_values"]
    assert isinstance(pv, torch.Tensor) and pv.shape == (1, 3, 336, 336) and pv.dtype == torch.float16
    assert -3 < float(pv.float().mean()) < 3  # normalised, not 0..255
    _check_placeholders(engine.requests[0], TOK.image_token_id, 1, 4)
    small_pv = engine.requests[1].mm_inputs[0]["pixel_values"]
    assert small_pv.shape == (1, 3, 32, 32) and small_pv.dtype == torch.bfloat16
    assert engine.requests[0].mm_hashes == engine.requests[1].mm_hashes  # same image, same hash


@arun
async def test_tokenizer_without_image_token_uses_fallback_id():
    plain = copy.copy(TOK)
    plain.image_token_id = None
    engine = FakeEngine(SCRIPT)
    async with serve(engine, tokenizer=plain, image_tokens=3) as client:
        resp = await client.post(
            "/v1/chat/completions", json=chat_body(text_part("a"), image_part(png_url()), max_tokens=2)
        )
        assert resp.status == 200, await resp.text()
    req = engine.requests[0]
    # The fallback id may also be a real token (here: BOS); the ranges say where the image goes.
    _check_placeholders(req, FALLBACK_IMAGE_TOKEN_ID, 1, 3, exclusive=False)
    assert TOK.image_token_id not in req.prompt_token_ids
    before, after = req.prompt.split("<|image|>")
    pr = req.mm_placeholders[0]
    assert req.prompt_token_ids == TOK.encode(before) + [FALLBACK_IMAGE_TOKEN_ID] * 3 + TOK.encode(after)
    assert pr.offset == len(TOK.encode(before))


@pytest.mark.parametrize("marker_token", [True, False])
@arun
async def test_a_packed_codec_gets_the_tokenizers_int32_array_with_the_same_ids(marker_token: bool):
    # An engine client whose codec packs ids (msgspec-packed) is handed the tokenizer's array, not a list:
    # the same ids and placeholder ranges as a list-carrying codec gets, for text and image prompts.
    tok = copy.copy(TOK)
    if not marker_token:  # a tokenizer without an image token: the text is split at the markers
        tok.image_token_id = None
    bodies = [
        ("/v1/completions", {"prompt": "Shall I compare thee to a summer's day?", "max_tokens": 2}),
        ("/v1/chat/completions", chat_body(text_part("Compare"), image_part(png_url()), text_part("it"), max_tokens=2)),
        ("/v1/chat/completions", chat_body(image_part(png_url()), image_part(png_url(1)), max_tokens=2)),
    ]
    got: dict[bool, list[EngineCoreRequest]] = {}
    for packed in (False, True):
        engine = FakeEngine(SCRIPT)
        engine.packed_token_ids = packed  # what ZmqEngineClient says of its codec
        async with serve(engine, tokenizer=tok, image_tokens=3) as client:
            for path, body in bodies:
                resp = await client.post(path, json=body)
                assert resp.status == 200, await resp.text()
        got[packed] = engine.requests
    for as_list, as_array in zip(got[False], got[True], strict=True):
        assert isinstance(as_list.prompt_token_ids, list)
        ids = as_array.prompt_token_ids
        assert isinstance(ids, np.ndarray) and ids.dtype == np.dtype("<i4") and ids.ndim == 1
        assert ids.tolist() == as_list.prompt_token_ids
        assert as_array.mm_placeholders == as_list.mm_placeholders


# --- disconnects and a dead engine ---------------------------------------------------------------


async def _read_events_then_leave(session_post, n: int) -> None:
    async with session_post as resp:
        assert resp.status == 200
        seen = 0
        async for line in resp.content:
            if line.startswith(b"data: "):
                seen += 1
            if seen >= n:
                return  # leaving the block closes the connection mid-stream


async def _wait_for(cond, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@arun
async def test_client_disconnect_aborts_request():
    engine = FakeEngine(SCRIPT, delay_s=0.02)
    async with serve(engine) as client:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 500, "stream": True}
        await _read_events_then_leave(client.post("/v1/completions", json=body), 3)
        await _wait_for(lambda: engine.aborted)
        rid = engine.requests[0].request_id
        assert engine.aborted == [rid] and engine.closed_early == [rid]
        await _wait_for(lambda: "aborted" in _outcomes_seen(client))
        metrics = prometheus.parse(await (await client.get("/metrics")).text())
    assert metrics[(prometheus.REQUESTS, frozenset({("outcome", "aborted")}))] == 1
    assert metrics[(prometheus.REQUESTS_RUNNING, frozenset())] == 0


def _outcomes_seen(client: TestClient) -> set[str]:
    from harness.frontend.app import METRICS

    return {k for k, v in client.app[METRICS].requests.items() if v}


@arun
async def test_client_disconnect_without_handler_cancellation():
    """What `bench serve` does if it runs the app without handler_cancellation: noticed on write."""
    engine = FakeEngine(SCRIPT, delay_s=0.02)
    runner = web.AppRunner(build_app(engine, TOK, FrontendSettings()), handler_cancellation=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    try:
        async with ClientSession() as session:
            body = {"model": MODEL, "prompt": "x", "max_tokens": 500, "stream": True}
            await _read_events_then_leave(session.post(f"http://127.0.0.1:{port}/v1/completions", json=body), 2)
        await _wait_for(lambda: engine.aborted)
        assert engine.aborted == engine.closed_early == [engine.requests[0].request_id]
    finally:
        await runner.cleanup()


@arun
async def test_dead_engine_is_503_and_unhealthy():
    engine = FakeEngine(SCRIPT)
    async with serve(engine) as client:
        assert (await client.get("/health")).status == 200
        engine.die("engine process exited")
        resp = await client.post("/v1/completions", json={"prompt": "x"})
        out = await resp.json()
        assert_error(resp.status, out, 503)
        assert "engine process exited" in out["error"]["message"]
        resp = await client.get("/health")
        assert resp.status == 503 and (await resp.json())["reason"] == "engine process exited"
        text = await (await client.get("/metrics")).text()
    assert prometheus.parse(text)[(prometheus.ENGINE_HEALTHY, frozenset())] == 0


@arun
async def test_requests_still_being_prepared_get_503_the_moment_the_engine_dies():
    """Image requests queued for the decoded-pixel budget (wait up to 10 s) and one whose body is still
    arriving are answered 503 as soon as the engine dies, not when their preparation would end."""
    engine = FakeEngine(SCRIPT, delay_s=0.05)
    side = 64
    async with serve(engine, max_inflight_pixels=side * side, max_request_pixels=side * side) as client:
        content = [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": png_url(0, side)}}]
        body = {"model": MODEL, "max_tokens": 50, "messages": [{"role": "user", "content": content}]}

        async def chat() -> int:
            resp = await client.post("/v1/chat/completions", json=body)
            return resp.status

        async def trickle():  # a body that never finishes arriving
            yield b'{"model": "'
            await asyncio.sleep(60)

        first = asyncio.ensure_future(chat())  # holds the whole budget until it is answered
        await _wait_for(lambda: engine.requests)
        queued = [asyncio.ensure_future(chat()) for _ in range(3)]
        slow = asyncio.ensure_future(
            client.post("/v1/completions", data=trickle(), headers={"Content-Type": "application/json"})
        )
        await asyncio.sleep(0.3)
        assert not any(t.done() for t in [*queued, slow])
        died = asyncio.get_running_loop().time()
        engine.die("engine process exited")
        statuses = await asyncio.gather(first, *queued)
        slow_resp = await slow
        took = asyncio.get_running_loop().time() - died
        assert statuses == [503] * 4 and slow_resp.status == 503, (statuses, slow_resp.status)
        assert took < 1.0, took
        assert "engine process exited" in (await slow_resp.json())["error"]["message"]
        text = await (await client.get("/metrics")).text()
    assert prometheus.parse(text)[(prometheus.REQUESTS, frozenset({("outcome", "failed")}))] == 5


@arun
async def test_engine_dies_mid_stream_sends_error_event():
    engine = FakeEngine(SCRIPT, die_after=3)
    async with serve(engine) as client:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 10, "stream": True}
        resp = await client.post("/v1/completions", json=body)
        assert resp.status == 200
        events = sse_events(await resp.text())
        assert "[DONE]" not in events
        assert [("error" in e) for e in events] == [False] * 3 + [True]
        assert events[-1]["error"]["code"] == 503
        # Non-streaming after death: a plain 503.
        resp = await client.post("/v1/completions", json={"prompt": "x"})
        assert resp.status == 503


@arun
async def test_engine_dies_during_non_streaming_request():
    engine = FakeEngine(SCRIPT, die_after=2)
    async with serve(engine) as client:
        resp = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 10})
        assert_error(resp.status, await resp.json(), 503)


# --- models, metrics, health --------------------------------------------------------------------------


@arun
async def test_models_lists_served_name():
    async with serve(served_model_name="my-model") as client:
        out = await (await client.get("/v1/models")).json()
        assert out["object"] == "list" and [m["id"] for m in out["data"]] == ["my-model"]
        assert (await client.post("/v1/completions", json={"model": "my-model", "prompt": "x"})).status == 200
        assert (await client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})).status == 404


@arun
async def test_metrics_names_and_movement():
    async with serve() as client:
        before = await (await client.get("/metrics")).text()
        resp = await client.post("/v1/completions", json={"prompt": "Once upon", "max_tokens": 4})
        assert resp.status == 200
        after = await (await client.get("/metrics")).text()
    for name in (
        prometheus.REQUESTS,
        prometheus.PROMPT_TOKENS,
        prometheus.GENERATION_TOKENS,
        prometheus.REQUESTS_RUNNING,
        prometheus.ENGINE_HEALTHY,
        prometheus.CODEC_INFO,
        prometheus.CODEC_MESSAGES,
        prometheus.CODEC_SECONDS,
        prometheus.CODEC_BYTES,
        prometheus.CODEC_FRAMES,
    ):
        assert f"# TYPE {name} " in after
    b, a = prometheus.parse(before), prometheus.parse(after)
    completed = (prometheus.REQUESTS, frozenset({("outcome", "completed")}))
    assert a[completed] - b[completed] == 1
    assert a[(prometheus.GENERATION_TOKENS, frozenset())] - b[(prometheus.GENERATION_TOKENS, frozenset())] == 4
    assert a[(prometheus.PROMPT_TOKENS, frozenset())] - b[(prometheus.PROMPT_TOKENS, frozenset())] == len(
        TOK.encode("Once upon")
    )
    assert a[(prometheus.CODEC_INFO, frozenset({("codec", "fake"), ("output_codec", "fake")}))] == 1
    cells_b, cells_a = prometheus.codec_cells(b), prometheus.codec_cells(a)
    assert cells_a[("request", "encode")].messages - cells_b[("request", "encode")].messages == 1
    assert cells_a[("output", "decode")].messages - cells_b[("output", "decode")].messages == 4


@arun
async def test_concurrent_streams_with_image_decoding():
    engine = FakeEngine(SCRIPT, delay_s=0.005)
    async with serve(engine, mm_payload="tensor") as client:

        async def text_stream() -> list:
            body = {"prompt": "x", "max_tokens": 8, "stream": True}
            return sse_events(await (await client.post("/v1/completions", json=body)).text())

        async def image_chat() -> int:
            resp = await client.post("/v1/chat/completions", json=chat_body(image_part(png_url(size=64)), max_tokens=2))
            return resp.status

        results = await asyncio.gather(text_stream(), image_chat(), text_stream(), image_chat())
    assert results[0][-1] == "[DONE]" and results[2][-1] == "[DONE]" and results[1] == results[3] == 200


def test_settings_follow_engine_config_and_validate():
    s = FrontendSettings.from_engine_config(
        EngineConfig(max_model_len=512, image_tokens=9, eos_token_id=7), mm_payload="tensor"
    )
    assert (s.max_model_len, s.image_tokens, s.eos_token_id, s.mm_payload) == (512, 9, 7, "tensor")
    with pytest.raises(ValueError):
        FrontendSettings(mm_payload="jpeg")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        FrontendSettings(mm_tensor_dtype="int8")
    with pytest.raises(ValueError):
        FrontendSettings(max_model_len=0)


# --- the official OpenAI client --------------------------------------------------------------------------


@arun
async def test_openai_client_streams_completion_and_chat():
    openai = pytest.importorskip("openai")
    async with serve() as client:
        api = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="none", max_retries=0)
        try:
            stream = await api.completions.create(
                model=MODEL,
                prompt="Shall I",
                max_tokens=len(SCRIPT),
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            texts, usage = [], None
            async for chunk in stream:
                if chunk.choices:
                    texts.append(chunk.choices[0].text)
                if chunk.usage is not None:
                    usage = chunk.usage
            assert "".join(texts) == TEXT and usage is not None and usage.completion_tokens == len(SCRIPT)
            chat = await api.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=3
            )
            assert chat.choices[0].message.content == TOK.decode(SCRIPT[:3])
            with pytest.raises(openai.BadRequestError):
                await api.completions.create(model=MODEL, prompt="x", max_tokens=0)
            with pytest.raises(openai.NotFoundError):
                await api.completions.create(model="nope", prompt="x")
        finally:
            await api.close()


# --- hostile input: bounds checked before the work they bound ------------------------------------

_IMAGE_PART = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
BOUNDS = [
    ("/v1/completions", {"prompt": "x", "stop": ["s"] * 17}, "--max-stop-strings"),
    ("/v1/completions", {"prompt": "x", "stop": ["s" * 4_000, "t" * 200]}, "--max-stop-chars"),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": list(range(65))}, "--max-stop-token-ids"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {str(i): 1.0 for i in range(1_025)}}, "--max-logit-bias"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}] * 1_025}, "--max-messages"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [_IMAGE_PART] * 9}]},  # counted before any is decoded
        "--max-images-per-request",
    ),
]


@arun
@pytest.mark.parametrize(("path", "body", "flag"), BOUNDS)
async def test_each_bound_is_a_400_naming_its_flag(path: str, body: dict, flag: str) -> None:
    engine = FakeEngine(SCRIPT)
    async with serve(engine) as client:
        resp = await client.post(path, json=body)
        out = await resp.json()
    assert resp.status == 400 and flag in out["error"]["message"], out
    assert engine.requests == []


@arun
async def test_expect_100_continue_is_refused_before_an_oversized_body_is_invited() -> None:
    """A declared 1 GiB body with ``Expect: 100-continue`` gets its 413 at once, never ``100 Continue``;
    a body within the limit is invited and served."""
    engine = FakeEngine(SCRIPT)
    async with serve(engine) as client:
        host, port = client.host, client.port

        async def exchange(length: int, body: bytes = b"") -> bytes:
            reader, writer = await asyncio.open_connection(host, port)
            head = (
                f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {length}\r\nExpect: 100-continue\r\n\r\n"
            )
            writer.write(head.encode())
            await writer.drain()
            first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            if body and first.startswith(b"HTTP/1.1 100"):
                writer.write(body)
                await writer.drain()
                first += await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            writer.close()
            return first

        refused = await exchange(1 << 30)
        assert refused.startswith(b"HTTP/1.1 413"), refused
        body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 2}).encode()
        served = await exchange(len(body), body)
        assert served.startswith(b"HTTP/1.1 100 Continue") and b"HTTP/1.1 200" in served, served
    assert len(engine.requests) == 1


@arun
async def test_a_body_over_the_byte_limit_is_a_413_naming_its_flag() -> None:
    engine = FakeEngine(SCRIPT)
    async with serve(engine, max_request_bytes=1_000) as client:
        resp = await client.post("/v1/completions", json={"prompt": "x" * 2_000})
        out = await resp.json()
    assert resp.status == 413 and "--max-request-bytes" in out["error"]["message"], out
    assert engine.requests == []


@arun
async def test_big_bodies_are_refused_before_they_are_parsed_or_walked() -> None:
    engine = FakeEngine(SCRIPT)
    async with serve(engine, max_model_len=64) as client:
        # 2 M token ids: counted by a byte scan, never parsed.
        resp = await client.post("/v1/completions", json={"prompt": list(range(2_000_000))})
        out = await resp.json()
        assert resp.status == 413 and "--max-json-elements" in out["error"]["message"], out
        # Under the element bound but longer than the context: refused by its length, not walked.
        resp = await client.post("/v1/completions", json={"prompt": list(range(1_000))})
        out = await resp.json()
        assert resp.status == 400 and "over this model's context of 64" in out["error"]["message"], out
        # A large image-sized string is one element: the element bound does not refuse it.
        resp = await client.post("/v1/completions", json={"prompt": "word " * 60_000})
        assert resp.status == 400 and "bytes" in (await resp.json())["error"]["message"]  # --max-prompt-bytes
    assert engine.requests == []


@arun
async def test_the_pixel_budget_queues_decoders_and_refuses_after_its_wait() -> None:
    budget = PixelBudget(100, wait_s=0.3)
    order: list[str] = []

    async def decode(name: str, pixels: int, hold_s: float) -> None:
        async with budget.hold(pixels):
            order.append(f"+{name}")
            await asyncio.sleep(hold_s)
            order.append(f"-{name}")

    # b waits for a's pixels (60 + 60 > 100), then runs: never both at once.
    await asyncio.gather(decode("a", 60, 0.1), decode("b", 60, 0.0))
    assert order == ["+a", "-a", "+b", "-b"] and budget.used == 0
    with pytest.raises(ProtocolError, match="--max-inflight-pixels") as refused:
        await asyncio.gather(decode("c", 80, 1.0), decode("d", 80, 0.0))
    assert refused.value.status == 503
    await asyncio.sleep(1.0)
    assert budget.used == 0


@arun
async def test_pixels_are_held_until_released_and_released_once() -> None:
    """A request holds its decoded pixels past decoding, until the engine has answered it."""
    budget = PixelBudget(100, wait_s=1.0)
    release = await budget.acquire(70)
    waiting = asyncio.ensure_future(budget.acquire(70))
    await asyncio.sleep(0.1)
    assert not waiting.done() and budget.used == 70
    release()
    release()  # a second call gives nothing back twice
    second = await asyncio.wait_for(waiting, 1.0)
    assert budget.used == 70
    second()
    assert budget.used == 0
