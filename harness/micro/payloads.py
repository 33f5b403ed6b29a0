"""The fixed messages ``bench micro`` and ``bench sweep`` time, and how many bytes each carries.

Every payload is built from ``SEED`` and nothing else, so two runs (and two
machines) time byte-identical messages:

- ``text-550``: a sonnet-size ``EngineCoreRequest``, 550 prompt token ids, a
  2 KiB prompt string and many non-default sampling parameters;
  ``text-550-packed`` is the same request with its ids packed as int32;
- ``outputs-64``: one decode step's ``EngineCoreOutputs``, 64 requests with one
  new token each; ``outputs-256`` the same with 256 requests (a big decode
  batch); ``outputs-64-logprobs5`` the 64 with the top-5 logprobs of each new
  token (``--logprobs 5``: 6 ids, 6 logprobs and a rank per token);
  ``outputs-64-stats`` the 64 with the scheduler's state (``--output-stats``);
- ``image-336`` / ``image-1024``: the text request plus one RGB ``PIL.Image``
  of that side and its placeholder;
- ``tensor-fp16-336`` / ``tensor-fp32-1024``: the same with a preprocessed
  ``pixel_values`` tensor [1, 3, side, side] instead of the image.

``text-550-path`` (``harness.micro.token_path``) is not a message but a prompt's ids along
the request path, from the tokenizer's output to the engine's model input; its bytes are
its request's.

Payload bytes (``payload_nbytes``), precisely: 8 bytes per token id
(``prompt_token_ids`` of a request, ``new_token_ids`` of every output, as
int64), plus the UTF-8 bytes of the prompt string and of every request id,
plus 8 bytes per logprob entry's id, value and rank,
plus the raw pixel bytes of each image (width x height x 3 for RGB) and the raw
bytes of each tensor (numel x element size). Sampling parameters, timestamps,
hashes, placeholders and counters are small metadata and are not counted.
"""

from __future__ import annotations

import hashlib
import random
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

if TYPE_CHECKING:  # torch is imported where a tensor payload is built: text payloads need none
    import torch

from harness.wire.messages import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    Logprobs,
    PlaceholderRange,
    SamplingParams,
    SchedulerStats,
    pack_token_ids,
)

SEED = 1234
VOCAB = 32000
PROMPT_TOKENS = 550
OUTPUT_BATCH = 64
# LLaVA-1.5 resizes every image to 336x336 and gives it 24x24 = 576 tokens,
# so both image sizes occupy the same placeholder.
IMAGE_TOKENS = 576
IMAGE_TOKEN_ID = 31999

# Words of Shakespeare's sonnet 18. The list (order and repeats included) is what
# the seeded generator draws from: changing it changes every text payload's bytes,
# and committed results would no longer compare with new ones.
_SONNET_18 = """
shall compare thee summer day thou art more lovely temperate rough winds do shake darling buds may
lease hath all too short date sometime hot eye heaven shines often his gold complexion dimmed every
fair from declines chance nature changing course untrimmed eternal shall not fade nor lose possession
ow'st death brag wander'st shade when lines time grow'st
"""
_WORDS = _SONNET_18.split()


def _request_id(rng: random.Random) -> str:
    return f"cmpl-{rng.getrandbits(128):032x}-0"


def prompt_text(rng: random.Random, nbytes: int = 2048) -> str:
    lines: list[str] = []
    size = 0
    while size < nbytes:
        line = " ".join(rng.choice(_WORDS) for _ in range(8)).capitalize() + ","
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)[:nbytes]


def _sampling_params() -> SamplingParams:
    # Many non-default fields, as an OpenAI-compatible client would send them.
    return SamplingParams(
        temperature=0.7,
        top_p=0.95,
        top_k=50,
        min_p=0.05,
        presence_penalty=0.1,
        frequency_penalty=0.2,
        repetition_penalty=1.05,
        seed=42,
        stop=["\n\n", "###", "</s>"],
        stop_token_ids=[2, 13, 29871],
        include_stop_str_in_output=True,
        max_tokens=150,
        min_tokens=1,
        logprobs=1,
        skip_special_tokens=False,
        logit_bias={50256: -100.0, 198: 2.5},
    )


def text_request(extra_tokens: int = 0) -> EngineCoreRequest:
    """The sonnet-size text request; ``extra_tokens`` placeholder ids follow the first token."""
    rng = random.Random(SEED)
    ids = [rng.randrange(VOCAB - 1) for _ in range(PROMPT_TOKENS)]
    ids[1:1] = [IMAGE_TOKEN_ID] * extra_tokens
    return EngineCoreRequest(
        request_id=_request_id(rng),
        prompt=prompt_text(rng),
        prompt_token_ids=ids,
        sampling_params=_sampling_params(),
        eos_token_id=2,
        arrival_time=1_700_000_000.123456,
    )


