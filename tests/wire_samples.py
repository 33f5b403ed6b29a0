"""Sample wire messages and a deep equality check, shared by the codec tests.

Builders return fresh objects on every call (tests may hold frames that point
into a message's tensors). ``assert_wire_equal`` compares bit for bit, so NaN
equals NaN and -0.0 differs from 0.0: a codec must move bytes, not values.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import torch
from PIL import Image

from harness.wire.messages import (
    EngineCoreAbort,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
    Logprobs,
    PlaceholderRange,
    SamplingParams,
    SchedulerStats,
)

# --- what each built-in codec promises ---------------------------------------


@dataclass(frozen=True)
class CodecExpectation:
    carries_multimodal: bool
    # Sends image/tensor/array buffers as frames of their own.
    out_of_band: bool
    # Codecs of one family may share a wire format for some messages (text
    # requests are byte-identical across the msgspec codecs); across families
    # frames must never decode.
    family: str
    # Kinds of values ("tensor", "array", "image") sent as wirecodecs.rawbuf
    # headers plus bytes, so only rawbuf's dtypes/modes are accepted (anything
    # else is an EncodeError). The others are left to torch's/numpy's/PIL's own
    # pickling.
    rawbuf: frozenset[str] = frozenset()
    # The multimodal kinds it carries (when it carries any); the others it refuses.
    kinds: frozenset[str] = frozenset({"tensor", "array", "image"})
    # Its schema has no place for these fields ("Type.field"): they come back at their default.
    not_carried: frozenset[str] = frozenset()
    # Fields its message type re-stamps when left at 0.0 (vLLM's EngineCoreOutputs.timestamp).
    restamped: frozenset[str] = frozenset()
    # Sample tensors (sample_tensors keys) its encoder refuses with an EncodeError.
    refused_tensors: frozenset[str] = frozenset()
    # Frames after the ones its body refers to are ignored, not refused (vLLM's MsgpackDecoder).
    ignores_extra_frames: bool = False
    # Makes a sample message valid by the codec's own rules (vLLM validates SamplingParams).
    prepare: Callable[[Any], Any] = field(default=lambda msg: msg)

    def carries(self, kind: str) -> bool:
        return self.carries_multimodal and kind in self.kinds

    def delivered(self, msg: Any, decoded: Any) -> Any:
        """What ``msg`` should come back as: fields not carried at their default, re-stamped ones as decoded."""
        name = type(msg).__name__
        changes = {}
        for key in msg.__struct_fields__:
            if f"{name}.{key}" in self.not_carried:
                changes[key] = _default_of(msg, key)
            if f"{name}.{key}" in self.restamped and getattr(msg, key) == 0.0:
                changes[key] = getattr(decoded, key)
        return msgspec.structs.replace(msg, **changes) if changes else msg


def prepared(codec: str, msg: Any) -> Any:
    """``msg`` made valid by the codec's own rules (unlisted codecs: as is)."""
    exp = EXPECTATIONS.get(codec)
    return exp.prepare(msg) if exp else msg


def assert_delivered(codec: str, msg: Any, decoded: Any, path: str = "msg") -> None:
    """``decoded`` is ``msg`` as the codec delivers it (fields its schema lacks at their default)."""
    exp = EXPECTATIONS.get(codec)
    assert_wire_equal(exp.delivered(msg, decoded) if exp else msg, decoded, path)


def _default_of(msg: Any, key: str) -> Any:
    fields = {f.name: f for f in msgspec.structs.fields(type(msg))}
    f = fields[key]
    if f.default is not msgspec.NODEFAULT:
        return f.default
    if f.default_factory is not msgspec.NODEFAULT:
        return f.default_factory()
    return None  # a required field the codec's schema lacks (EngineCoreRequest.prompt: str | None)


def _vllm_valid(msg: Any) -> Any:
    """vLLM refuses stop strings without detokenize (VLLMValidationError): the sample keeps them."""
    if isinstance(msg, EngineCoreRequest) and msg.sampling_params.stop:
        msg.sampling_params.detokenize = True
    return msg


