"""A parsed OpenAI request becomes an ``EngineCoreRequest``: tokenize, decode images, fit the context.

Functions of (body, tokenizer, settings), no aiohttp: ``prepare_completion``
and ``prepare_chat`` return a ``Prepared`` request or raise ``ProtocolError``
(which the app turns into a 400/404 with an OpenAI-style body).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.frontend import protocol
from harness.frontend.images import (
    PixelBudget,
    ProcessedImage,
    TensorAlloc,
    open_data_url,
    process_image,
    torch_dtype,
)
from harness.frontend.protocol import ProtocolError, StreamOptions
from harness.frontend.settings import FrontendSettings
from harness.tokenizers.tokenizer import DEFAULT_IMAGE_MARKER, TextTokenizer, TokenArray
from harness.transports import TransportError
from harness.wire.messages import EngineCoreRequest, PlaceholderRange, SamplingParams, pack_token_ids

# Placeholder token id when the tokenizer has no image token (user tokenizers):
# the engine only needs *some* id at the placeholder positions, it replaces
# their embeddings with the image's.
FALLBACK_IMAGE_TOKEN_ID = 0

# A prompt's ids: a list, or for a codec with packed token ids (``packed=True`` below, msgspec-packed)
# the tokenizer's int32 array, which reaches the codec without a Python list of the ids being built here.
TokenIds = list[int] | TokenArray


def _nothing() -> None:
    pass


@dataclass
class Prepared:
    """A validated request, ready for the engine, and how to answer it."""

    request: EngineCoreRequest
    chat: bool
    stream: bool
    options: StreamOptions
    model: str
    # Gives the request's decoded pixels back to the PixelBudget: called once the engine has answered.
    release_pixels: Callable[[], None] = _nothing

    @property
    def stops(self) -> list[str]:
        return self.request.sampling_params.stop


def _check_model(settings: FrontendSettings, model: str | None) -> str:
    served = settings.served_model_name
    if model is not None and model != served:
        raise ProtocolError(
            f"The model `{model}` does not exist (this server serves `{served}`).", status=404, param="model"
        )
    return served


def _resolve_max_tokens(settings: FrontendSettings, prompt_len: int, requested: int | None, chat: bool) -> int:
    room = settings.max_model_len - prompt_len
    if requested is None:
        if room < 1:
            raise ProtocolError(
                f"The prompt is {prompt_len} tokens, which leaves no room to generate within this "
                f"model's maximum context length of {settings.max_model_len} tokens.",
                param="prompt",
            )
        # As OpenAI and vLLM: completions default to 16 tokens, chat to the rest of the context.
        return room if chat else min(settings.default_max_tokens, room)
    if requested > room:
        raise ProtocolError(
            f"This model's maximum context length is {settings.max_model_len} tokens. However, you "
            f"requested {prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} for the "
            f"completion). Please reduce the prompt or max_tokens.",
            param="max_tokens",
        )
    return requested


def _image_token_id(tokenizer: TextTokenizer, settings: FrontendSettings) -> int:
    if settings.image_token_id is not None:
        return settings.image_token_id
    tid = getattr(tokenizer, "image_token_id", None)
    return FALLBACK_IMAGE_TOKEN_ID if tid is None else tid


async def _tokenize_with_markers(
    tokenizer: TextTokenizer, text: str, n_images: int, packed: bool = False
) -> tuple[TokenIds, list[int]]:
    """Token ids of ``text`` (an int32 array when ``packed``) and the index of each image marker in them.

    With an image token in the vocabulary the marker tokenizes to it and is
    found by id. Without one (user tokenizers) the text is split at the
    markers and each piece tokenized on its own; the marker positions get a
    placeholder id later.
    """
    marker_id = tokenizer.image_token_id
    marker = getattr(tokenizer, "image_marker", DEFAULT_IMAGE_MARKER)
    ids: TokenIds
    if marker_id is not None:
        ids = await tokenize(tokenizer, text, packed)
        if isinstance(ids, np.ndarray):
            positions = np.flatnonzero(ids == marker_id).tolist()  # one int per image, not per token
        else:
            positions = [i for i, t in enumerate(ids) if t == marker_id]
    else:
        parts: list[TokenIds] = []
        positions, n = [], 0
        for i, piece in enumerate(text.split(marker)):
            if i:
                positions.append(n)
                parts.append([FALLBACK_IMAGE_TOKEN_ID])
                n += 1
            if piece:
                parts.append(await tokenize(tokenizer, piece, packed))
                n += len(parts[-1])
        ids = _join(parts, packed)
    if len(positions) != n_images:
        raise ProtocolError(
            f"the prompt has {len(positions)} image markers for {n_images} images; "
            f"the text must not contain {marker!r} itself",
            param="messages",
        )
    return ids, positions


def _join(parts: list[TokenIds], packed: bool) -> TokenIds:
    """The parts' ids one after another: an int32 array when ``packed``, else a list."""
    if packed:
        return np.concatenate(parts, dtype="<i4") if parts else np.empty(0, "<i4")
    out: list[int] = []
    for part in parts:
        out.extend(part)
    return out


