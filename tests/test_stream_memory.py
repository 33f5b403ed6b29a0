"""A stream keeps only what it has still to send: its memory does not grow with its length.

Long streams with top-20 logprobs used to keep every token's entries (and the whole text, and
every token id) until they ended. A response built at the end (not streamed) still gets all.
"""

from __future__ import annotations

import asyncio
import random
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.frontend import outputs
from harness.frontend.inputs import Prepared
from harness.frontend.logprobs import LogprobsRenderer
from harness.frontend.outputs import StopStringFilter
from harness.frontend.protocol import StreamOptions
from harness.tokenizers.tokenizer import load_tokenizer
from harness.wire.messages import EngineCoreOutput, EngineCoreRequest, FinishReason, Logprobs, SamplingParams

TOP = 20
IDS = range(300)  # a few hundred distinct ids: the shared token-text cache is warm early on


def _prep(stream: bool, max_tokens: int, chat: bool = False) -> Prepared:
    params = SamplingParams(max_tokens=max_tokens, logprobs=TOP)
    request = EngineCoreRequest("r", None, [1, 2, 3], params, None, 0.0)
    return Prepared(request=request, chat=chat, stream=stream, options=StreamOptions(), model="m")


def _engine_outputs(n: int, seed: int = 7) -> list[EngineCoreOutput]:
    """``n`` one-token outputs with top-20 logprobs each, the last one finished."""
    rng = random.Random(seed)
    outs = []
    for i in range(n):
        ids = rng.sample(IDS, TOP + 1)
        lp = Logprobs(token_ids=[ids], logprobs=[[-0.1 * k for k in range(TOP + 1)]], ranks=[1])
        last = i == n - 1
        outs.append(
            EngineCoreOutput(
                "r", [ids[0]], finished=last, finish_reason=FinishReason.LENGTH if last else None, new_logprobs=lp
            )
        )
    return outs


async def _rest(outs: list[EngineCoreOutput]) -> AsyncIterator[EngineCoreOutput]:
    for out in outs:
        yield out


def test_a_streamed_relay_holds_o1_logprobs_whatever_the_stream_length() -> None:
    tok = load_tokenizer()
    outs = _engine_outputs(3_000)
    prep = _prep(stream=True, max_tokens=len(outs))
    relay = outputs.Relay(tok, prep)
    traced: dict[int, int] = {}

    async def run() -> None:
        n = 0
        async for chunk in outputs.stream(prep, relay, outs[0], _rest(outs[1:])):
            assert len(chunk["choices"][0]["logprobs"]["top_logprobs"]) == 1  # this chunk's token only
            del chunk  # written: the app keeps nothing of it
            n += 1
            if n in (500, 3_000):
                traced[n] = tracemalloc.get_traced_memory()[0]

    tracemalloc.start()
    try:
        asyncio.run(run())
    finally:
        tracemalloc.stop()
    # 2,500 more tokens of 20 alternatives each: kept, they took ~3 MB; forgotten, next to nothing.
    assert traced[3_000] - traced[500] < 64 * 1024, traced
    assert relay.logprobs is not None and relay.logprobs.all is None
    assert len(relay.detok.token_ids) <= 300  # a window, not every id of the stream


async def _streamed(prep: Prepared, relay: outputs.Relay, outs: list[EngineCoreOutput]) -> tuple[str, dict]:
    """The text and the logprobs a client gets from the chunks, joined."""
    text, entries = "", dict[str, list[Any]]()
    async for chunk in outputs.stream(prep, relay, outs[0], _rest(outs[1:])):
        choice = chunk["choices"][0]
        text += choice["delta"]["content"] if prep.chat else choice["text"]
        for key, values in choice["logprobs"].items():
            entries.setdefault(key, []).extend(values)
    return text, entries


@pytest.mark.parametrize("chat", [False, True])
def test_streamed_pieces_and_logprobs_are_what_collect_returns_whole(chat: bool) -> None:
    tok = load_tokenizer()
    outs = _engine_outputs(700, seed=3)
    streamed = _prep(stream=True, max_tokens=len(outs), chat=chat)
    text, entries = asyncio.run(_streamed(streamed, outputs.Relay(tok, streamed), outs))
    whole = _prep(stream=False, max_tokens=len(outs), chat=chat)
    full = asyncio.run(outputs.collect(whole, outputs.Relay(tok, whole), outs[0], _rest(outs[1:])))
    choice = full["choices"][0]
    assert (choice["message"]["content"] if chat else choice["text"]) == text
    assert choice["logprobs"] == entries  # every token's, as the stream sent them
    assert len(entries["content" if chat else "tokens"]) == len(outs)


def test_a_renderer_keeps_all_only_when_asked() -> None:
    tok = load_tokenizer()
    lp = Logprobs(token_ids=[[5, 6, 7]], logprobs=[[-0.1, -0.2, -0.3]], ranks=[1])
    kept, streamed = LogprobsRenderer(tok, chat=False), LogprobsRenderer(tok, chat=False, keep_all=False)
    for _ in range(3):
        assert kept.render(lp) == streamed.render(lp)
    assert kept.all is not None and len(kept.all["tokens"]) == 3
    assert streamed.all is None


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abc", max_size=40),
    stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=5), max_size=4),
    cuts=st.lists(st.integers(0, 40), max_size=8),
)
def test_a_forgetting_stop_filter_sends_the_same_and_holds_at_most_a_stop_string(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    keeping, forgetting = StopStringFilter(stops), StopStringFilter(stops, keep_text=False)
    longest = max((len(s) for s in stops), default=0)
    start = 0
    for cut in sorted({min(c, len(text)) for c in cuts}) + [len(text)]:
        final = cut == len(text)
        assert forgetting.push(text[start:cut], final) == keeping.push(text[start:cut], final)
        assert len(forgetting._text) <= longest  # only what could still begin a stop string
        start = cut
    assert forgetting.stopped == keeping.stopped


def test_the_detokenizer_of_a_long_stream_keeps_a_window() -> None:
    tok = load_tokenizer()
    ids = tok.encode("The quick brown fox jumps over the lazy dog, again and again. " * 200)
    det = tok.incremental()
    pieces, most = [], 0
    for i in ids:
        pieces.append(det.add([i]))
        most = max(most, len(det.token_ids))
    pieces.append(det.flush())
    assert "".join(pieces) == tok.decode(ids)
    assert len(ids) > 1_000 and most <= 300
