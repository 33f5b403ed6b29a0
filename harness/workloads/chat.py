"""A request's chat message and its token count through the chat template, as every dataset and the
client build them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from harness.tokenizers.tokenizer import TextTokenizer
from harness.workloads.progress import bar
from harness.workloads.sample import SampleRequest


def user_message(prompt: str, image_data_urls: Sequence[str] = ()) -> dict[str, Any]:
    """The OpenAI chat message for a request: text first, then one part per image."""
    if not image_data_urls:
        return {"role": "user", "content": prompt}
    parts: list[dict[str, Any]] = [{"type": "text", "text": prompt}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in image_data_urls]
    return {"role": "user", "content": parts}


def chat_prompt_len(tokenizer: TextTokenizer, prompt: str, image_data_urls: Sequence[str] = ()) -> int:
    """Tokens of ``prompt`` as the server sees it through the chat template."""
    return len(tokenizer.encode(tokenizer.apply_chat_template([user_message(prompt, image_data_urls)])))


def chat_requests(
    tokenizer: TextTokenizer, prompts: Sequence[str], urls: Sequence[tuple[str, ...]], output_lens: Sequence[int]
) -> list[SampleRequest]:
    """One request per prompt with its images, each counted through the chat template (batched); one
    without images keeps its formatted text, for the completions endpoint."""
    formatted: list[str] = []
    lens: list[int] = []
    pairs = list(zip(prompts, urls, strict=True))
    with bar(len(pairs), "counting prompt tokens", "prompt") as shown:
        for chunk in batches(pairs):
            texts = [tokenizer.apply_chat_template([user_message(p, u)]) for p, u in chunk]
            formatted += texts
            lens += [len(ids) for ids in tokenizer.encode_batch(texts)]
            shown.update(len(chunk))
    return [
        SampleRequest(
            prompt=p,
            prompt_len=n,
            expected_output_len=out,
            image_data_urls=u,
            completion_prompt=None if u else f,
        )
        for p, n, out, u, f in zip(prompts, lens, output_lens, urls, formatted, strict=True)
    ]


# Characters of prompt text per call into the tokenizer: a call runs in native code, where Ctrl-C and
# SIGTERM wait for it to return, so each stays well under a second (200 prompts of 8,192 tokens took
# 8 s in one call on this project's 2-core machine); batches this size still keep its threads busy.
BATCH_CHARS = 1 << 18


def batches(pairs: Sequence[tuple[str, tuple[str, ...]]]) -> Iterator[Sequence[tuple[str, tuple[str, ...]]]]:
    """``pairs`` of (prompt, image URLs) in runs of about BATCH_CHARS of prompt text, at least one each."""
    start, size = 0, 0
    for i, (prompt, _) in enumerate(pairs):
        if i > start and size + len(prompt) > BATCH_CHARS:
            yield pairs[start:i]
            start, size = i, 0
        size += len(prompt)
    if start < len(pairs):
        yield pairs[start:]