def _expand_images(
    ids: TokenIds, positions: list[int], image_id: int, length: int
) -> tuple[TokenIds, list[PlaceholderRange]]:
    """Replace each marker with ``length`` placeholder ids; their ranges in the new prompt.

    An array stays an array (the placeholders are written as one block each), a list a list."""
    if not positions:
        return ids, []
    packed = isinstance(ids, np.ndarray)
    block: TokenIds = np.full(length, image_id, dtype="<i4") if packed else [image_id] * length
    parts: list[TokenIds] = []
    ranges: list[PlaceholderRange] = []
    prev = at = 0
    for pos in positions:
        parts.append(ids[prev:pos])
        at += pos - prev
        ranges.append(PlaceholderRange(offset=at, length=length))
        parts.append(block)
        at += length
        prev = pos + 1
    parts.append(ids[prev:])
    return _join(parts, packed), ranges


def _engine_request(
    id_prefix: str,
    text: str | None,
    ids: TokenIds,
    sampling: SamplingParams,
    max_tokens: int,
    tokenizer: TextTokenizer,
    settings: FrontendSettings,
    **mm: Any,
) -> EngineCoreRequest:
    """The EngineCoreRequest both endpoints send; ``mm`` holds the chat endpoint's image fields."""
    sampling.max_tokens = max_tokens
    eos = settings.eos_token_id if settings.eos_token_id is not None else getattr(tokenizer, "eos_token_id", None)
    return EngineCoreRequest(
        request_id=f"{id_prefix}-{uuid.uuid4().hex}",
        prompt=text,
        prompt_token_ids=ids,
        sampling_params=sampling,
        eos_token_id=eos,
        arrival_time=time.time(),
        **mm,
    )


# Tokenizing longer texts than this runs in a worker thread (tokenizers' batch
# encode releases the GIL), so a big prompt does not hold up every live stream.
OFF_LOOP_CHARS = 8192


def _utf8_over(texts: Sequence[str], limit: int) -> bool:
    """Whether ``texts`` together take more than ``limit`` UTF-8 bytes (1-4 a character: most are
    decided by their length alone, without encoding them)."""
    chars = sum(len(t) for t in texts)
    if chars > limit or 4 * chars <= limit:
        return chars > limit
    return sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) > limit


def _check_prompt_size(texts: Sequence[str], settings: FrontendSettings, param: str) -> None:
    """Refuse a prompt over max_prompt_bytes before any tokenization (the bound follows the context:
    FrontendSettings.max_prompt_bytes)."""
    limit = settings.max_prompt_bytes
    if _utf8_over(texts, limit):
        raise ProtocolError(
            f"the prompt is over the limit of {limit} bytes (this model's context is {settings.max_model_len} tokens; "
            "bench serve --max-prompt-bytes)",
            param=param,
        )


