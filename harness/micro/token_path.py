"""``text-550-path``: a prompt's token ids from the tokenizer's output to the engine's model input.

The other payloads time a codec on a finished message. This one times the ids of a
text prompt along the request path, per codec, as the server runs it:

- send (the table's enc column): from what the frontend holds after the BPE, the project
  tokenizer's ``Encoding`` of a sonnet-style prompt of ``PROMPT_TOKENS`` tokens (made
  untimed), to frames: the ids in the form the codec takes (``Encoding.ids``, a list, or
  for a codec with packed token ids ``ids_array``'s int32 array: the calls
  ``TextTokenizer.encode`` and ``encode_array`` make after the BPE), set on the request,
  encoded;
- receive (dec): decode, then what the engine does with the prompt ids to make the
  model's input: the scheduler's chunk of the prompt (``ids[0:n]``: a view of an array, a
  copy of a list), the step's int64 token array (``step_token_ids``) and the staged tensor
  (``Stager.ints`` on the CPU, where the staged buffer is the model's input).

Left out: the BPE itself, and the scheduler's admission check of the ids against the
vocabulary (min and max: per item on a list, vectorised on an array).

A codec with an adapter (``vllm``) is timed on its native message, as ``measure_cell``
times it: the ids are set on the native request, which carries them under the same name.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import torch
from tokenizers import Encoding

import wirecodecs
from harness.engine.staging import Stager, step_token_ids
from harness.micro.payloads import PROMPT_TOKENS, SEED, prompt_text, text_request
from harness.tokenizers.tokenizer import TextTokenizer, ids_array, load_tokenizer
from harness.wire.messages import EngineCoreRequest

# The stager of a CPU engine: its staged buffer is the model's input tensor.
_CPU = torch.device("cpu")


@dataclass
class TokenPath:
    """A prompt as the frontend holds it after the BPE, and the request its ids go in."""

    encoding: Encoding
    request: EngineCoreRequest  # text-550's request with this prompt's text; its ids are set per send


def sonnet_prompt(tokenizer: TextTokenizer, tokens: int = PROMPT_TOKENS) -> tuple[str, Encoding]:
    """text-550's sonnet-style text (drawn from ``SEED``), cut to exactly ``tokens`` tokens, and its encoding."""
    text = prompt_text(random.Random(SEED), 16 * tokens)  # over 2 bytes a token: long enough
    offsets = tokenizer.encoding(text).offsets
    # Cut after a token's characters and encode the cut text: its own encoding is what the frontend
    # would hold (a merge across the cut can change the last token, so a few cuts may be tried).
    for n in range(tokens, tokens + 16):
        cut = text[: offsets[n - 1][1]]
        encoding = tokenizer.encoding(cut)
        if len(encoding) == tokens:
            return cut, encoding
    raise RuntimeError(f"no cut of the sonnet text tokenizes to {tokens} tokens")  # pragma: no cover


def text_path(tokens: int = PROMPT_TOKENS) -> TokenPath:
    """``text-550-path``'s prompt, or the same kind of prompt cut to ``tokens`` tokens (a long prompt's path)."""
    tokenizer = load_tokenizer()
    text, encoding = sonnet_prompt(tokenizer, tokens)
    request = text_request()
    request.prompt = text
    request.prompt_token_ids = encoding.ids
    return TokenPath(encoding, request)


# name -> builder, beside harness.micro.payloads.PAYLOADS (messages): these time a path, not one message.
PATH_PAYLOADS: dict[str, Callable[[], TokenPath]] = {"text-550-path": text_path}


def frontend_ids(encoding: Encoding, packed: bool) -> Any:
    """What the frontend does with the BPE's output (``TextTokenizer.encode`` / ``encode_array`` after it)."""
    return ids_array(encoding) if packed else encoding.ids


def engine_input(ids: Sequence[int], stager: Stager) -> torch.Tensor:
    """The model's input tensor of a decoded prompt, as the engine makes it for a prefill of the whole prompt."""
    chunk = ids[0 : len(ids)]  # the scheduler's chunk (_Request.tokens): a view of an array, a copy of a list
    return stager.ints(step_token_ids((), [chunk]))[0]


class PathCalls:
    """One codec's path for a ``TokenPath``: ``send()`` gives the frames, ``receive(frames)`` the model input."""

    def __init__(self, codec_name: str, path: TokenPath) -> None:
        self.calls = wirecodecs.CodecCalls(wirecodecs.get_codec(codec_name))
        self.packed = wirecodecs.packs_token_ids(codec_name)
        self.encoding = path.encoding
        # Everything but the ids is made once, untimed: native is our request itself without an adapter.
        self.native = self.calls.to_native(msgspec.structs.replace(path.request))
        self.stager = Stager(_CPU)

    def send(self) -> list[Any]:
        self.native.prompt_token_ids = frontend_ids(self.encoding, self.packed)
        return self.calls.encode(self.native)

    def receive(self, frames: Sequence[Any]) -> torch.Tensor:
        native = self.calls.decode(frames, EngineCoreRequest)
        return engine_input(native.prompt_token_ids, self.stager)

    def check(self, frames: Sequence[Any]) -> None:
        """Raise unless the path delivers the prompt's ids to the model input, unchanged and as int64."""
        got = self.receive(frames)
        want = self.encoding.ids
        if got.dtype != torch.int64 or got.tolist() != want:
            raise AssertionError("the model input differs from the prompt's ids")
        decoded = self.calls.from_native(self.calls.decode(frames, EngineCoreRequest), EngineCoreRequest)
        if np.asarray(decoded.prompt_token_ids).tolist() != want:
            raise AssertionError("the decoded request's ids differ from the prompt's")
