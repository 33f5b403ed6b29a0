"""The project's tokenizer: loading, round trips, chat template, streaming detokenization."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from harness.tokenizers.tokenizer import (
    EMBEDDED_TOKENIZER,
    IncrementalDetokenizer,
    TextTokenizer,
    load_tokenizer,
)

ROOT = Path(__file__).resolve().parent.parent
UNICODE_TEXT = (
    "Plain ASCII, then café naïve résumé; 日本語のテキスト and 中文字符; "
    "emoji 🙂🚀👩‍👩‍👧 and flags 🇳🇴; Ελληνικά, русский, العربية, हिन्दी — “quotes” … ✓\n"
    "tabs\tand  double  spaces, trailing space "
)


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return load_tokenizer()


def long_text() -> str:
    lines = (ROOT / "datasets" / "sonnets.txt").read_text(encoding="utf-8").splitlines(True)
    return "".join(lines[:60]) + UNICODE_TEXT * 3


# -- loading --------------------------------------------------------------------


def test_embedded_tokenizer_basics(tok: TextTokenizer) -> None:
    assert tok.name == "wirebench-bpe"
    assert tok.vocab_size == 4096
    for name in ("<|bos|>", "<|eos|>", "<|pad|>", "<|image|>"):
        assert tok.hf.token_to_id(name) in tok.special_token_ids
    assert tok.eos_token_id == tok.hf.token_to_id("<|eos|>")
    assert tok.image_token_id == tok.hf.token_to_id("<|image|>")
    assert tok.bos_token_id == tok.hf.token_to_id("<|bos|>")


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a valid"):
        load_tokenizer(bad)


# -- encode / decode ------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Hello, world!",
        "  leading and trailing  ",
        "line\nbreaks\r\nand\ttabs",
        UNICODE_TEXT,
        "\ufffd literal replacement char",
        "\x00\x01 control bytes",
    ],
)
def test_round_trip(tok: TextTokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text)) == text


def test_encode_adds_no_special_tokens(tok: TextTokenizer) -> None:
    ids = tok.encode("hello")
    assert tok.bos_token_id not in ids and tok.eos_token_id not in ids
    # Markers written in the text still become their single special token.
    assert tok.encode("<|image|>") == [tok.image_token_id]


def test_encode_rejects_non_text(tok: TextTokenizer) -> None:
    with pytest.raises(TypeError):
        tok.encode(b"bytes")  # type: ignore[arg-type]


def test_special_tokens_skipped_on_decode(tok: TextTokenizer) -> None:
    ids = [tok.bos_token_id, *tok.encode("a poem"), tok.eos_token_id]
    assert tok.decode(ids) == "a poem"
    assert tok.decode(ids, skip_special_tokens=False) == "<|bos|>a poem<|eos|>"


def test_encode_batch_matches_encode(tok: TextTokenizer) -> None:
    texts = ["one", "two words", UNICODE_TEXT]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


def test_the_array_route_gives_the_list_routes_ids_as_little_endian_int32(tok: TextTokenizer) -> None:
    # What the packed codecs are handed must be exactly the ids every other codec gets.
    texts = [long_text(), "<|user|>\nhi<|image|>\n<|assistant|>\n", "x"]
    for text in texts:
        ids = tok.encode_array(text)
        assert ids.dtype == np.dtype("<i4") and ids.ndim == 1
        assert ids.tolist() == tok.encode(text)
    assert [a.tolist() for a in tok.encode_batch_arrays(texts)] == tok.encode_batch(texts)
    assert tok.encode_array("").dtype == np.dtype("<i4") and len(tok.encode_array("")) == 0


def test_the_array_route_keeps_the_largest_ids(tmp_path: Path) -> None:
    # A tokenizer whose ids reach past 2**16 (a real Llama-3 vocabulary is 128k): nothing wraps.
    vocab = {f"t{i}": i for i in range(70_000)}
    hf = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    big = TextTokenizer(hf, "wide")
    text = "t69999 t1 t65536 t65535 t0"
    assert big.encode_array(text).tolist() == big.encode(text) == [69999, 1, 65536, 65535, 0]


# -- chat template --------------------------------------------------------------


def test_chat_template_string_content(tok: TextTokenizer) -> None:
    text = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert text == "<|bos|><|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"
    ids = tok.encode(text)
    assert ids[0] == tok.bos_token_id and ids[-2] == tok.hf.token_to_id("<|assistant|>")


def test_chat_template_image_parts(tok: TextTokenizer) -> None:
    content = [
        {"type": "text", "text": "Describe"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,BBBB"}},
    ]
    text = tok.apply_chat_template([{"role": "user", "content": content}])
    assert text == "<|bos|><|user|>\nDescribe\n<|image|>\n<|image|>\n<|assistant|>\n"
    assert tok.encode(text).count(tok.image_token_id) == 2


@pytest.mark.parametrize(
    "messages",
    [
        [],
        "hello",
        [{"role": "wizard", "content": "x"}],
        [{"content": "x"}],
        [{"role": "user", "content": [{"type": "audio"}]}],
        [{"role": "user", "content": [{"type": "text", "text": 3}]}],
        [{"role": "user", "content": 42}],
        ["not a dict"],
    ],
)
def test_chat_template_rejects_bad_messages(tok: TextTokenizer, messages: object) -> None:
    with pytest.raises(ValueError):
        tok.apply_chat_template(messages)  # type: ignore[arg-type]


# -- incremental detokenization -------------------------------------------------


def stream(tok: TextTokenizer, ids: list[int], chunk_sizes: list[int] | None = None) -> list[str]:
    det = tok.incremental()
    pieces, i = [], 0
    sizes = iter(chunk_sizes or [])
    while i < len(ids):
        k = next(sizes, 1)
        pieces.append(det.add(ids[i : i + k]))
        i += k
    pieces.append(det.flush())
    return pieces


def test_incremental_token_by_token_equals_full_decode(tok: TextTokenizer) -> None:
    ids = tok.encode(long_text())
    pieces = stream(tok, ids)
    assert "".join(pieces) == tok.decode(ids) == long_text()
    # No half characters are ever emitted.
    assert not any("\ufffd" in p for p in pieces)


def test_incremental_in_uneven_chunks(tok: TextTokenizer) -> None:
    ids = tok.encode(UNICODE_TEXT * 4)
    rng = random.Random(7)
    sizes = [rng.randint(1, 5) for _ in range(len(ids))]
    assert "".join(stream(tok, ids, sizes)) == UNICODE_TEXT * 4


def test_incremental_holds_back_half_a_character(tok: TextTokenizer) -> None:
    ids = tok.encode("🙂")
    assert len(ids) > 1  # four UTF-8 bytes in more than one token
    det = IncrementalDetokenizer(tok)
    assert det.add(ids[:1]) == ""
    assert det.add(ids[1:]) == "🙂"
    assert det.flush() == ""
    # A stream that stops mid-character hands back what it has at flush.
    det = tok.incremental()
    assert det.add(ids[:1]) == ""
    assert det.flush() == "\ufffd"


def test_incremental_skips_special_tokens(tok: TextTokenizer) -> None:
    ids = tok.encode("first") + [tok.eos_token_id] + tok.encode(" second") + [tok.pad_token_id]
    assert "".join(stream(tok, ids)) == "first second"


def test_incremental_decodes_a_small_window(tok: TextTokenizer) -> None:
    ids = tok.encode(long_text())
    seen: list[int] = []
    inner = tok.decode

    class Spy(TextTokenizer):
        def decode(self, ids, skip_special_tokens=True):
            seen.append(len(ids))
            return inner(ids, skip_special_tokens)

    spy = Spy.__new__(Spy)
    spy.__dict__.update(tok.__dict__)
    assert "".join(stream(spy, ids)) == long_text()
    assert len(ids) > 500 and max(seen) <= 12


# -- other tokenizer.json files -------------------------------------------------


def _train(tokenizer: Tokenizer, specials: list[str], tmp_path: Path, name: str) -> Path:
    text = long_text().splitlines(True) * 3
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False)
    tokenizer.train_from_iterator(text, trainer=trainer)
    path = tmp_path / name / "tokenizer.json"
    path.parent.mkdir()
    tokenizer.save(str(path))
    return path


def test_loads_a_sentencepiece_style_tokenizer(tmp_path: Path) -> None:
    # Llama-2 shape: Metaspace, byte fallback, <s> / </s>, no image token.
    hf = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    hf.normalizer = normalizers.Replace(" ", "▁")
    hf.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    path = _train(hf, ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)], tmp_path, "llama-ish")
    tok = load_tokenizer(path.parent)  # a folder works too
    assert tok.name == "llama-ish"
    assert tok.eos_token_id == tok.hf.token_to_id("</s>")
    assert tok.bos_token_id == tok.hf.token_to_id("<s>")
    assert tok.image_token_id is None
    text = "A gentle rose upon the shore 日本 🙂 end"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert "".join(stream(tok, ids)) == tok.decode(ids)
    # Without an image token the chat template still writes the marker as text.
    chat = tok.apply_chat_template([{"role": "user", "content": [{"type": "image_url"}]}])
    assert "<|image|>" in chat and chat.startswith("<s>")


def test_loads_a_llama3_style_tokenizer(tmp_path: Path) -> None:
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<image>"]
    path = _train(hf, specials, tmp_path, "llama3-ish")
    renamed = path.with_name("my-model.json")
    path.rename(renamed)
    tok = load_tokenizer(str(renamed))
    assert tok.name == "my-model"
    assert tok.eos_token_id == tok.hf.token_to_id("<|end_of_text|>")
    assert tok.image_token_id == tok.hf.token_to_id("<image>")
    assert tok.apply_chat_template([{"role": "user", "content": [{"type": "image_url"}]}]).count("<image>") == 1
    ids = tok.encode(UNICODE_TEXT)
    assert "".join(stream(tok, ids)) == UNICODE_TEXT


# -- the committed file is what the script writes ----------------------------


def test_committed_tokenizer_is_reproducible() -> None:
    spec = importlib.util.spec_from_file_location("train_tokenizer", ROOT / "scripts" / "train_tokenizer.py")
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    if tokenizers.__version__ != script.TRAINED_WITH:
        pytest.skip(f"committed file was trained with tokenizers {script.TRAINED_WITH}")
    fresh = json.loads(script.build().to_str())
    committed = json.loads(EMBEDDED_TOKENIZER.read_text(encoding="utf-8"))
    assert fresh["model"]["vocab"] == committed["model"]["vocab"]
    assert fresh["model"]["merges"] == committed["model"]["merges"]
    assert fresh["added_tokens"] == committed["added_tokens"]


def test_incremental_releases_invalid_bytes_without_stalling(tok: TextTokenizer) -> None:
    # A lone continuation byte is invalid UTF-8 (what a random model may emit).
    byte_id = tok.hf.token_to_id("Ģ")  # byte-level symbol for 0x80
    assert tok.decode([byte_id]) == "\ufffd"
    ids = tok.encode("start ") + [byte_id] * 20 + tok.encode(" end")
    pieces = stream(tok, ids)
    assert "".join(pieces) == tok.decode(ids)
    assert "\ufffd" in "".join(pieces[:-1])  # released before flush
