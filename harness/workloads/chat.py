"""A request's chat message and its token count through the chat template, as every dataset and the
client build them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.wire.tokenizer import TextTokenizer


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
