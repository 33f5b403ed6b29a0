"""Text tokenizer shared by the frontend, the load generator and the datasets.

A thin wrapper over a Hugging Face ``tokenizers`` ``tokenizer.json``: the
project's own byte-level BPE (datasets/tokenizer.json, trained by
scripts/train_tokenizer.py) by default, or any other ``tokenizer.json`` such as
a real Llama tokenizer.

Chat template (fixed and documented, the same for every tokenizer)::

    {bos}<|system|>\\n{text}\\n<|user|>\\n{text}\\n<|assistant|>\\n{text}\\n ... <|assistant|>\\n

``{bos}`` is the tokenizer's BOS token string when it has one (``<|bos|>``,
``<s>``, ``<|begin_of_text|>``), else nothing. Each message renders as its role
marker, a newline, its text and a newline; the template ends with the
generation prompt ``<|assistant|>\\n``. Roles: system, developer (rendered as
system), user, assistant, tool. Content is a string or an OpenAI content-parts
list; text parts keep their text, each image part renders as one image marker
(the tokenizer's image token, ``<|image|>`` when it has none), and parts are
joined with ``\\n``. In the project's tokenizer the role markers and the image
marker are single special tokens; in others they tokenize as plain text.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tokenizers import Encoding, Tokenizer

from harness.wire.messages import pack_token_ids

EMBEDDED_TOKENIZER = Path(__file__).resolve().parents[2] / "datasets" / "tokenizer.json"
EMBEDDED_NAME = "wirebench-bpe"
# What --tokenizer takes beside a path: name -> "module:loader", imported only when that name is
# asked for, so the base import never pays for mistral-common, and the named module may build on
# this one (a subclass of TextTokenizer) without an import cycle.
NAMED_TOKENIZERS = {
    # Mistral's 131,072-token tekken, through mistral-common.
    "tekken": "harness.tokenizers.tekken:load_tekken",
}

# Looked up in this order; the first present wins.
EOS_NAMES = ("<|eos|>", "</s>", "<|end_of_text|>", "<|eot_id|>", "<|endoftext|>")
BOS_NAMES = ("<|bos|>", "<s>", "<|begin_of_text|>", "<|startoftext|>")
PAD_NAMES = ("<|pad|>", "<pad>", "<|finetune_right_pad_id|>")
IMAGE_NAMES = ("<|image|>", "<image>")
DEFAULT_IMAGE_MARKER = "<|image|>"

ROLE_MARKERS = {
    "system": "<|system|>",
    "developer": "<|system|>",
    "user": "<|user|>",
    "assistant": "<|assistant|>",
    "tool": "<|tool|>",
}
GENERATION_PROMPT = "<|assistant|>\n"

# U+FFFD: what a decoder emits for an incomplete UTF-8 sequence.
_REPLACEMENT = "\ufffd"
# A UTF-8 character has at most 4 bytes and every byte-level or byte-fallback
# token carries at least one, so when this many held tokens contain no
# character boundary at all, the U+FFFDs are invalid bytes (a random-weight
# model emits those), and holding them longer would only stall the stream.
_MAX_HELD_TOKENS = 8
# Ids before the decoding window are never decoded again: dropped once this many have
# gathered, so a stream's detokenizer holds a bounded window whatever its length.
_DROP_DECODED_AFTER = 256


# Prompt token ids as the packed codecs carry them: a little-endian int32 array.
TokenArray = npt.NDArray[np.int32]


def ids_array(encoding: Encoding) -> TokenArray:
    """The ids of a ``tokenizers`` encoding as a little-endian int32 array.

    Why this route: ``Encoding`` exposes its ids only as a Python list (no buffer,
    no numpy output, in tokenizers 0.23: ``ids``, ``type_ids``, ``attention_mask``
    and the rest are all lists, and pickling it writes JSON of every field), so the
    binding makes a Python int per token whatever we do (~6.7 µs for 550 ids on the
    2-core VM). From that list, ``pack_token_ids`` (the frontend's one packing, for token-id
    prompts too) is a ``struct.pack`` into an int32 buffer (~3.8 µs more) that ``np.frombuffer``
    views without a copy; ``array("I")`` measured ~0.4 µs less, ``np.fromiter`` (~8 µs) and
    ``np.array(ids, int32)`` (~9 µs) more.
    """
    return pack_token_ids(encoding.ids)


class TextTokenizer:
    """Encode, decode and chat-format text with one ``tokenizer.json``."""

    def __init__(self, hf_tokenizer: Tokenizer, name: str) -> None:
        self.hf = hf_tokenizer
        self.name = name
        self.vocab_size: int = hf_tokenizer.get_vocab_size(with_added_tokens=True)
        self.eos_token_id = self._first_id(EOS_NAMES)
        self.bos_token_id = self._first_id(BOS_NAMES)
        self.pad_token_id = self._first_id(PAD_NAMES)
        self.image_token_id = self._first_id(IMAGE_NAMES)
        self.bos_token = self._first_name(BOS_NAMES) or ""
        self.image_marker = self._first_name(IMAGE_NAMES) or DEFAULT_IMAGE_MARKER
        self.special_token_ids: frozenset[int] = frozenset(
            tid for tid, tok in hf_tokenizer.get_added_tokens_decoder().items() if tok.special
        )

    def _first_id(self, names: Iterable[str]) -> int | None:
        for name in names:
            tid = self.hf.token_to_id(name)
            if tid is not None:
                return tid
        return None

    def _first_name(self, names: Iterable[str]) -> str | None:
        for name in names:
            if self.hf.token_to_id(name) is not None:
                return name
        return None

    def __repr__(self) -> str:
        return f"TextTokenizer(name={self.name!r}, vocab_size={self.vocab_size})"

    # -- encode / decode ---------------------------------------------------

    def encoding(self, text: str) -> Encoding:
        """The BPE itself: ``tokenizers``' encoding of ``text``, no special tokens added (markers in the
        text still match). ``encode`` and ``encode_array`` are this plus the ids in a list or an array."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        return self.hf.encode(text, add_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as a list."""
        return self.encoding(text).ids

    def encode_array(self, text: str) -> TokenArray:
        """Token ids of ``text`` as a little-endian int32 array (``ids_array``), for packed codecs."""
        return ids_array(self.encoding(text))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``encode`` for many texts at once (parallel inside ``tokenizers``)."""
        return [e.ids for e in self._encode_batch(texts)]

    def encode_batch_arrays(self, texts: Sequence[str]) -> list[TokenArray]:
        """``encode_array`` for many texts at once."""
        return [ids_array(e) for e in self._encode_batch(texts)]

    def _encode_batch(self, texts: Sequence[str]) -> list[Encoding]:
        return self.hf.encode_batch(list(texts), add_special_tokens=False)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decode_batch(self, batch: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        """``decode`` of each id list (parallel inside ``tokenizers``)."""
        return self.hf.decode_batch([list(ids) for ids in batch], skip_special_tokens=skip_special_tokens)

    def incremental(self, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        """A fresh streaming detokenizer for one request."""
        return IncrementalDetokenizer(self, skip_special_tokens=skip_special_tokens)

    # -- chat ----------------------------------------------------------------

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """Render OpenAI-style chat messages with the fixed template (module docstring)."""
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise ValueError("messages must be a list of {'role': ..., 'content': ...} objects")
        if not messages:
            raise ValueError("messages must not be empty")
        out = [self.bos_token]
        for i, msg in enumerate(messages):
            if not isinstance(msg, Mapping):
                raise ValueError(f"messages[{i}] must be an object, got {type(msg).__name__}")
            role = msg.get("role")
            if role not in ROLE_MARKERS:
                raise ValueError(f"messages[{i}].role must be one of {sorted(ROLE_MARKERS)}, got {role!r}")
            text = self.render_content(msg.get("content"), where=f"messages[{i}].content")
            out.append(f"{ROLE_MARKERS[role]}\n{text}\n")
        out.append(GENERATION_PROMPT)
        return "".join(out)

    def render_content(self, content: Any, where: str = "content") -> str:
        """Text of one message's content: a string, None, or a list of content parts."""
        return "\n".join(content_pieces(content, where, self.image_marker))


