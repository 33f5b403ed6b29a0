"""Logprobs in OpenAI's response shapes, from the engine's ``Logprobs`` (top-K per new token).

Completions (``logprobs: K``) carry parallel lists per chunk: ``tokens``,
``token_logprobs``, ``top_logprobs`` (token text → logprob) and ``text_offset``.
Chat (``logprobs: true, top_logprobs: K``) carries ``content``: one entry per
token with its text, logprob, UTF-8 bytes and its own ``top_logprobs`` list.
Each token id is decoded on its own, as vLLM does; ids repeat a lot across a
stream and across requests, so the texts decoded are kept once per tokenizer (at most
its vocabulary), not per request.

A streamed response sends each chunk's logprobs and forgets them: a stream of any
length holds one chunk's. Only a response built at the end (not streamed) keeps
every token's, in ``all``.
"""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

from harness.tokenizers.tokenizer import TextTokenizer
from harness.wire.messages import Logprobs

# Token id -> its text, per tokenizer: bounded by the vocabulary, shared by every request.
_TOKEN_TEXTS: WeakKeyDictionary[TextTokenizer, dict[int, str]] = WeakKeyDictionary()


class LogprobsRenderer:
    """One request's logprobs, chunk by chunk, in the completions or the chat shape.

    ``keep_all``: keep every chunk's entries in ``all`` for a response built at the end;
    a streamed one passes False, so nothing outlives the chunk it was sent in.
    """

    def __init__(self, tokenizer: TextTokenizer, chat: bool, keep_all: bool = True) -> None:
        self._tokenizer = tokenizer
        self._chat = chat
        self._texts = _TOKEN_TEXTS.setdefault(tokenizer, {})
        self.offset = 0  # completions' text_offset: characters of text before the token
        self.all: dict[str, list[Any]] | None = None
        if keep_all:
            self.all = {"content": []} if chat else _empty_completion()

    def _text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self._tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def render(self, lp: Logprobs | None) -> dict[str, list[Any]] | None:
        """This chunk's logprobs object (None when the engine sent none); kept in ``all`` if asked."""
        if lp is None:
            return None
        out: dict[str, list[Any]] = {"content": []} if self._chat else _empty_completion()
        for ids, values in zip(lp.token_ids, lp.logprobs, strict=True):
            texts = [self._text(t) for t in ids]
            if self._chat:
                top = [_chat_entry(t, v) for t, v in zip(texts[1:], values[1:], strict=True)]
                out["content"].append({**_chat_entry(texts[0], values[0]), "top_logprobs": top})
            else:
                out["tokens"].append(texts[0])
                out["token_logprobs"].append(values[0])
                out["top_logprobs"].append(dict(zip(texts[1:], values[1:], strict=True)))
                out["text_offset"].append(self.offset)
                self.offset += len(texts[0])
        if self.all is not None:
            for key, values in out.items():
                self.all[key].extend(values)
        return out


def _empty_completion() -> dict[str, list[Any]]:
    return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}


def _chat_entry(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8", "surrogatepass"))}
