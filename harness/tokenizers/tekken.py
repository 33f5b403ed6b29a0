"""A production tokenizer: Mistral's tekken (131,072 tokens) through ``mistral-common``.

``load_tokenizer("tekken")`` returns a ``TekkenTokenizer``: the same interface as the embedded
``TextTokenizer`` (encode, decode, an incremental detokenizer, chat rendering, the special ids),
backed by ``tekken_240911.json`` (Mistral NeMo / Pixtral 12B), which ships inside the
``mistral-common`` wheel, so it loads offline. Imported only when asked for, so commands that
use the embedded tokenizer never pay for importing mistral-common (~1 s) or loading tekken (~1.5 s).

What is the real thing and what is not:

- Prompts are tokenized by tekken itself (tiktoken underneath; no BOS added, as the embedded
  tokenizer adds none). Ids reach 131,071: ordinary English text has ids above 65,535.
- Chat requests are rendered by mistral-common's own instruct encoding, as vLLM's
  ``--tokenizer-mode mistral`` does: the messages become a ``ChatCompletionRequest`` and
  ``encode_chat_completion`` gives the ids (``<s>[INST]...[/INST]``, the system prompt folded into
  the last user turn, content parts joined by a blank line). mistral-common's own validation
  applies (a conversation starts with a user or system message); a rejected conversation is a
  ``ValueError`` (a 400 from the frontend). Roles: system, developer (as system), user,
  assistant. Text content only reaches mistral-common; tool calls are not supported.
- Images: the frontend decodes images itself (``harness.frontend.inputs``), as it does for every
  tokenizer. Each ``image_url`` part is rendered as one ``[IMG]`` token at its place in the
  conversation, which the frontend expands to ``--image-tokens`` placeholders, as with the
  embedded tokenizer. mistral-common's Pixtral image encoding (rows of ``[IMG]`` and
  ``[IMG_BREAK]`` sized from the pixels) is not used: the number of image tokens stays a
  workload setting, the same for every tokenizer.
- Streamed text comes from a byte-level incremental detokenizer: each token's bytes go through
  an incremental UTF-8 decoder, which holds an incomplete character until its last byte arrives
  and turns invalid bytes into U+FFFD at once, exactly as the full decode does, so the streamed
  text always equals ``decode`` of the same ids.
"""

from __future__ import annotations

import encodings.utf_8
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import mistral_common
from mistral_common.exceptions import MistralCommonException
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
from mistral_common.tokens.tokenizers.tekken import Tekkenizer

from harness.tokenizers.tokenizer import IncrementalDetokenizer, TextTokenizer, TokenArray, content_pieces
from harness.wire.messages import pack_token_ids