_ALL = frozenset({"tensor", "array", "image"})
# Every registered codec must appear here; test_codec_conformance fails otherwise.
EXPECTATIONS: dict[str, CodecExpectation] = {
    "pickle": CodecExpectation(True, out_of_band=False, family="pickle"),
    "pickle-oob": CodecExpectation(True, out_of_band=True, family="pickle", rawbuf=frozenset({"tensor", "image"})),
    "msgspec": CodecExpectation(False, out_of_band=False, family="msgpack"),
    "msgspec-b64": CodecExpectation(True, out_of_band=False, family="msgpack", rawbuf=_ALL),
    "msgspec-oob": CodecExpectation(True, out_of_band=True, family="msgpack", rawbuf=_ALL),
    "msgspec-packed": CodecExpectation(True, out_of_band=True, family="msgpack", rawbuf=_ALL),
    # vLLM 0.33's own messages (wirecodecs/vllm_messages.py says how ours map onto them).
    "vllm": CodecExpectation(
        True,
        out_of_band=True,
        family="vllm",
        kinds=frozenset({"tensor"}),
        not_carried=frozenset({"EngineCoreRequest.prompt", "EngineCoreOutputs.step_start_time"}),
        restamped=frozenset({"EngineCoreOutputs.timestamp"}),
        # vLLM's encoder views a tensor's bytes as uint8, which torch refuses for a conjugate view.
        refused_tensors=frozenset({"complex64_conj"}),
        ignores_extra_frames=True,
        prepare=_vllm_valid,
    ),
}

UNICODE_TEXT = "Grüße, 世界! 🚀🦙 naïve café — ﷽ x\u0301 \u200d👩‍💻 \u00a0end"

# --- messages ------------------------------------------------------------------


def full_sampling_params() -> SamplingParams:
    """Every field away from its default, so omit_defaults hides nothing."""
    return SamplingParams(
        n=2,
        best_of=3,
        temperature=0.7,
        top_p=0.95,
        top_k=40,
        min_p=0.05,
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        repetition_penalty=1.1,
        seed=1234567890123,
        stop=["\n\n", "</s>", "Ende ✋"],
        stop_token_ids=[2, 32000],
        include_stop_str_in_output=True,
        ignore_eos=True,
        max_tokens=None,
        min_tokens=4,
        logprobs=5,
        prompt_logprobs=1,
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        detokenize=False,
        logit_bias={50256: -100.0, 7: 2.5},
    )


def text_request(
    request_id: str = "cmpl-0001",
    prompt: str | None = "Shall I compare thee to a summer's day?",
    num_tokens: int = 12,
) -> EngineCoreRequest:
    return EngineCoreRequest(
        request_id=request_id,
        prompt=prompt,
        prompt_token_ids=[(i * 7919) % 32000 for i in range(num_tokens)],
        sampling_params=full_sampling_params(),
        eos_token_id=2,
        arrival_time=1733131200.123456,
        lora_request="adapter-a",
        cache_salt="salt",
        priority=-3,
    )


def multimodal_request(mm_inputs: list[Any], request_id: str = "chatcmpl-mm") -> EngineCoreRequest:
    return EngineCoreRequest(
        request_id=request_id,
        prompt="<image> What is in this picture?",
        prompt_token_ids=list(range(40)),
        sampling_params=SamplingParams(temperature=0.0, max_tokens=32),
        eos_token_id=2,
        arrival_time=1733131200.5,
        mm_inputs=mm_inputs,
        mm_hashes=[f"hash-{i}" for i in range(len(mm_inputs))],
        mm_placeholders=[PlaceholderRange(offset=1 + 8 * i, length=8) for i in range(len(mm_inputs))],
    )


def output_batch(num_requests: int = 64) -> EngineCoreOutputs:
    reasons = [None, FinishReason.STOP, FinishReason.LENGTH, FinishReason.ABORT]
    outputs = []
    for i in range(num_requests):
        reason = reasons[i % len(reasons)]
        outputs.append(
            EngineCoreOutput(
                request_id=f"cmpl-{i:04d}",
                new_token_ids=[1000 + i] if i % 5 else [1000 + i, 1001 + i, 1002 + i],
                finished=reason is not None,
                finish_reason=reason,
                stop_reason=("</s>" if i % 8 == 1 else 2) if reason is FinishReason.STOP else None,
                num_cached_tokens=16 * (i % 3),
                # Every third asks for top-3 logprobs (float32 values, as a model's).
                new_logprobs=sample_logprobs(1000 + i, 3) if i % 3 == 0 else None,
            )
        )
    outputs.append(
        EngineCoreOutput(
            request_id="cmpl-bad",
            new_token_ids=[],
            finished=True,
            finish_reason=FinishReason.ERROR,
            error="prompt too long: 5000 > 4096 tokens",
        )
    )
    return EngineCoreOutputs(
        outputs=outputs,
        step_index=4711,
        step_start_time=1733131201.25,
        timestamp=1733131201.2625,
        scheduler_stats=SchedulerStats(
            num_running_reqs=64, num_waiting_reqs=3, kv_cache_usage=0.375, num_scheduled_tokens=70
        ),
    )