def _with_mm(item: Any, raw: bytes) -> EngineCoreRequest:
    req = text_request(extra_tokens=IMAGE_TOKENS)
    req.mm_inputs = [item]
    req.mm_hashes = [hashlib.sha256(raw).hexdigest()]
    req.mm_placeholders = [PlaceholderRange(offset=1, length=IMAGE_TOKENS)]
    return req


def image_request(side: int) -> EngineCoreRequest:
    pixels = np.random.default_rng(SEED).integers(0, 256, (side, side, 3), dtype=np.uint8)
    return _with_mm(Image.fromarray(pixels, "RGB"), pixels.tobytes())


def tensor_request(dtype: torch.dtype, side: int) -> EngineCoreRequest:
    import torch

    gen = torch.Generator().manual_seed(SEED)
    pixel_values = torch.rand((1, 3, side, side), generator=gen).to(dtype)
    raw = pixel_values.view(torch.uint8).numpy().tobytes()
    return _with_mm({"pixel_values": pixel_values}, raw)


def packed(req: EngineCoreRequest) -> EngineCoreRequest:
    req.prompt_token_ids = pack_token_ids(req.prompt_token_ids)
    return req


def outputs_batch(size: int = OUTPUT_BATCH, logprobs: int | None = None, stats: bool = False) -> EngineCoreOutputs:
    """One decode step: ``size`` requests with one new token each (and its top-``logprobs``; the
    scheduler's state with ``stats``, as ``--output-stats`` attaches it)."""
    rng = random.Random(SEED)
    outputs = []
    for _ in range(size):
        rid, tok = _request_id(rng), rng.randrange(VOCAB)
        out = EngineCoreOutput(request_id=rid, new_token_ids=[tok])
        if logprobs is not None:
            top = [rng.randrange(VOCAB) for _ in range(logprobs)]
            # float32 values, as a model's log-softmax gives them
            values = sorted((float(np.float32(-rng.random() * 8)) for _ in range(logprobs + 1)), reverse=True)
            out.new_logprobs = Logprobs(token_ids=[[tok, *top]], logprobs=[values], ranks=[1 + rng.randrange(4)])
        outputs.append(out)
    return EngineCoreOutputs(
        outputs=outputs,
        step_index=5400,
        step_start_time=1_700_000_100.25,
        timestamp=1_700_000_100.2731,
        scheduler_stats=SchedulerStats(size, 12, 0.4375, size) if stats else None,
    )


def _torch() -> Any:
    import torch

    return torch


# name -> builder; built lazily so a filtered run pays only for what it uses.
PAYLOADS: dict[str, Callable[[], Any]] = {
    "text-550": text_request,
    # The same request with its ids already packed as int32 (what msgspec-packed is given).
    "text-550-packed": lambda: packed(text_request()),
    "outputs-64": outputs_batch,
    "outputs-256": lambda: outputs_batch(256),
    "outputs-64-logprobs5": lambda: outputs_batch(OUTPUT_BATCH, logprobs=5),
    "outputs-64-stats": lambda: outputs_batch(OUTPUT_BATCH, stats=True),
    "image-336": lambda: image_request(336),
    "image-1024": lambda: image_request(1024),
    "tensor-fp16-336": lambda: tensor_request(_torch().float16, 336),
    "tensor-fp32-1024": lambda: tensor_request(_torch().float32, 1024),
}


def _mm_nbytes(item: Any) -> int:
    if isinstance(item, Image.Image):
        return len(item.tobytes())
    torch = sys.modules.get("torch")  # a tensor exists only once torch is imported
    if torch is not None and isinstance(item, torch.Tensor):
        return item.numel() * item.element_size()
    if isinstance(item, np.ndarray):
        return item.nbytes
    if isinstance(item, dict):
        return sum(_mm_nbytes(v) for v in item.values())
    raise TypeError(f"unexpected multimodal input {type(item).__name__}")


def payload_nbytes(msg: Any) -> int:
    """The payload's bytes as defined in the module docstring."""
    if isinstance(msg, EngineCoreRequest):
        n = 8 * len(msg.prompt_token_ids) + len(msg.request_id.encode())
        n += len(msg.prompt.encode()) if msg.prompt else 0
        return n + sum(_mm_nbytes(item) for item in msg.mm_inputs or ())
    if isinstance(msg, EngineCoreOutputs):
        n = sum(8 * len(o.new_token_ids) + len(o.request_id.encode()) for o in msg.outputs)
        for o in msg.outputs:
            if o.new_logprobs is not None:
                lp = o.new_logprobs
                n += 8 * (sum(map(len, lp.token_ids)) + sum(map(len, lp.logprobs)) + len(lp.ranks))
        return n
    raise TypeError(f"no payload size defined for {type(msg).__name__}")
