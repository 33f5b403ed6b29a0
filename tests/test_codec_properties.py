"""Property tests: random wire messages round-trip through every codec.

Values (text, ids, ints, floats incl. NaN/inf/-0.0) come from hypothesis;
tensor/array/image contents come from a drawn seed, which shrinks as well and
keeps generation fast.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import wirecodecs
from harness.wire.messages import (
    EngineCoreAbort,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
    PlaceholderRange,
    SamplingParams,
)

from wire_samples import assert_wire_equal, frames_as

CODECS = wirecodecs.available_codecs()
CAPABLE = wirecodecs.codecs_that_carry_multimodal()
TEXT_ONLY = [n for n in CODECS if n not in CAPABLE]
# Codecs that carry bytes whatever they mean. `vllm` builds vLLM's own messages, whose
# SamplingParams validate and normalise (a NaN temperature is refused, greedy resets top_p):
# its requests are checked on valid samples in test_codec_conformance, its outputs below on
# outputs as our engine makes them.
BYTE_FAITHFUL = [n for n in CODECS if n != "vllm"]

PROPERTY = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --- scalars ----------------------------------------------------------------------

int64 = st.integers(-(2**63), 2**63 - 1)
small_int = st.integers(0, 2**31 - 1)
any_float = st.floats(allow_nan=True, allow_infinity=True)
text = st.text(max_size=40)  # full unicode, surrogates excluded (not UTF-8 encodable)
token_ids = st.lists(small_int, max_size=64)

sampling_params = st.builds(
    SamplingParams,
    n=st.integers(1, 8),
    best_of=st.none() | st.integers(1, 8),
    temperature=any_float,
    top_p=any_float,
    top_k=st.integers(-1, 1000),
    min_p=any_float,
    presence_penalty=any_float,
    frequency_penalty=any_float,
    repetition_penalty=any_float,
    seed=st.none() | int64,
    stop=st.lists(text, max_size=4),
    stop_token_ids=st.lists(small_int, max_size=4),
    include_stop_str_in_output=st.booleans(),
    ignore_eos=st.booleans(),
    max_tokens=st.none() | st.integers(0, 1 << 20),
    min_tokens=st.integers(0, 64),
    logprobs=st.none() | st.integers(0, 20),
    prompt_logprobs=st.none() | st.integers(0, 20),
    skip_special_tokens=st.booleans(),
    spaces_between_special_tokens=st.booleans(),
    detokenize=st.booleans(),
    logit_bias=st.none() | st.dictionaries(small_int, any_float, max_size=5),
)

# --- multimodal values --------------------------------------------------------------

TENSOR_DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int64,
    torch.int8,
    torch.uint8,
    torch.bool,
]
ARRAY_DTYPES = ["<f4", ">f4", "<f8", ">i8", "<i2", ">u4", "|u1", "|b1", "<M8[s]"]
IMAGE_MODES = ["RGB", "RGBA", "L", "P", "I;16", "1", "F", "LA"]
# Edge shapes (0-d, zero-size) drawn often: they are where layouts go wrong.
shapes = st.sampled_from([[], [0], [3, 0]]) | st.lists(st.integers(0, 12), max_size=3)


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(TENSOR_DTYPES))
    shape = draw(shapes)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    if dtype.is_floating_point:
        t = (torch.randn(shape, generator=gen) * 100).to(dtype)
        if t.numel() and draw(st.booleans()):
            t.view(-1)[0] = draw(st.sampled_from([float("nan"), float("inf"), -0.0]))
    else:
        t = torch.randint(-128, 256, shape, generator=gen).to(dtype)
    if t.dim() >= 2 and draw(st.booleans()):
        t = t.transpose(0, 1)  # non-contiguous
    return t


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray:
    dtype = np.dtype(draw(st.sampled_from(ARRAY_DTYPES)))
    shape = tuple(draw(shapes))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    raw = rng.integers(0, 256, int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    a = raw.view(dtype).reshape(shape)  # any bit pattern: NaNs, NaT, subnormals
    return a.T if draw(st.booleans()) else a


@st.composite
def images(draw: st.DrawFn) -> Image.Image:
    mode = draw(st.sampled_from(IMAGE_MODES))
    size = (draw(st.integers(0, 20)), draw(st.integers(0, 20)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    probe = Image.new(mode, (size[0], 1))
    nbytes = len(probe.tobytes()) * size[1]
    img = (
        Image.frombytes(mode, size, rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes())
        if nbytes
        else Image.new(mode, size)
    )
    if mode == "P":
        colors = draw(st.integers(1, 256))
        img.putpalette(rng.integers(0, 256, 3 * colors, dtype=np.uint8).tobytes(), "RGB")
    return img


mm_item = images() | st.dictionaries(st.text(min_size=1, max_size=12), tensors() | arrays(), min_size=1, max_size=3)

# --- messages ----------------------------------------------------------------------


@st.composite
def requests(draw: st.DrawFn, multimodal: bool) -> EngineCoreRequest:
    mm_inputs = draw(st.none() | st.lists(mm_item, min_size=1, max_size=3)) if multimodal else None
    n = len(mm_inputs or ())
    return EngineCoreRequest(
        request_id=draw(text),
        prompt=draw(st.none() | st.text(max_size=200)),
        prompt_token_ids=draw(token_ids),
        sampling_params=draw(sampling_params),
        eos_token_id=draw(st.none() | small_int),
        arrival_time=draw(any_float),
        mm_inputs=mm_inputs,
        mm_hashes=[draw(text) for _ in range(n)] if mm_inputs else draw(st.none() | st.lists(text, max_size=2)),
        mm_placeholders=[PlaceholderRange(draw(small_int), draw(small_int)) for _ in range(n)] if mm_inputs else None,
        lora_request=draw(st.none() | text),
        cache_salt=draw(st.none() | text),
        priority=draw(int64),
    )


engine_outputs = st.builds(
    EngineCoreOutput,
    request_id=text,
    new_token_ids=st.lists(small_int, max_size=8),
    finished=st.booleans(),
    finish_reason=st.none() | st.sampled_from(FinishReason),
    stop_reason=st.none() | int64 | text,
    num_cached_tokens=st.integers(0, 1 << 20),
    error=st.none() | text,
)

output_batches = st.builds(
    EngineCoreOutputs,
    outputs=st.lists(engine_outputs, max_size=20),
    step_index=st.integers(0, 2**63 - 1),
    step_start_time=any_float,
    timestamp=any_float,
)

aborts = st.builds(EngineCoreAbort, request_ids=st.lists(text, max_size=10))

frame_kinds = st.sampled_from(["as-encoded", "bytes", "memoryview"])


def assert_roundtrip(name: str, msg: Any, kind: str) -> None:
    frames = wirecodecs.get_codec(name).encode(msg)
    if kind != "as-encoded":
        frames = frames_as(frames, kind)
    assert_wire_equal(msg, wirecodecs.get_codec(name).decode(frames, type(msg)))


# --- properties --------------------------------------------------------------------


@pytest.mark.parametrize("name", BYTE_FAITHFUL)
@PROPERTY
@given(data=st.data(), kind=frame_kinds)
def test_request_roundtrip(name: str, data: st.DataObject, kind: str) -> None:
    msg = data.draw(requests(multimodal=name in CAPABLE))
    assert_roundtrip(name, msg, kind)


@pytest.mark.parametrize("name", BYTE_FAITHFUL)
@PROPERTY
@given(msg=output_batches, kind=frame_kinds)
def test_outputs_roundtrip(name: str, msg: EngineCoreOutputs, kind: str) -> None:
    assert_roundtrip(name, msg, kind)


@st.composite
def engine_made_outputs(draw: st.DrawFn) -> EngineCoreOutput:
    """An output as our engine makes one: finished iff a reason, an error text only on an error."""
    reason = draw(st.none() | st.sampled_from(FinishReason))
    failed = reason in (FinishReason.ERROR, FinishReason.REJECTED)
    return EngineCoreOutput(
        request_id=draw(text),
        new_token_ids=draw(st.lists(small_int, max_size=8)),
        finished=reason is not None,
        finish_reason=reason,
        stop_reason=draw(st.none() | int64 | text) if reason is FinishReason.STOP else None,
        num_cached_tokens=draw(st.integers(0, 1 << 20)),
        error=draw(text) if failed else None,
    )


@pytest.mark.vllm
@PROPERTY
@given(
    outputs=st.lists(engine_made_outputs(), max_size=20),
    step_index=st.integers(0, 2**63 - 1),
    timestamp=st.floats(min_value=1.0, allow_nan=False, allow_infinity=False),
    kind=frame_kinds,
)
def test_vllm_carries_engine_outputs(
    outputs: list[EngineCoreOutput], step_index: int, timestamp: float, kind: str
) -> None:
    """Everything but step_start_time (vLLM's EngineCoreOutputs has no such field) comes back."""
    assert_roundtrip("vllm", EngineCoreOutputs(outputs=outputs, step_index=step_index, timestamp=timestamp), kind)


@pytest.mark.parametrize("name", CODECS)
@PROPERTY
@given(msg=aborts, kind=frame_kinds)
def test_abort_roundtrip(name: str, msg: EngineCoreAbort, kind: str) -> None:
    assert_roundtrip(name, msg, kind)


@pytest.mark.parametrize("name", TEXT_ONLY)
@settings(PROPERTY, max_examples=25)
@given(msg=requests(multimodal=True).filter(lambda m: bool(m.mm_inputs)))
def test_text_only_codec_refuses_multimodal(name: str, msg: EngineCoreRequest) -> None:
    with pytest.raises(wirecodecs.UnsupportedPayloadError) as info:
        wirecodecs.get_codec(name).encode(msg)
    assert info.value.codec == name
    kind = {"torch": "tensor", "numpy": "array", "PIL": "image"}[info.value.type_name.partition(".")[0]]
    assert info.value.capable == wirecodecs.codecs_that_carry_multimodal(kind)
