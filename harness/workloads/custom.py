"""``custom``: your own requests from a JSONL file, as vLLM's ``bench serve --dataset-name custom``, widened.

One request per line: ``{"prompt": str}`` or ``{"messages": [{"role": ..., "content": ...}, ...]}``,
with an optional ``"output_tokens"`` (its max_tokens) and, for a prompt, optional ``"images"``: file
paths (relative to the JSONL file's folder) or data URLs, sent as image parts of the user message
(they need ``--endpoint /v1/chat/completions``). A request's max_tokens is ``--custom-output-len``
when given, else its line's ``output_tokens``, else 256 (vLLM's default). As vLLM does, a prompt is
rendered through the chat template for /v1/completions (``--custom-skip-chat-template`` sends it raw)
and ``prompt_len`` counts what is sent; messages go as they are to the chat endpoint and rendered
through the template for completions. Lines are shuffled with ``--seed`` (as vLLM does) and taken
until ``--num-prompts``; a file with fewer lines is drawn again, with replacement. Takes no synthetic
images (``--images-per-request``): a line brings its own.

``--dataset-path`` defaults to ``datasets/samples/custom-sample.jsonl``, a generated sample.
"""

from __future__ import annotations

import base64
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.settings.declare import setting
from harness.tokenizers.tokenizer import TextTokenizer
from harness.workloads.base import Sampling, check_counts, token_count
from harness.workloads.chat import user_message
from harness.workloads.files import DatasetFileError, count_field, dataset_file, field, read_jsonl
from harness.workloads.sample import SampleRequest

SAMPLE = "custom-sample.jsonl"
DEFAULT_OUTPUT_LEN = 256  # vLLM's --custom-output-len default
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp"}
IMAGE_TYPES[".gif"] = "image/gif"


@dataclass(frozen=True)
class CustomOptions:
    custom_output_len: int | None = setting(
        None,
        flag="--custom-output-len",
        type=token_count,
        help=f"max_tokens of every request (default: a line's output_tokens, else {DEFAULT_OUTPUT_LEN})",
        comparable=True,
    )
    custom_skip_chat_template: bool = setting(
        False,
        flag="--custom-skip-chat-template",
        help="send a prompt line to /v1/completions as it is, not through the chat template",
        comparable=True,
    )


@dataclass(frozen=True)
class CustomLine:
    """One request of the file: exactly one of ``prompt`` and ``messages``."""

    prompt: str | None
    messages: tuple[dict[str, Any], ...] | None
    output_tokens: int | None
    images: tuple[str, ...]


def _image_url(ref: Any, folder: Path, where: str) -> str:
    if not isinstance(ref, str):
        raise DatasetFileError(f"{where}: an image must be a path or a data URL, got {type(ref).__name__}")
    if ref.startswith("data:"):
        return ref
    file = (folder / ref).expanduser()
    kind = IMAGE_TYPES.get(file.suffix.lower())
    if kind is None:
        raise DatasetFileError(f"{where}: image {ref!r} is not one of {', '.join(IMAGE_TYPES)}")
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise DatasetFileError(f"{where}: image {ref!r} cannot be read: {exc.strerror}") from None
    return f"data:{kind};base64,{base64.b64encode(data).decode('ascii')}"


def parse_line(record: dict[str, Any], folder: Path, where: str) -> CustomLine:
    """One line's request; DatasetFileError naming ``where`` for a missing or malformed field."""
    if ("prompt" in record) == ("messages" in record):
        raise DatasetFileError(f"{where}: needs a 'prompt' or a 'messages' field (one of them)")
    output = count_field(record, "output_tokens", where) if "output_tokens" in record else None
    raw_images = field(record, "images", list, where) if "images" in record else []
    if "prompt" in record:
        images = tuple(_image_url(ref, folder, f"{where}, images[{i}]") for i, ref in enumerate(raw_images))
        return CustomLine(field(record, "prompt", str, where), None, output, images)
    if raw_images:
        raise DatasetFileError(f"{where}: 'images' goes with a 'prompt'; put image parts in the messages instead")
    messages = field(record, "messages", list, where)
    if not messages:
        raise DatasetFileError(f"{where}: 'messages' is empty")
    return CustomLine(None, tuple(messages), output, ())


def read_custom_lines(file: Path) -> list[tuple[str, CustomLine]]:
    """(where, request) for every line of ``file``."""
    lines = [
        (f"{file}, line {n}", parse_line(record, file.parent, f"{file}, line {n}")) for n, record in read_jsonl(file)
    ]
    if not lines:
        raise DatasetFileError(f"{file}: no requests (one JSON object a line)")
    return lines


def _request(tokenizer: TextTokenizer, line: CustomLine, output_len: int, raw: bool, where: str) -> SampleRequest:
    try:
        if line.messages is not None:
            formatted = tokenizer.apply_chat_template(line.messages)
            n = len(tokenizer.encode(formatted))
            return SampleRequest(formatted, n, output_len, completion_prompt=formatted, messages=line.messages)
        prompt = line.prompt or ""
        if raw:
            return SampleRequest(prompt, len(tokenizer.encode(prompt)), output_len, line.images)
        formatted = tokenizer.apply_chat_template([user_message(prompt, line.images)])
        n = len(tokenizer.encode(formatted))
        return SampleRequest(prompt, n, output_len, line.images, completion_prompt=None if line.images else formatted)
    except ValueError as exc:  # a malformed message the chat template refuses
        raise DatasetFileError(f"{where}: {exc}") from None


def sample_custom_requests(
    tokenizer: TextTokenizer,
    num_requests: int,
    output_len: int | None = None,
    skip_chat_template: bool = False,
    dataset_path: str | Path | None = None,
    seed: int = 0,
) -> list[SampleRequest]:
    check_counts(num_requests, output_len, "--custom-output-len")
    lines = read_custom_lines(dataset_file(dataset_path, SAMPLE))
    rng = random.Random(seed)
    rng.shuffle(lines)
    chosen = lines[:num_requests] + rng.choices(lines, k=max(0, num_requests - len(lines)))
    return [
        _request(tokenizer, line, output_len or line.output_tokens or DEFAULT_OUTPUT_LEN, skip_chat_template, where)
        for where, line in chosen
    ]


class CustomDataset:
    name = "custom"
    options = CustomOptions
    takes_images = False

    def sample(self, tokenizer: TextTokenizer, options: CustomOptions, sampling: Sampling) -> list[SampleRequest]:
        return sample_custom_requests(
            tokenizer,
            num_requests=sampling.num_requests,
            output_len=options.custom_output_len,
            skip_chat_template=options.custom_skip_chat_template,
            dataset_path=sampling.dataset_path,
            seed=sampling.seed,
        )


CUSTOM = CustomDataset()