def sample_logprobs(token: int, k: int) -> Logprobs:
    values = [-0.125, -0.125, -1.5, -2.75][: k + 1]  # exactly representable in float32
    return Logprobs(token_ids=[[token, token, 7, 8][: k + 1]], logprobs=[values], ranks=[1])


def abort_message(num_requests: int = 3) -> EngineCoreAbort:
    return EngineCoreAbort(request_ids=[f"cmpl-{i:04d}" for i in range(num_requests)])


def text_messages() -> dict[str, Any]:
    """One message of each type, none multimodal."""
    return {"request": text_request(), "outputs": output_batch(), "abort": abort_message()}


# --- multimodal values ------------------------------------------------------------


def sample_tensors() -> dict[str, torch.Tensor]:
    """Tensors every multimodal codec must carry: dtypes, layouts, edge shapes."""
    gen = torch.Generator().manual_seed(0)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-30])
    base = torch.randn(64, 48, generator=gen)
    return {
        "bf16": torch.randn(3, 32, 32, generator=gen).to(torch.bfloat16),
        "fp16": torch.randn(3, 32, 32, generator=gen).to(torch.float16),
        "fp32": torch.randn(3, 32, 32, generator=gen),
        "fp32_special": special,  # small: travels inline
        "fp64": torch.randn(40, generator=gen, dtype=torch.float64),
        "int64": torch.randint(-(2**62), 2**62, (50,), generator=gen, dtype=torch.int64),
        "int32": torch.randint(-(2**31), 2**31 - 1, (7,), generator=gen, dtype=torch.int32),
        "uint8": torch.randint(0, 256, (2, 300), generator=gen, dtype=torch.uint8),
        "bool": torch.rand(33, generator=gen) > 0.5,
        "complex64": torch.randn(40, generator=gen, dtype=torch.complex64),
        "complex64_conj": torch.randn(40, generator=gen, dtype=torch.complex64).conj(),
        "non_contiguous_t": base.t(),
        "non_contiguous_step": base[:, ::3],
        "zero_size": torch.empty(0, 5),
        "zero_size_mid": torch.empty(3, 0, 2, dtype=torch.bfloat16),
        "zero_dim": torch.tensor(3.25),
        "zero_dim_int": torch.tensor(-7, dtype=torch.int64),
    }


def sample_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    base = rng.standard_normal((64, 48)).astype(np.float32)
    return {
        "f4": rng.standard_normal((3, 32, 32)).astype(np.float32),
        "f4_big_endian": rng.standard_normal((100,)).astype(">f4"),
        "i8_big_endian": np.arange(-50, 50, dtype=">i8"),
        "u2_little": np.arange(300, dtype="<u2"),
        "f8_special": np.array([np.nan, np.inf, -np.inf, -0.0, 5e-324]),
        "bool": rng.random(40) > 0.5,
        "datetime": np.array(["2024-01-01T00:00", "1970-01-01T00:00"], dtype="M8[s]"),
        "fortran": np.asfortranarray(base),
        "non_contiguous": base[::2, 1::3],
        "zero_size": np.empty((0, 4), dtype=np.float32),
        "zero_dim": np.array(2.5, dtype=">f8"),
    }


def _pixels(size: tuple[int, int], channels: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size[0] * size[1] * channels, dtype=np.uint8).tobytes()


def sample_images() -> dict[str, Image.Image]:
    """PIL images in the modes a vision frontend meets (palette included)."""
    size = (64, 48)
    palette_img = Image.frombytes("P", size, bytes(b % 16 for b in _pixels(size, 1, 4)))
    palette_img.putpalette(bytes(_pixels((16, 1), 3, 5)), "RGB")  # 16-colour palette
    i16 = np.random.default_rng(6).integers(0, 65536, size[0] * size[1], dtype=np.uint16)
    return {
        "RGB": Image.frombytes("RGB", size, _pixels(size, 3, 1)),
        "RGBA": Image.frombytes("RGBA", size, _pixels(size, 4, 2)),
        "L": Image.frombytes("L", size, _pixels(size, 1, 3)),
        "P": palette_img,
        "I;16": Image.frombytes("I;16", size, i16.astype("<u2").tobytes()),
        "RGB_tiny": Image.frombytes("RGB", (3, 2), _pixels((3, 2), 3, 7)),  # travels inline
        "1": Image.frombytes("1", (13, 5), _pixels((2, 5), 1, 8)),  # rows padded to bytes
        "F": Image.frombytes("F", (8, 8), np.linspace(-1, 1, 64, dtype="<f4").tobytes()),
        "RGB_empty": Image.new("RGB", (0, 5)),
    }


