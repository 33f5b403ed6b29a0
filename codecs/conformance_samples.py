"""What the conformance checks send through a codec, and how they compare what comes back.

Builders return fresh objects on every call: a check may hold frames that point
into a message's tensors. ``assert_wire_equal`` compares bit for bit, so NaN
equals NaN and -0.0 differs from 0.0: a codec must move bytes, not values. It
raises AssertionError itself rather than using ``assert``, so the checks still
check under ``python -O``.
"""

from __future__ import annotations

import io
import math
import struct
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

UNICODE_TEXT = "Grüße, 世界! 🚀🦙 naïve café — ﷽ x\u0301 \u200d👩‍💻 \u00a0end"
# A request id with a CJK character, an emoji, a combining accent and the last private-use code point.
UNICODE_ID = "請求-🚀-ß-\u0301-" + "\U0010fffd"

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
    """``num_requests`` outputs (every finish reason, some with logprobs) plus one error output."""
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


def sparse_messages() -> dict[str, Any]:
    """Each message type with its optional fields None and its lists empty: nothing for omit_defaults to drop."""
    request = text_request(prompt=None, num_tokens=0)
    request.eos_token_id = None
    request.lora_request = request.cache_salt = None
    return {"request": request, "outputs": EngineCoreOutputs(), "abort": EngineCoreAbort(request_ids=[])}


def unicode_messages() -> dict[str, Any]:
    """Non-ASCII text in every kind of string field: ids, prompts, stop reasons."""
    outputs = EngineCoreOutputs(
        outputs=[EngineCoreOutput(request_id=UNICODE_ID, new_token_ids=[1], stop_reason="終わり🛑")],
    )
    return {
        "request": text_request(request_id=UNICODE_ID, prompt=UNICODE_TEXT * 20),
        "outputs": outputs,
        "abort": EngineCoreAbort(request_ids=[UNICODE_ID, "", "🦙" * 100]),
    }


# Floats a value check would get wrong: NaN never equals itself, -0.0 equals 0.0, ±inf overflow narrow types.
SPECIAL_FLOATS: dict[str, float] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "-0.0": -0.0}
# SamplingParams' float fields (logit_bias, a dict of floats, has its place in special_float_messages).
SAMPLING_FLOAT_FIELDS = tuple(f.name for f in msgspec.structs.fields(SamplingParams) if f.type is float)


def special_float_messages() -> dict[str, Any]:
    """For each special float, a request and an output batch holding it in every float field outside the
    sampling parameters' scalars (arrival time, logit bias, logprobs, scheduler stats, step times)."""
    msgs: dict[str, Any] = {}
    for label, value in SPECIAL_FLOATS.items():
        request = text_request()
        request.arrival_time = value
        request.sampling_params.logit_bias = {50256: value, 7: 2.5}
        msgs[f"request with {label}"] = request
        msgs[f"outputs with {label}"] = special_float_outputs(value)
    return msgs


def special_float_outputs(value: float) -> EngineCoreOutputs:
    """One step's outputs with ``value`` in its times and stats, and every special float in its logprobs."""
    specials = list(SPECIAL_FLOATS.values())
    logprobs = Logprobs(token_ids=[[11, 12, 13, 14, 15]], logprobs=[[value, *specials]], ranks=[1])
    return EngineCoreOutputs(
        outputs=[EngineCoreOutput(request_id="cmpl-special", new_token_ids=[11], new_logprobs=logprobs)],
        step_index=1,
        step_start_time=value,
        timestamp=value,
        scheduler_stats=SchedulerStats(num_running_reqs=1, kv_cache_usage=value),
    )


def special_sampling_requests() -> dict[str, EngineCoreRequest]:
    """A request per special float and SamplingParams float field, that one field holding it."""
    msgs = {}
    for field in SAMPLING_FLOAT_FIELDS:
        for label, value in SPECIAL_FLOATS.items():
            request = text_request()
            setattr(request.sampling_params, field, value)
            msgs[f"request with {field}={label}"] = request
    return msgs


# --- multimodal values ------------------------------------------------------------


def sample_tensors() -> dict[str, torch.Tensor]:
    """Tensors every codec that carries tensors must carry: dtypes, layouts, edge shapes."""
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
    """numpy arrays every codec that carries arrays must carry: byte orders, layouts, edge shapes."""
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


def opened_png(image: Image.Image) -> Image.Image:
    """``image`` as a frontend gets it from Image.open: a PngImageFile subclass, pixels not yet loaded."""
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return Image.open(io.BytesIO(buf.getvalue()))


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