def _message_texts(messages: Sequence[dict[str, Any]]) -> list[str]:
    """The text of every message (protocol.parse_chat_request's normalised content), images aside."""
    texts: list[str] = []
    for msg in messages:
        content = msg["content"]
        if isinstance(content, str):
            texts.append(content)
        else:
            texts.extend(part["text"] for part in content if part["type"] == "text")
    return texts


async def tokenize(tokenizer: TextTokenizer, text: str, packed: bool = False) -> TokenIds:
    """The ids of ``text``: the tokenizer's list, or with ``packed`` its int32 array (``ids_array``)."""
    if len(text) <= OFF_LOOP_CHARS:
        return tokenizer.encode_array(text) if packed else tokenizer.encode(text)
    if packed:
        return (await asyncio.to_thread(tokenizer.encode_batch_arrays, [text]))[0]
    return (await asyncio.to_thread(tokenizer.encode_batch, [text]))[0]


async def prepare_completion(
    body: Any,
    tokenizer: TextTokenizer,
    settings: FrontendSettings,
    alloc: TensorAlloc | None = None,
    budget: PixelBudget | None = None,
    packed: bool = False,
) -> Prepared:
    """``packed``: the engine client's codec carries prompt ids as an int32 array (msgspec-packed): a text
    prompt's ids stay the tokenizer's array. Token-id prompts arrive as JSON lists and stay lists."""
    req = protocol.parse_completion_request(body, settings.limits())
    model = _check_model(settings, req.model)
    if isinstance(req.prompt, str):
        text: str | None = req.prompt
        _check_prompt_size([req.prompt], settings, "prompt")
        ids: TokenIds = await tokenize(tokenizer, req.prompt, packed)
        if len(ids) == 0:
            raise ProtocolError("the prompt tokenizes to nothing", param="prompt")
    else:
        text, ids = None, list(req.prompt)
        vocab = tokenizer.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ProtocolError(f"token id {bad} is outside the vocabulary [0, {vocab})", param="prompt")
    max_tokens = _resolve_max_tokens(settings, len(ids), req.sampling.max_tokens, chat=False)
    request = _engine_request("cmpl", text, ids, req.sampling, max_tokens, tokenizer, settings)
    return Prepared(request, False, req.stream, req.stream_options, model)


async def prepare_chat(
    body: Any,
    tokenizer: TextTokenizer,
    settings: FrontendSettings,
    alloc: TensorAlloc | None = None,
    budget: PixelBudget | None = None,
    packed: bool = False,
) -> Prepared:
    """``alloc``: where pixel tensors are built (the shm transport's arena), by default torch's memory;
    ``budget``: the decoded pixels all requests may have in flight; ``packed``: as ``prepare_completion``."""
    req = protocol.parse_chat_request(body, settings.limits())
    model = _check_model(settings, req.model)
    n_images = len(req.image_urls)
    if n_images > settings.max_images_per_request:
        raise ProtocolError(
            f"at most {settings.max_images_per_request} images per request, got {n_images} "
            "(bench serve --max-images-per-request)",
            param="messages",
        )
    ids: TokenIds
    encode_chat = getattr(tokenizer, "encode_chat", None)
    if encode_chat is None:
        text = tokenizer.apply_chat_template(req.messages)
        _check_prompt_size([text], settings, "messages")
        ids, positions = await _tokenize_with_markers(tokenizer, text, n_images, packed)
    else:  # a tokenizer with its own instruct encoding (tekken): its ids, with special tokens no text spells
        # It renders and tokenizes in one call: the messages' text is bounded before it, and a long one
        # is encoded off the event loop, as a long completion prompt is (tokenize).
        texts = _message_texts(req.messages)
        _check_prompt_size(texts, settings, "messages")
        off_loop = sum(len(t) for t in texts) > OFF_LOOP_CHARS
        try:
            text, chat_ids, positions = (
                await asyncio.to_thread(encode_chat, req.messages) if off_loop else encode_chat(req.messages)
            )
        except ValueError as exc:  # its own rules (mistral-common: who may speak first)
            raise ProtocolError(str(exc), param="messages") from exc
        ids = pack_token_ids(chat_ids) if packed else chat_ids
        if len(positions) != n_images:
            raise ProtocolError(f"the prompt has {len(positions)} image tokens for {n_images} images", param="messages")
    ids, ranges = _expand_images(ids, positions, _image_token_id(tokenizer, settings), settings.image_tokens)
    # Check the context before the costly image decoding.
    max_tokens = _resolve_max_tokens(settings, len(ids), req.sampling.max_tokens, chat=True)
    mm_inputs = mm_hashes = None
    release = _nothing
    if n_images:
        images, release = await _process_images(req.image_urls, settings, alloc, budget)
        mm_inputs = [img.mm_input for img in images]
        mm_hashes = [img.mm_hash for img in images]
    try:
        request = _engine_request(
            "chatcmpl",
            text,
            ids,
            req.sampling,
            max_tokens,
            tokenizer,
            settings,
            mm_inputs=mm_inputs,
            mm_hashes=mm_hashes,
            mm_placeholders=ranges or None,
        )
    except BaseException:
        release()
        raise
    return Prepared(request, True, req.stream, req.stream_options, model, release)