def mixed_mm_inputs() -> list[Any]:
    """A request's worth of items: images and processed dicts of tensors/arrays."""
    images = sample_images()
    tensors = sample_tensors()
    return [
        images["RGB"],
        {"pixel_values": tensors["bf16"], "image_grid_thw": torch.tensor([[1, 4, 4]])},
        images["P"],
        {"pixel_values": sample_arrays()["f4"], "mask": tensors["bool"]},
    ]


# --- frames as a transport delivers them -------------------------------------------


def frames_as(frames: list[Any], kind: str) -> list[Any]:
    """Copies of ``frames`` as ``bytes``, ``bytearray`` or ``memoryview``."""
    raw = [bytes(memoryview(f).cast("B")) for f in frames]
    if kind == "bytes":
        return raw
    if kind == "bytearray":
        return [bytearray(f) for f in raw]
    if kind == "memoryview":
        return [memoryview(f) for f in raw]
    raise ValueError(f"unknown frame kind {kind!r}")


def frame_bytes(frame: Any) -> bytes:
    return bytes(memoryview(frame).cast("B"))


# --- deep equality ---------------------------------------------------------------


def assert_wire_equal(a: Any, b: Any, path: str = "msg") -> None:
    """Assert ``b`` is what ``a`` should decode to, comparing bits; names the first difference."""
    if isinstance(a, torch.Tensor):
        _assert_tensor_equal(a, b, path)
    elif isinstance(a, np.ndarray):
        _assert_array_equal(a, b, path)
    elif isinstance(a, Image.Image):
        _assert_image_equal(a, b, path)
    elif isinstance(a, msgspec.Struct):
        assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
        for field in a.__struct_fields__:
            assert_wire_equal(getattr(a, field), getattr(b, field), f"{path}.{field}")
    elif isinstance(a, dict):
        assert type(b) is dict, f"{path}: dict != {type(b).__name__}"
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for key in a:
            assert_wire_equal(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_wire_equal(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert type(b) is float, f"{path}: float != {type(b).__name__}"
        assert struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b)), (
            f"{path}: {a!r} != {b!r}"
        )
    else:
        # int/bool/str/bytes/None/enums: type and value must both match
        # (True must not come back as 1, nor FinishReason.STOP as "stop").
        assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
        assert a == b, f"{path}: {a!r} != {b!r}"


def _tensor_bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().resolve_conj().resolve_neg().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8)


def _assert_tensor_equal(a: torch.Tensor, b: Any, path: str) -> None:
    assert isinstance(b, torch.Tensor), f"{path}: tensor != {type(b).__name__}"
    assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
    assert a.shape == b.shape, f"{path}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    assert b.device.type == "cpu", f"{path}: decoded on {b.device}"
    if a.dtype in (torch.bool, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        assert torch.equal(a.resolve_conj(), b), f"{path}: values differ"
    else:
        # NaN-safe: equal as bit patterns (NaN payloads and -0.0 included).
        assert torch.equal(_tensor_bits(a), _tensor_bits(b)), f"{path}: values differ"


def _assert_array_equal(a: np.ndarray, b: Any, path: str) -> None:
    assert isinstance(b, np.ndarray), f"{path}: ndarray != {type(b).__name__}"
    # dtype.str includes the byte order: '>f4' must not come back as '<f4'.
    assert a.dtype.str == b.dtype.str, f"{path}: dtype {a.dtype.str} != {b.dtype.str}"
    assert a.shape == b.shape, f"{path}: shape {a.shape} != {b.shape}"
    assert a.tobytes() == b.tobytes(), f"{path}: values differ"


def _assert_image_equal(a: Image.Image, b: Any, path: str) -> None:
    assert isinstance(b, Image.Image), f"{path}: image != {type(b).__name__}"
    assert a.mode == b.mode, f"{path}: mode {a.mode} != {b.mode}"
    assert a.size == b.size, f"{path}: size {a.size} != {b.size}"
    assert a.tobytes() == b.tobytes(), f"{path}: pixels differ"
    if a.mode in ("P", "PA"):
        assert b.palette is not None, f"{path}: palette lost"
        assert a.palette.mode == b.palette.mode, f"{path}: palette mode {a.palette.mode} != {b.palette.mode}"
        assert a.getpalette(a.palette.mode) == b.getpalette(b.palette.mode), f"{path}: palette differs"