def content_pieces(content: Any, where: str, image: str) -> list[str]:
    """One message's content as pieces of text, each image part as ``image``: a string or None is one
    piece, an OpenAI content-parts list one per part. Raises ValueError naming ``where`` on a bad part."""
    if content is None or isinstance(content, str):
        return [content or ""]
    if not isinstance(content, Sequence) or isinstance(content, bytes):
        raise ValueError(f"{where} must be a string or a list of content parts")
    pieces: list[str] = []
    for j, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise ValueError(f"{where}[{j}] must be an object")
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise ValueError(f"{where}[{j}].text must be a string")
            pieces.append(text)
        elif kind == "image_url":
            pieces.append(image)
        else:
            raise ValueError(f"{where}[{j}].type must be 'text' or 'image_url', got {kind!r}")
    return pieces


class IncrementalDetokenizer:
    """Turns a stream of output token ids into text deltas, one request at a time.

    Each ``add`` decodes only a short window: the tokens since the last emitted
    boundary (``read_offset``) plus the tokens of the previous delta
    (``prefix_offset``) as context, so decoders that strip a leading space
    (SentencePiece) or need the previous bytes see the same start twice and the
    difference is exact. While the decoded window ends with U+FFFD (half a
    UTF-8 character) nothing is emitted; ``flush`` returns what is held.
    Invalid UTF-8 in the output (random tokens) is released after
    ``_MAX_HELD_TOKENS`` tokens, so it cannot stall a stream.
    """

    def __init__(self, tokenizer: TextTokenizer, skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    @property
    def token_ids(self) -> list[int]:
        """The ids still in the window (earlier ones are dropped once decoded)."""
        return self._ids

    def _decode(self, start: int, end: int | None = None) -> str:
        return self._tok.decode(self._ids[start:end], skip_special_tokens=self._skip)

    def add(self, new_ids: Sequence[int]) -> str:
        """Append ``new_ids`` and return the newly completed text (maybe '')."""
        if self._prefix_offset >= _DROP_DECODED_AFTER:
            del self._ids[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        self._ids.extend(new_ids)
        end = len(self._ids)
        if end == self._read_offset:
            return ""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset)
        if new_text.endswith(_REPLACEMENT):
            if end - self._read_offset < _MAX_HELD_TOKENS:
                return ""
            # Held for long: release up to the last character boundary among
            # the held tokens, or all of it when there is none (then the
            # U+FFFDs are invalid bytes in the output itself, not half a char).
            for j in range(end - 1, self._read_offset, -1):
                text = self._decode(self._prefix_offset, j)
                if not text.endswith(_REPLACEMENT):
                    end, new_text = j, text
                    break
        if len(new_text) <= len(prefix_text):
            # Tokens that decode to nothing (skipped special tokens): move on.
            self._read_offset = end
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = end
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """Return whatever text is still held back; call once, after the last ``add``."""
        if self._read_offset == len(self._ids):
            return ""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset)
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]