def mm_inputs_of(kinds: frozenset[str]) -> list[Any]:
    """Items holding only values of ``kinds`` ("tensor", "array", "image"): all three mixed when all are given."""
    if kinds >= {"tensor", "array", "image"}:
        return mixed_mm_inputs()
    items: list[Any] = []
    if "tensor" in kinds:
        tensors = sample_tensors()
        items += [
            {"pixel_values": tensors["bf16"], "image_grid_thw": torch.tensor([[1, 4, 4]])},
            {"pixel_values": tensors["fp32"], "mask": tensors["bool"]},
        ]
    if "array" in kinds:
        arrays = sample_arrays()
        items.append({"pixel_values": arrays["f4"], "mask": arrays["bool"]})
    if "image" in kinds:
        images = sample_images()
        items += [images["RGB"], images["P"]]
    return items


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


# --- deep equality ---------------------------------------------------------------


def expect(ok: bool, message: str) -> None:
    """AssertionError with ``message`` unless ``ok`` (an ``assert`` that -O cannot remove)."""
    if not ok:
        raise AssertionError(message)


def assert_wire_equal(a: Any, b: Any, path: str = "msg") -> None:
    """AssertionError unless ``b`` is what ``a`` should decode to, bit for bit; it names the first difference."""
    if isinstance(a, torch.Tensor):
        _assert_tensor_equal(a, b, path)
    elif isinstance(a, np.ndarray):
        _assert_array_equal(a, b, path)
    elif isinstance(a, Image.Image):
        _assert_image_equal(a, b, path)
    elif isinstance(a, msgspec.Struct):
        expect(type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}")
        for field in a.__struct_fields__:
            assert_wire_equal(getattr(a, field), getattr(b, field), f"{path}.{field}")
    elif isinstance(a, dict):
        expect(type(b) is dict, f"{path}: dict != {type(b).__name__}")
        expect(list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}")
        for key in a:
            assert_wire_equal(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        expect(type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}")
        expect(len(a) == len(b), f"{path}: length {len(a)} != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            assert_wire_equal(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        expect(type(b) is float, f"{path}: float != {type(b).__name__}")
        same_bits = struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
        expect(same_bits, f"{path}: {a!r} != {b!r}")
    else:
        # int/bool/str/bytes/None/enums: type and value must both match
        # (True must not come back as 1, nor FinishReason.STOP as "stop").
        expect(type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}")
        expect(a == b, f"{path}: {a!r} != {b!r}")


def _tensor_bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().resolve_conj().resolve_neg().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8)


def _assert_tensor_equal(a: torch.Tensor, b: Any, path: str) -> None:
    expect(isinstance(b, torch.Tensor), f"{path}: tensor != {type(b).__name__}")
    expect(a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}")
    expect(a.shape == b.shape, f"{path}: shape {tuple(a.shape)} != {tuple(b.shape)}")
    expect(b.device.type == "cpu", f"{path}: decoded on {b.device}")
    if a.dtype in (torch.bool, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        expect(torch.equal(a.resolve_conj(), b), f"{path}: values differ")
    else:
        # NaN-safe: equal as bit patterns (NaN payloads and -0.0 included).
        expect(torch.equal(_tensor_bits(a), _tensor_bits(b)), f"{path}: values differ")


def _assert_array_equal(a: np.ndarray, b: Any, path: str) -> None:
    expect(isinstance(b, np.ndarray), f"{path}: ndarray != {type(b).__name__}")
    # dtype.str includes the byte order: '>f4' must not come back as '<f4'.
    expect(a.dtype.str == b.dtype.str, f"{path}: dtype {a.dtype.str} != {b.dtype.str}")
    expect(a.shape == b.shape, f"{path}: shape {a.shape} != {b.shape}")
    expect(a.tobytes() == b.tobytes(), f"{path}: values differ")


def _assert_image_equal(a: Image.Image, b: Any, path: str) -> None:
    expect(isinstance(b, Image.Image), f"{path}: image != {type(b).__name__}")
    expect(a.mode == b.mode, f"{path}: mode {a.mode} != {b.mode}")
    expect(a.size == b.size, f"{path}: size {a.size} != {b.size}")
    expect(a.tobytes() == b.tobytes(), f"{path}: pixels differ")
    if a.mode in ("P", "PA") and a.palette is not None:
        expect(b.palette is not None, f"{path}: palette lost")
        mode, got = a.palette.mode, b.palette.mode if b.palette is not None else None
        expect(mode == got, f"{path}: palette mode {mode} != {got}")
        expect(a.getpalette(mode) == b.getpalette(mode), f"{path}: palette differs")