TEKKEN_NAME = "tekken"
TEKKEN_FILE = Path(mistral_common.__file__).resolve().parent / "data" / "tekken_240911.json"
IMAGE_TOKEN = "[IMG]"
# Stands in for one image part while mistral-common renders the conversation; found again in the
# rendered bytes and replaced by the [IMG] id. A private-use character no prompt is expected to hold.
_IMAGE_SENTINEL = "\U000f0000"
_IMAGE_SENTINEL_BYTES = _IMAGE_SENTINEL.encode()
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class TekkenTokenizer(TextTokenizer):
    """``TextTokenizer``'s interface over mistral-common's tekken (module docstring).

    A subclass so the frontend, the load generator and the datasets take it where they take the
    embedded tokenizer; it never calls the base ``__init__``, and the Hugging Face specific parts
    (``hf``, ``encoding``) do not exist here.
    """

    def __init__(self, mistral: MistralTokenizer, name: str = TEKKEN_NAME) -> None:
        tekken = mistral.instruct_tokenizer.tokenizer
        if not isinstance(tekken, Tekkenizer):
            raise TypeError(f"{name} is not a tekken tokenizer")
        self.mistral = mistral
        self.tekken = tekken
        self.name = name
        self.vocab_size = tekken.n_words
        self.num_special = tekken.num_special_tokens
        self.eos_token_id = tekken.eos_id
        self.bos_token_id = tekken.bos_id
        self.pad_token_id = tekken.pad_id
        self.image_id: int = tekken.get_special_token(IMAGE_TOKEN)
        self.image_token_id = self.image_id
        self.bos_token = ""  # never added to a plain prompt
        self.image_marker = IMAGE_TOKEN
        self.special_token_ids = frozenset(range(self.num_special))
        # Each ordinary token's bytes, by id, made once (~0.15 s): the detokenizer's only lookup.
        model = tekken._model  # the tiktoken encoding; mistral-common's public calls add a check per id
        self.token_bytes: list[bytes] = [b""] * self.num_special + [
            model.decode_single_token_bytes(rank) for rank in range(self.vocab_size - self.num_special)
        ]
        self.special_strings: list[str] = [tekken.id_to_piece(i) for i in range(self.num_special)]

    def __repr__(self) -> str:
        return f"TekkenTokenizer(name={self.name!r}, vocab_size={self.vocab_size})"

    # -- encode / decode ---------------------------------------------------

    def encoding(self, text: str) -> Any:
        raise NotImplementedError("tekken has no Hugging Face encoding (offsets); use encode()")

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, no BOS or EOS; special-token strings in the text stay plain text."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        return self.tekken.encode(text, bos=False, eos=False)

    def encode_array(self, text: str) -> TokenArray:
        return pack_token_ids(self.encode(text))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_batch_arrays(self, texts: Sequence[str]) -> list[TokenArray]:
        return [self.encode_array(t) for t in texts]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids``: mistral-common's decode, by the bytes table when no id is special
        (the same result, without its per-call grouping: ~3x faster for one id)."""
        if not any(t < self.num_special for t in ids):
            return b"".join([self.token_bytes[t] for t in ids]).decode("utf-8", errors="replace")
        policy = SpecialTokenPolicy.IGNORE if skip_special_tokens else SpecialTokenPolicy.KEEP
        return self.tekken.decode(list(ids), special_token_policy=policy)

    def decode_batch(self, batch: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in batch]

    def incremental(self, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        return TekkenDetokenizer(self, skip_special_tokens)  # type: ignore[return-value]

    # -- chat ----------------------------------------------------------------

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """The conversation as mistral-common renders it (special tokens as text, images as ``[IMG]``)."""
        return self.encode_chat(messages)[0]

    def encode_chat(self, messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[int], list[int]]:
        """(rendered text, ids, index of each image's ``[IMG]`` id) from mistral-common's instruct encoding."""
        request = ChatCompletionRequest(messages=self._mistral_messages(messages))  # type: ignore[type-var]
        try:
            tokenized = self.mistral.encode_chat_completion(request)
        except (MistralCommonException, ValueError) as exc:
            raise ValueError(f"messages rejected by mistral-common: {exc}") from exc
        ids = self._place_images(tokenized.tokens)
        positions = [i for i, t in enumerate(ids) if t == self.image_token_id]
        text = self.decode(ids, skip_special_tokens=False)
        return text, ids, positions

    def _mistral_messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise ValueError("messages must be a list of {'role': ..., 'content': ...} objects")
        if not messages:
            raise ValueError("messages must not be empty")
        out: list[dict[str, Any]] = []
        for i, msg in enumerate(messages):
            if not isinstance(msg, Mapping):
                raise ValueError(f"messages[{i}] must be an object, got {type(msg).__name__}")
            role = msg.get("role")
            if role not in _ROLES:
                raise ValueError(f"messages[{i}].role must be one of {sorted(_ROLES)} with tekken, got {role!r}")
            # Images become a sentinel text chunk, so the rendering keeps their place (_place_images).
            text = self._render(msg.get("content"), f"messages[{i}].content", _IMAGE_SENTINEL)
            out.append({"role": _ROLES[role], "content": text})
        return out

    def render_content(self, content: Any, where: str = "content") -> str:
        """Text parts joined by a blank line, as mistral-common joins text chunks; images as ``[IMG]``."""
        return self._render(content, where, IMAGE_TOKEN)

    def _render(self, content: Any, where: str, image: str) -> str:
        if any(_IMAGE_SENTINEL in piece for piece in content_pieces(content, where, "")):
            raise ValueError(f"{where} holds U+F0000, which tekken chat reserves for images")
        return "\n\n".join(content_pieces(content, where, image))

    def _place_images(self, ids: list[int]) -> list[int]:
        """Replace the tokens that spell each image sentinel by one ``[IMG]`` id."""
        if _IMAGE_SENTINEL_BYTES[:1] not in b"".join(self.token_bytes[t] for t in ids):
            return ids
        out: list[int] = []
        pending = b""  # bytes of the tokens that may start a sentinel
        held: list[int] = []
        for t in ids:
            piece = self.token_bytes[t]
            if held or piece.startswith(_IMAGE_SENTINEL_BYTES[:1]):
                pending += piece
                held.append(t)
                if pending == _IMAGE_SENTINEL_BYTES:
                    out.append(self.image_id)
                    pending, held = b"", []
                elif not _IMAGE_SENTINEL_BYTES.startswith(pending):
                    if _IMAGE_SENTINEL_BYTES in pending:
                        raise ValueError("an image's place did not fall on tekken token boundaries")
                    out.extend(held)
                    pending, held = b"", []
            else:
                out.append(t)
        out.extend(held)
        return out


class TekkenDetokenizer:
    """Streams text from tekken ids: each token's bytes through an incremental UTF-8 decoder.

    An incomplete UTF-8 character is held until its last byte arrives (``flush`` releases it as
    U+FFFD); invalid bytes become U+FFFD at once, so nothing stalls and the concatenated deltas
    equal ``decode`` of the same ids, special tokens included (they end the pending bytes, as
    the full decode's groups do).
    """

    def __init__(self, tokenizer: TekkenTokenizer, skip_special_tokens: bool = True) -> None:
        self._bytes = tokenizer.token_bytes
        self._specials = tokenizer.special_strings
        self._num_special = tokenizer.num_special
        self._skip = skip_special_tokens
        self._utf8 = encodings.utf_8.IncrementalDecoder(errors="replace")
        self._count = 0

    @property
    def token_ids(self) -> list[int]:
        """Nothing is kept: each token is turned into text (or held bytes) as it arrives."""
        return []

    def add(self, new_ids: Sequence[int]) -> str:
        """Append ``new_ids`` and return the newly completed text (maybe '')."""
        self._count += len(new_ids)
        if not any(t < self._num_special for t in new_ids):
            return self._utf8.decode(b"".join([self._bytes[t] for t in new_ids]))
        out: list[str] = []
        for t in new_ids:
            if t < self._num_special:
                out.append(self._utf8.decode(b"", final=True))
                self._utf8.reset()
                if not self._skip:
                    out.append(self._specials[t])
            else:
                out.append(self._utf8.decode(self._bytes[t]))
        return "".join(out)

    def flush(self) -> str:
        """Whatever is still held (an incomplete character, as U+FFFD); call once, after the last ``add``."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text


def load_tekken() -> TekkenTokenizer:
    """tekken_240911.json from the mistral-common wheel (no download)."""
    return TekkenTokenizer(MistralTokenizer.from_file(TEKKEN_FILE))