def load_tokenizer(path: str | Path | None = None) -> TextTokenizer:
    """Load a ``tokenizer.json`` (or a folder holding one), or a named tokenizer; None = the project's own.

    ``name`` is "wirebench-bpe" for the embedded tokenizer, else the file stem,
    or the folder's name when the file is called plain ``tokenizer.json``.
    A name of ``NAMED_TOKENIZERS`` (``"tekken"``) loads that tokenizer instead (a file of that
    name is ``./tekken``).
    """
    if path is not None and str(path) in NAMED_TOKENIZERS:
        module, _, loader = NAMED_TOKENIZERS[str(path)].partition(":")
        named: TextTokenizer = getattr(importlib.import_module(module), loader)()
        return named
    if path is None:
        file, name = EMBEDDED_TOKENIZER, EMBEDDED_NAME
        if not file.is_file():
            raise FileNotFoundError(f"the embedded tokenizer {file} is missing; run scripts/train_tokenizer.py")
    else:
        file = Path(path).expanduser()
        if file.is_dir():
            file = file / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"no tokenizer.json at {path}")
        name = file.stem if file.stem != "tokenizer" else (file.resolve().parent.name or file.stem)
    try:
        hf = Tokenizer.from_file(str(file))
    except Exception as exc:  # tokenizers raises a bare Exception on bad files
        raise ValueError(f"{file} is not a valid Hugging Face tokenizer.json: {exc}") from exc
    return TextTokenizer(hf, name)
