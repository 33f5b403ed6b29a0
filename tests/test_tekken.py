"""The production tokenizer: mistral-common's tekken behind the embedded tokenizer's interface."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("mistral_common")

from mistral_common.protocol.instruct.request import ChatCompletionRequest  # noqa: E402
from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy  # noqa: E402

from harness.engine.config import EngineConfig  # noqa: E402
from harness.frontend.app import build_app  # noqa: E402
from harness.frontend.settings import FrontendSettings  # noqa: E402
from harness.server_metrics import engine_info  # noqa: E402
from harness.tokenizers.tekken import TekkenTokenizer  # noqa: E402
from harness.tokenizers.tokenizer import load_tokenizer  # noqa: E402

from fake_engine import FakeEngine  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
UNICODE_TEXT = "café naïve; 日本語のテキスト, 中文; emoji 🙂🚀👩‍👩‍👧 🇳🇴; Ελληνικά, русский, العربية — “quotes” …\n"


@pytest.fixture(scope="module")
def tok() -> TekkenTokenizer:
    loaded = load_tokenizer("tekken")
    assert isinstance(loaded, TekkenTokenizer)
    return loaded


def sonnets(lines: int = 60) -> str:
    return "".join((ROOT / "datasets" / "sonnets.txt").read_text(encoding="utf-8").splitlines(True)[:lines])


def test_tekken_basics(tok: TekkenTokenizer) -> None:
    assert tok.name == "tekken" and tok.vocab_size == 131_072
    assert (tok.bos_token_id, tok.eos_token_id, tok.image_token_id) == (1, 2, 10)
    assert tok.special_token_ids == frozenset(range(1000))
    assert tok.decode([tok.bos_token_id, tok.eos_token_id], skip_special_tokens=False) == "<s></s>"


def test_round_trip_and_ids_above_65535(tok: TekkenTokenizer) -> None:
    text = sonnets() + UNICODE_TEXT * 3
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert max(ids) < tok.vocab_size and min(ids) >= 1000  # no specials in plain text
    assert sum(i > 65_535 for i in tok.encode(sonnets(200))) > 0  # ordinary English reaches past uint16
    arr = tok.encode_array(text)
    assert arr.dtype == np.dtype("<i4") and arr.tolist() == ids
    assert tok.encode_batch([text, "x"]) == [ids, tok.encode("x")]
    assert tok.encode("[INST]") != [3]  # special strings in a prompt stay text
    # decode's own path (the bytes table) gives what mistral-common's gives, invalid UTF-8 included.
    noise = [random.Random(1).randrange(1000, tok.vocab_size) for _ in range(300)] + [1000 + 0xF0]
    assert tok.decode(noise) == tok.tekken.decode(noise) and tok.decode(ids) == tok.tekken.decode(ids)


def test_chat_rendering_equals_mistral_commons_own(tok: TekkenTokenizer) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": [{"type": "text", "text": "One"}, {"type": "text", "text": "two"}]},
    ]
    text, ids, positions = tok.encode_chat(messages)
    theirs = tok.mistral.encode_chat_completion(ChatCompletionRequest(messages=messages))
    assert ids == theirs.tokens and positions == []
    assert text == tok.mistral.decode(theirs.tokens, SpecialTokenPolicy.KEEP) == tok.apply_chat_template(messages)
    assert text.startswith("<s>[INST]") and text.endswith("[/INST]")
    developer = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tok.encode_chat(developer)[1] == tok.encode_chat(messages[:2])[1]
    with pytest.raises(ValueError, match="mistral-common"):
        tok.encode_chat([{"role": "assistant", "content": "first"}])
    with pytest.raises(ValueError, match="role"):
        tok.encode_chat([{"role": "tool", "content": "x"}])


def test_chat_images_become_one_img_token_each_where_they_were(tok: TekkenTokenizer) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    parts = [{"type": "text", "text": "Compare [IMG]"}, image, {"type": "text", "text": "with"}, image]
    text, ids, positions = tok.encode_chat([{"role": "user", "content": parts}])
    assert [ids[p] for p in positions] == [10, 10] and ids.count(10) == 2  # the literal "[IMG]" stays text
    without = [{"type": "text", "text": "Compare [IMG]"}, {"type": "text", "text": "with"}]
    assert len(ids) - 2 == len(tok.encode_chat([{"role": "user", "content": without}])[1]) + 2  # "\n\n" twice
    assert text.count("[IMG]") == 3
    assert tok.encode_chat([{"role": "user", "content": [image]}])[1] == [1, 3, 10, 4]


def stream(tok: TekkenTokenizer, ids: list[int], sizes: list[int], skip: bool = True) -> str:
    detok = tok.incremental(skip_special_tokens=skip)
    out, i = [], 0
    for n in sizes:
        out.append(detok.add(ids[i : i + n]))
        i += n
    return "".join(out) + detok.add(ids[i:]) + detok.flush()


def test_streamed_text_equals_the_full_decode(tok: TekkenTokenizer) -> None:
    ids = tok.encode(sonnets(30) + UNICODE_TEXT * 2)
    rng = random.Random(0)
    for _ in range(5):
        sizes = [rng.randint(1, 4) for _ in range(len(ids) // 2)]
        assert stream(tok, ids, sizes) == tok.decode(ids)
    # Incomplete UTF-8 is held, not emitted as U+FFFD: "🙂" split over byte tokens.
    emoji = [1000 + b for b in "🙂".encode()]  # tekken's first 256 ordinary ids are the bytes
    detok = tok.incremental()
    assert [detok.add([t]) for t in emoji] == ["", "", "", "🙂"]
    # Random ids (invalid UTF-8, special tokens between) stream to exactly what decode gives, either policy.
    noise = [rng.randrange(tok.vocab_size) for _ in range(400)] + emoji[:2]
    for skip in (True, False):
        assert stream(tok, noise, [1] * len(noise), skip) == tok.decode(noise, skip_special_tokens=skip)


def test_frontend_chat_sends_mistral_commons_ids_and_streams_tekken_text(tok: TekkenTokenizer) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    script = tok.encode("Hello — naïve 🙂 world.")
    messages = [{"role": "user", "content": "Hi"}]

    async def go() -> tuple[int, list[Any], FakeEngine]:
        engine = FakeEngine(script)
        app = build_app(engine, tok, FrontendSettings())
        async with TestClient(TestServer(app)) as client:
            body = {"model": "wirebench-tiny", "messages": messages, "stream": True, "max_tokens": len(script)}
            resp = await client.post("/v1/chat/completions", json=body)
            raw = await resp.text()
        events = [json.loads(b[6:]) for b in raw.split("\n\n") if b.startswith("data: {")]
        return resp.status, events, engine

    status, events, engine = asyncio.run(go())
    assert status == 200
    req = engine.requests[0]
    assert list(req.prompt_token_ids) == tok.encode_chat(messages)[1]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert text == tok.decode(script)


@pytest.mark.parametrize("packed", [False, True])
def test_frontend_chat_images_get_placeholders_at_their_img_tokens(tok: TekkenTokenizer, packed: bool) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from harness.workloads.images import synthetic_image, to_data_url

    url = to_data_url(synthetic_image(24, 24, 0), "png")
    parts = [{"type": "text", "text": "Compare"}, {"type": "image_url", "image_url": {"url": url}}]
    body = {"model": "wirebench-tiny", "messages": [{"role": "user", "content": parts}], "max_tokens": 2}

    async def go() -> tuple[int, FakeEngine]:
        engine = FakeEngine(tok.encode("ok then"))
        engine.packed_token_ids = packed
        app = build_app(engine, tok, FrontendSettings(image_tokens=3))
        async with TestClient(TestServer(app)) as client:
            resp = await client.post("/v1/chat/completions", json=body)
            return resp.status, engine

    status, engine = asyncio.run(go())
    assert status == 200
    req = engine.requests[0]
    ids = list(req.prompt_token_ids)
    (placeholder,) = req.mm_placeholders
    assert placeholder.length == 3 and ids[placeholder.offset : placeholder.offset + 3] == [tok.image_token_id] * 3
    chat_ids = tok.encode_chat(body["messages"])[1]  # type: ignore[arg-type]
    assert ids == chat_ids[: placeholder.offset] + [10] * 3 + chat_ids[placeholder.offset + 1 :]
    assert isinstance(req.prompt_token_ids, np.ndarray) == packed


def test_the_engine_vocabulary_follows_the_tokenizer_and_is_recorded(tok: TekkenTokenizer) -> None:
    from harness.engine.config import limits_info

    config = EngineConfig(vocab_size=tok.vocab_size)
    info = limits_info(config)
    assert info["vocab_size"] == 131_072
    text = "\n".join(
        f"{name}{{{','.join(f'{k}={json.dumps(v)}' for k, v in labels.items())}}} {value}"
        for name, samples in engine_info.metric_samples({"executor": "sim", **info}).items()
        for labels, value in samples
    )
    engine = engine_info.from_metrics(text)
    assert engine is not None and engine["vocab_size"] == 131_072


def test_the_embedded_default_does_not_import_mistral_common() -> None:
    code = "import sys, harness.cli; from harness.tokenizers.tokenizer import load_tokenizer; load_tokenizer()\n"
    code += "assert 'mistral_common' not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.slow
def test_bench_run_with_tekken_records_its_vocabulary(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "harness.cli", "run", "--result-dir", str(tmp_path), "--no-progress"]
    cmd += ["--tokenizer", "tekken", "--codec", "msgspec,pickle", "--num-prompts", "20", "--repeat", "1"]
    cmd += ["--request-rate", "40", "--sonnet-output-len", "20"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    (compare,) = tmp_path.glob("compare-*.json")
    summary = json.loads(compare.read_text())
    assert all(r["status"] == "ok" for r in summary["runs"])
    assert summary["metadata"]["flags"]["tokenizer"] == "tekken"
    result = json.loads((tmp_path / summary["runs"][0]["result_file"]).read_text())
    assert result["completed"] == 20 and result["tokenizer_id"] == "tekken"
    assert result["metadata"]["engine"]["vocab_size"] == 131_072