async def _process_images(
    urls: list[str], settings: FrontendSettings, alloc: TensorAlloc | None = None, budget: PixelBudget | None = None
) -> tuple[list[ProcessedImage], Callable[[], None]]:
    """Decode (and convert) the images off the event loop, in order; with the function that gives
    their pixels back to ``budget`` (the caller calls it once the engine no longer needs them).

    Every image's header is read first and the request's pixels counted before
    any pixel is decoded: the work a request can cause is bounded per image
    (``max_image_pixels``), per request (``max_request_pixels``) and, through
    ``budget``, for all requests' decoded images at once (``max_inflight_pixels``).
    """

    def open_all() -> list[Any]:
        opened = []
        for i, url in enumerate(urls):
            try:
                opened.append(open_data_url(url, settings.max_image_bytes, settings.max_image_pixels))
            except ValueError as exc:
                raise ProtocolError(f"image {i}: {exc}", param="messages") from exc
        return opened

    def decode_all(opened: list[Any]) -> list[ProcessedImage]:
        # A request's tensors are taken all at once: never some held while waiting for the rest.
        targets: list[Any] = [None] * len(opened)
        if alloc is not None and settings.mm_payload == "tensor" and opened:
            size = settings.mm_tensor_size
            try:
                targets = alloc([(1, 3, size, size)] * len(opened), torch_dtype(settings.mm_tensor_dtype))
            except TransportError as exc:  # no room now: the client may retry (503), the message says what holds it
                raise ProtocolError(str(exc), status=503) from exc
        out = []
        for i, img in enumerate(opened):
            try:
                out.append(
                    process_image(
                        img,
                        payload=settings.mm_payload,
                        size=settings.mm_tensor_size,
                        dtype=settings.mm_tensor_dtype,
                        out=targets[i],
                    )
                )
            except ValueError as exc:
                raise ProtocolError(f"image {i}: {exc}", param="messages") from exc
        return out

    opened = await asyncio.to_thread(open_all)
    pixels = sum(img.width * img.height for img in opened)
    if pixels > settings.max_request_pixels:
        raise ProtocolError(
            f"the request's images have {pixels} pixels in all, over the limit of {settings.max_request_pixels}",
            param="messages",
        )
    if budget is None:
        return await asyncio.to_thread(decode_all, opened), _nothing
    release = await budget.acquire(pixels)
    try:
        return await asyncio.to_thread(decode_all, opened), release
    except BaseException:
        release()
        raise
