"""Bad frames raise wirecodecs.DecodeError: never another exception, a hang, or a wrong message.

A flipped bit inside a value (a token id, a pixel) cannot be detected without a
checksum, which no codec carries, so only structural damage is tested here:
truncation, garbage, wrong frame counts and orders, lying headers.
"""

from __future__ import annotations

import enum
import itertools
import pickle
import random
import threading
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import pytest
import torch

import wirecodecs
from harness.wire.messages import EngineCoreAbort, EngineCoreOutputs, EngineCoreRequest
from wirecodecs import DecodeError, EncodeError

from wire_samples import (
    EXPECTATIONS,
    assert_delivered,
    frame_bytes,
    multimodal_request,
    prepared,
    sample_images,
    text_messages,
)

pytestmark = pytest.mark.timeout(60)

CODECS = wirecodecs.available_codecs()
CAPABLE = wirecodecs.codecs_that_carry_multimodal()
OOB = wirecodecs.codecs_out_of_band()
MSG_TYPES = [EngineCoreRequest, EngineCoreOutputs, EngineCoreAbort]
# Index of EngineCoreRequest.mm_inputs in its msgpack array (array_like Struct).
MM_INDEX = EngineCoreRequest.__struct_fields__.index("mm_inputs")


def carries_images(name: str) -> bool:
    return "image" in wirecodecs.registry.multimodal_kinds(name)


def mm_request(name: str) -> EngineCoreRequest:
    """Big tensor and image (out-of-band frames where the codec has them) plus a small inline tensor."""
    tensor = torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64)
    images = [sample_images()["RGB"]] if carries_images(name) else [{"second": torch.ones(32, 32)}]
    return multimodal_request([{"pixel_values": tensor, "small": torch.arange(4)}, *images])


def messages(name: str) -> dict[str, Any]:
    msgs = dict(text_messages())
    if name in CAPABLE:
        msgs["multimodal"] = mm_request(name)
        # Small values only: one frame even for the out-of-band codecs.
        tiny = [sample_images()["RGB_tiny"]] if carries_images(name) else []
        msgs["multimodal_inline"] = multimodal_request([{"t": torch.arange(4)}, *tiny])
    return {key: prepared(name, msg) for key, msg in msgs.items()}


def encoded(name: str) -> list[tuple[str, Any, list[bytes]]]:
    codec = wirecodecs.get_codec(name)
    return [(key, msg, [frame_bytes(f) for f in codec.encode(msg)]) for key, msg in messages(name).items()]


def assert_decode_error(name: str, frames: list[Any], msg_type: type) -> None:
    with pytest.raises(DecodeError):
        wirecodecs.get_codec(name).decode(frames, msg_type)


# --- empty and truncated --------------------------------------------------------


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("msg_type", MSG_TYPES)
def test_no_frames(name: str, msg_type: type) -> None:
    assert_decode_error(name, [], msg_type)


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("msg_type", MSG_TYPES)
@pytest.mark.parametrize("frames", [[b""], [b"", b""], [memoryview(b"")] * 3], ids=["1", "2", "3"])
def test_empty_frames(name: str, msg_type: type, frames: list[Any]) -> None:
    assert_decode_error(name, frames, msg_type)


@pytest.mark.parametrize("name", CODECS)
def test_truncated_body(name: str) -> None:
    rng = random.Random(0)
    for _, msg, frames in encoded(name):
        body = frames[0]
        cuts = {1, 2, len(body) // 4, len(body) // 2, len(body) - 2, len(body) - 1}
        cuts |= {rng.randrange(1, len(body)) for _ in range(8)}
        for cut in sorted(c for c in cuts if 0 < c < len(body)):
            assert_decode_error(name, [body[:cut], *frames[1:]], type(msg))


@pytest.mark.parametrize("name", OOB)
def test_truncated_oob_frame(name: str) -> None:
    msg = mm_request(name)
    frames = [frame_bytes(f) for f in wirecodecs.get_codec(name).encode(msg)]
    assert len(frames) > 1
    for i in range(1, len(frames)):
        for cut in (len(frames[i]) - 1, len(frames[i]) // 2, 0):
            damaged = list(frames)
            damaged[i] = frames[i][:cut]
            assert_decode_error(name, damaged, EngineCoreRequest)


# --- garbage and structural corruption ------------------------------------------------


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("msg_type", MSG_TYPES)
def test_random_bytes(name: str, msg_type: type) -> None:
    rng = random.Random(1234)
    for length in (1, 2, 7, 64, 1000):
        for _ in range(4):
            assert_decode_error(name, [rng.randbytes(length)], msg_type)


@pytest.mark.parametrize("name", CODECS)
def test_flipped_structural_bytes(name: str) -> None:
    for _, msg, frames in encoded(name):
        body = frames[0]
        first_flipped = bytes([body[0] ^ 0xFF]) + body[1:]
        for bad in (first_flipped, b"\x00" + body):
            assert_decode_error(name, [bad, *frames[1:]], type(msg))


@pytest.mark.parametrize("name", OOB)
def test_shuffled_frames(name: str) -> None:
    frames = [frame_bytes(f) for f in wirecodecs.get_codec(name).encode(mm_request(name))]
    assert len(frames) == 3 and len(frames[1]) != len(frames[2])
    orders = [[2, 1, 0], [1, 2, 0], [1, 0, 2], [0, 2, 1]]
    for order in orders:
        assert_decode_error(name, [frames[i] for i in order], EngineCoreRequest)


@pytest.mark.parametrize("name", CODECS)
def test_missing_and_extra_frames(name: str) -> None:
    for _, msg, frames in encoded(name):
        if len(frames) > 1:
            assert_decode_error(name, frames[:-1], type(msg))  # one oob frame lost
            assert_decode_error(name, frames[:1], type(msg))  # all oob frames lost
        if name in EXPECTATIONS and EXPECTATIONS[name].ignores_extra_frames:
            continue
        for extra in (b"\x00" * 512, frames[0], frames[-1], b""):
            assert_decode_error(name, [*frames, extra], type(msg))


@pytest.mark.parametrize(("encoder", "decoder"), list(itertools.permutations(CODECS, 2)))
def test_frames_from_another_codec(encoder: str, decoder: str) -> None:
    """DecodeError, or the very same message where two codecs share a wire format.

    Text messages are byte-identical across the msgspec codecs (and pickle
    decodes pickle-oob's inline buffers), so refusing them is neither possible
    nor needed; a *different* message must never come out.
    """
    for key, msg, frames in encoded(encoder):
        try:
            decoded = wirecodecs.get_codec(decoder).decode(frames, type(msg))
        except DecodeError:
            continue
        assert_delivered(encoder, msg, decoded, f"{encoder}->{decoder}:{key}")
        families = {EXPECTATIONS[n].family for n in (encoder, decoder) if n in EXPECTATIONS}
        assert len(families) < 2, f"{decoder} accepted {encoder}'s {key} frames"
        if key.startswith("multimodal") and families == {"msgpack"}:
            pytest.fail(f"{decoder} accepted {encoder}'s multimodal frames")


@pytest.mark.parametrize("name", CODECS)
def test_wrong_message_type(name: str) -> None:
    for _key, msg, frames in encoded(name):
        for msg_type in MSG_TYPES:
            if msg_type is not type(msg):
                assert_decode_error(name, frames, msg_type)


@pytest.mark.parametrize("name", CODECS)
def test_instance_recovers_after_errors(name: str) -> None:
    codec = wirecodecs.get_codec(name)
    for _key, msg, frames in encoded(name):
        with pytest.raises(DecodeError):
            codec.decode([frames[0][: len(frames[0]) // 2], *frames[1:]], type(msg))
        if not (name in EXPECTATIONS and EXPECTATIONS[name].ignores_extra_frames):
            with pytest.raises(DecodeError):
                codec.decode([*frames, b"x" * 300], type(msg))
        assert_delivered(name, msg, codec.decode(frames, type(msg)))


# --- lying headers ----------------------------------------------------------------
# Each case rewrites one field of a tensor/array/image header so it no longer
# matches its bytes (or names something the codec must not accept).

HUGE = 2**62
TENSOR_HEADER_CASES: dict[str, tuple[Any, Any, int | None]] = {
    # name: (dtype, shape, keep this many bytes of the buffer or None for all)
    "unknown_dtype": ("float99", [64, 64], None),
    "dtype_not_str": (5, [64, 64], None),
    "torch_attribute_dtype": ("Tensor", [64, 64], None),
    "dtype_size_mismatch": ("float64", [64, 64], None),
    "shape_size_mismatch": ("float32", [64, 65], None),
    "negative_dim": ("float32", [-64, -64], None),
    "shape_not_list": ("float32", "64x64", None),
    "float_dim": ("float32", [64.0, 64], None),
    "overflowing_empty": ("float32", [HUGE, HUGE, 0], 0),
    "unrepresentable_dim": ("float32", [2**64 - 1, 0], 0),
    "short_buffer": ("float32", [64, 64], 100),
}
ARRAY_HEADER_CASES: dict[str, tuple[Any, Any, int | None]] = {
    "object_dtype": ("|O", [10], None),
    "structured_dtype": ([("a", "<i4")], [10], None),
    "subarray_dtype": ("(2,)<i4", [5], None),
    "garbage_dtype": ("not a dtype", [10], None),
    "byte_order_size_mismatch": (">f8", [10], None),
    "shape_size_mismatch": ("<i4", [11], None),
    "too_many_dims": ("<i4", [1] * 70, 4),
}
IMAGE_HEADER_CASES: dict[str, tuple[Any, Any, Any]] = {
    # name: (mode, [width, height], palette_mode)
    "unknown_mode": ("XYZ", [64, 48], None),
    "mode_size_mismatch": ("RGBA", [64, 48], None),
    "size_mismatch": ("RGB", [48, 64 + 1], None),
    "negative_size": ("RGB", [-64, -48], None),
    "overflowing_empty": ("RGB", [HUGE, 0], None),
    "unrepresentable_empty": ("RGB", [2**64 - 1, 0], None),
    "bad_palette_mode": ("P", [64 * 3, 48], "CMYK"),
}


def _array_header_request() -> EngineCoreRequest:
    return multimodal_request([{"a": np.arange(10, dtype="<i4")}])


# msgspec-b64: the header is a map next to the base64 data.


def _b64_rewrite(msg: EngineCoreRequest, edit: Callable[[dict], None]) -> list[bytes]:
    frames = wirecodecs.get_codec("msgspec-b64").encode(msg)
    raw = msgspec.msgpack.decode(frames[0])
    item = raw[MM_INDEX][0]
    edit(item if "__wirebench__" in item else next(iter(item.values())))
    return [msgspec.msgpack.encode(raw)]


def _cut_b64(data: str, keep: int | None) -> str:
    import base64

    return data if keep is None else base64.b64encode(base64.b64decode(data)[:keep]).decode()


needs_b64 = pytest.mark.skipif("msgspec-b64" not in CODECS, reason="msgspec-b64 not registered")
needs_oob = pytest.mark.skipif("msgspec-oob" not in CODECS, reason="msgspec-oob not registered")
needs_pickle_oob = pytest.mark.skipif("pickle-oob" not in CODECS, reason="pickle-oob not registered")


@needs_b64
@pytest.mark.parametrize("case", TENSOR_HEADER_CASES)
def test_b64_tensor_header(case: str) -> None:
    dtype, shape, keep = TENSOR_HEADER_CASES[case]

    def edit(m: dict) -> None:
        m.update(dtype=dtype, shape=shape, data=_cut_b64(m["data"], keep))

    assert_decode_error("msgspec-b64", _b64_rewrite(mm_request("msgspec-b64"), edit), EngineCoreRequest)


@needs_b64
@pytest.mark.parametrize("case", ARRAY_HEADER_CASES)
def test_b64_array_header(case: str) -> None:
    dtype, shape, keep = ARRAY_HEADER_CASES[case]

    def edit(m: dict) -> None:
        m.update(dtype=dtype, shape=shape, data=_cut_b64(m["data"], keep))

    assert_decode_error("msgspec-b64", _b64_rewrite(_array_header_request(), edit), EngineCoreRequest)


@needs_b64
@pytest.mark.parametrize("case", IMAGE_HEADER_CASES)
def test_b64_image_header(case: str) -> None:
    mode, size, palette_mode = IMAGE_HEADER_CASES[case]

    def edit(m: dict) -> None:
        m.update(mode=mode, size=size, palette_mode=palette_mode, palette=b"\x00" * 48 if palette_mode else None)
        if size[1] == 0:
            m["data"] = ""

    msg = multimodal_request([sample_images()["RGB"]])
    assert_decode_error("msgspec-b64", _b64_rewrite(msg, edit), EngineCoreRequest)


@needs_b64
@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m.update(data="!!not base64!!"),
        lambda m: m.update(data=b"\x00\x01"),
        lambda m: m.pop("data"),
        lambda m: m.pop("shape"),
        lambda m: m.update({"__wirebench__": "video"}),
        lambda m: m.update({"__wirebench__": None}),
    ],
    ids=["bad_base64", "data_not_str", "no_data", "no_shape", "unknown_kind", "no_kind"],
)
def test_b64_malformed_map(edit: Callable[[dict], None]) -> None:
    assert_decode_error("msgspec-b64", _b64_rewrite(mm_request("msgspec-b64"), edit), EngineCoreRequest)


@needs_b64
def test_b64_item_not_a_map() -> None:
    frames = wirecodecs.get_codec("msgspec-b64").encode(mm_request("msgspec-b64"))
    raw = msgspec.msgpack.decode(frames[0])
    for bad in (42, "image", [1, 2], {"pixel_values": 42}):
        raw[MM_INDEX] = [bad]
        assert_decode_error("msgspec-b64", [msgspec.msgpack.encode(raw)], EngineCoreRequest)


# msgspec-oob: the header is a small msgpack array inside a msgpack extension.


def _oob_rewrite(msg: EngineCoreRequest, edit: Callable[[list], None]) -> list[Any]:
    frames = wirecodecs.get_codec("msgspec-oob").encode(msg)
    raw = msgspec.msgpack.decode(frames[0])
    item = raw[MM_INDEX][0]
    key = None if isinstance(item, msgspec.msgpack.Ext) else next(iter(item))
    ext = item if key is None else item[key]
    header = msgspec.msgpack.decode(ext.data)
    edit(header)
    new = msgspec.msgpack.Ext(ext.code, msgspec.msgpack.encode(header))
    if key is None:
        raw[MM_INDEX][0] = new
    else:
        item[key] = new
    return [msgspec.msgpack.encode(raw), *frames[1:]]


@needs_oob
@pytest.mark.parametrize("case", TENSOR_HEADER_CASES)
def test_oob_tensor_header(case: str) -> None:
    dtype, shape, keep = TENSOR_HEADER_CASES[case]

    def edit(h: list) -> None:
        h[0], h[1] = dtype, shape
        if keep is not None:  # replace the frame reference by short inline bytes
            h[2] = b"\x00" * keep

    frames = _oob_rewrite(mm_request("msgspec-oob"), edit)
    if keep is not None:
        frames = frames[:1] + frames[2:]  # drop the now unreferenced tensor frame
    assert_decode_error("msgspec-oob", frames, EngineCoreRequest)


@needs_oob
@pytest.mark.parametrize("case", ARRAY_HEADER_CASES)
def test_oob_array_header(case: str) -> None:
    dtype, shape, keep = ARRAY_HEADER_CASES[case]

    def edit(h: list) -> None:
        h[0], h[1] = dtype, shape
        if keep is not None:
            h[2] = bytes(h[2])[:keep]

    assert_decode_error("msgspec-oob", _oob_rewrite(_array_header_request(), edit), EngineCoreRequest)


@needs_oob
@pytest.mark.parametrize("case", IMAGE_HEADER_CASES)
def test_oob_image_header(case: str) -> None:
    mode, size, palette_mode = IMAGE_HEADER_CASES[case]

    def edit(h: list) -> None:
        h[0], h[1], h[2] = mode, size[0], size[1]
        h[3], h[4] = palette_mode, (b"\x00" * 48 if palette_mode else None)
        if size[1] == 0:
            h[5] = b""

    frames = _oob_rewrite(multimodal_request([sample_images()["RGB"]]), edit)
    if size[1] == 0:
        frames = frames[:1]
    assert_decode_error("msgspec-oob", frames, EngineCoreRequest)


@needs_oob
@pytest.mark.parametrize(
    "edit",
    [
        lambda h: h.__setitem__(2, 7),  # reference to a frame that was not sent
        lambda h: h.__setitem__(2, 0),  # frame 0 is the body
        lambda h: h.__setitem__(2, -1),
        lambda h: h.__setitem__(2, True),
        lambda h: h.__setitem__(2, "frame 1"),
        lambda h: h.__setitem__(2, None),
        lambda h: h.pop(),  # header too short
        lambda h: h.append(1),  # header too long
    ],
    ids=["missing_frame", "body_frame", "negative", "bool", "str", "none", "short", "long"],
)
def test_oob_bad_buffer_reference(edit: Callable[[list], None]) -> None:
    assert_decode_error("msgspec-oob", _oob_rewrite(mm_request("msgspec-oob"), edit), EngineCoreRequest)


@needs_oob
@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x93\x01", b"\xa3abc", b"\x90"], ids=repr)
@pytest.mark.parametrize("code", [1, 2, 3, 9])
def test_oob_garbage_extension(code: int, data: bytes) -> None:
    frames = wirecodecs.get_codec("msgspec-oob").encode(text_messages()["request"])
    raw = msgspec.msgpack.decode(frames[0])
    raw[MM_INDEX : MM_INDEX + 1] = [[msgspec.msgpack.Ext(code, data)]]
    assert_decode_error("msgspec-oob", [msgspec.msgpack.encode(raw)], EngineCoreRequest)


# pickle-oob: a crafted stream names the codec's own rebuild functions with lying arguments.


class _Reduces:
    """Pickles as a call to ``fn(*args)``, as pickle-oob's reducer writes it."""

    def __init__(self, fn: Callable[..., Any], args: tuple) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple:
        return self.fn, self.args


def _pickle_oob_with(value: Any) -> list[bytes]:
    return [pickle.dumps(multimodal_request([{"x": value}]), protocol=5)]


@needs_pickle_oob
@pytest.mark.parametrize("case", TENSOR_HEADER_CASES)
def test_pickle_oob_tensor_header(case: str) -> None:
    from wirecodecs.pickle_codec import _rebuild_tensor

    dtype, shape, keep = TENSOR_HEADER_CASES[case]
    buf = bytearray(64 * 64 * 4 if keep is None else keep)
    assert_decode_error(
        "pickle-oob", _pickle_oob_with(_Reduces(_rebuild_tensor, (dtype, shape, buf))), EngineCoreRequest
    )


@needs_pickle_oob
@pytest.mark.parametrize("case", IMAGE_HEADER_CASES)
def test_pickle_oob_image_header(case: str) -> None:
    from wirecodecs.pickle_codec import _rebuild_image

    mode, size, palette_mode = IMAGE_HEADER_CASES[case]
    header = (mode, size[0], size[1], palette_mode, b"\x00" * 48 if palette_mode else None)
    pixels = b"" if size[1] == 0 else bytes(64 * 48 * 3)
    frames = _pickle_oob_with(_Reduces(_rebuild_image, (header, pixels)))
    assert_decode_error("pickle-oob", frames, EngineCoreRequest)


@needs_pickle_oob
@pytest.mark.parametrize("header", [None, ("RGB", 2, 2), "RGB", ("RGB", 2, 2, None, None, None)], ids=repr)
def test_pickle_oob_malformed_image_header(header: Any) -> None:
    from wirecodecs.pickle_codec import _rebuild_image

    frames = _pickle_oob_with(_Reduces(_rebuild_image, (header, bytes(12))))
    assert_decode_error("pickle-oob", frames, EngineCoreRequest)


# --- encode errors --------------------------------------------------------------------


class Outcome(enum.Enum):
    """What comes of encoding, then decoding, a value outside rawbuf's dtypes and modes."""

    UNSUPPORTED = "unsupported"  # the codec carries no such kind: UnsupportedPayloadError at encode
    ENCODE_ERROR = "encode_error"  # the kind travels as a rawbuf header, which has no such dtype/mode
    DECODE_ERROR = "decode_error"  # its library pickles the value but cannot unpickle it
    ROUND_TRIP = "round_trip"  # its library carries the value: the same value comes back


# Built-in codecs that leave a kind to its library (not rawbuf), and what that library makes of the odd
# values below: torch pickles float8/uint16/complex32 tensors it cannot unpickle; numpy and PIL pickle
# structured arrays and I;16N images whole; vLLM's encoder sends any tensor as raw bytes plus its dtype's name.
LEFT_TO_LIBRARY: dict[tuple[str, str], Outcome] = {
    ("pickle", "tensor"): Outcome.DECODE_ERROR,
    ("pickle", "array"): Outcome.ROUND_TRIP,
    ("pickle", "image"): Outcome.ROUND_TRIP,
    ("pickle-oob", "array"): Outcome.ROUND_TRIP,
    ("vllm", "tensor"): Outcome.ROUND_TRIP,
}


def expected_outcome(name: str, kind: str) -> Outcome:
    """The one outcome ``name`` must give for an odd value of ``kind`` (a third-party codec must refuse it)."""
    if kind not in wirecodecs.registry.multimodal_kinds(name):
        return Outcome.UNSUPPORTED
    if name not in EXPECTATIONS or kind in EXPECTATIONS[name].rawbuf:
        return Outcome.ENCODE_ERROR
    return LEFT_TO_LIBRARY[(name, kind)]  # a new built-in codec states its outcome here


def odd_value_cases(kind: str, values: dict[str, Any]) -> list[Any]:
    """(codec, value, outcome) for every codec and value, each case's id naming the outcome it asserts."""
    cases = []
    for name in CODECS:
        outcome = expected_outcome(name, kind)
        cases += [pytest.param(name, v, outcome, id=f"{name}-{label}-{outcome.value}") for label, v in values.items()]
    return cases


def _expect_refused(name: str, msg: EngineCoreRequest, outcome: Outcome) -> None:
    """The codec refuses ``msg`` with exactly the error ``outcome`` names."""
    codec = wirecodecs.get_codec(name)
    if outcome is Outcome.UNSUPPORTED:
        with pytest.raises(wirecodecs.UnsupportedPayloadError):
            codec.encode(msg)
    elif outcome is Outcome.ENCODE_ERROR:
        with pytest.raises(EncodeError) as refused:
            codec.encode(msg)
        assert not isinstance(refused.value, wirecodecs.UnsupportedPayloadError), "it carries the kind, not the value"
    else:
        assert outcome is Outcome.DECODE_ERROR, outcome
        frames = codec.encode(msg)
        with pytest.raises(DecodeError):
            wirecodecs.get_codec(name).decode(frames, type(msg))


def _expect_round_trip(name: str, msg: EngineCoreRequest) -> None:
    """The codec carries ``msg``: a fresh instance decodes the very same message."""
    frames = wirecodecs.get_codec(name).encode(msg)
    assert_delivered(name, msg, wirecodecs.get_codec(name).decode(frames, type(msg)))


def _expect(name: str, msg: EngineCoreRequest, outcome: Outcome) -> None:
    if outcome is Outcome.ROUND_TRIP:
        _expect_round_trip(name, msg)
    else:
        _expect_refused(name, msg, outcome)


ODD_TENSOR_DTYPES = {str(d): d for d in (torch.float8_e4m3fn, torch.uint16, torch.complex32)}


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize(("name", "dtype", "outcome"), odd_value_cases("tensor", ODD_TENSOR_DTYPES))
def test_odd_tensor_dtype(name: str, dtype: torch.dtype, outcome: Outcome) -> None:
    tensor = torch.zeros(300, dtype=torch.float64).to(dtype)
    _expect(name, multimodal_request([{"pixel_values": tensor}]), outcome)


@pytest.mark.parametrize(
    ("name", "dtype", "outcome"), odd_value_cases("array", {"structured": [("a", "<i4"), ("b", "<f8")]})
)
def test_odd_array_dtype(name: str, dtype: Any, outcome: Outcome) -> None:
    _expect(name, multimodal_request([{"a": np.zeros(4, dtype=dtype)}]), outcome)


@pytest.mark.parametrize("name", [n for n in CAPABLE if n in EXPECTATIONS and "array" in EXPECTATIONS[n].rawbuf])
def test_object_array_refused(name: str) -> None:
    objects = np.array([1, "two", None], dtype=object)
    with pytest.raises(EncodeError):
        wirecodecs.get_codec(name).encode(multimodal_request([{"a": objects}]))


@pytest.mark.parametrize(("name", "mode", "outcome"), odd_value_cases("image", {"I;16N": "I;16N"}))
def test_odd_image_mode(name: str, mode: str, outcome: Outcome) -> None:
    from PIL import Image

    _expect(name, multimodal_request([Image.new(mode, (4, 4))]), outcome)


UNENCODABLE = [
    pytest.param(name, value, id=f"{name}-{label}")
    for name in CODECS
    for label, value in [("lock", threading.Lock()), ("lambda", lambda: 1), ("int_too_big", 2**70)]
    # pickle carries unbounded ints
    if not (label == "int_too_big" and EXPECTATIONS.get(name) and EXPECTATIONS[name].family == "pickle")
]


@pytest.mark.parametrize(("name", "value"), UNENCODABLE)
def test_unencodable_value(name: str, value: Any) -> None:
    with pytest.raises(EncodeError):
        wirecodecs.get_codec(name).encode(EngineCoreAbort(request_ids=[value]))


@pytest.mark.parametrize("name", CODECS)
def test_encoder_recovers_after_error(name: str) -> None:
    codec = wirecodecs.get_codec(name)
    bad = multimodal_request([{"big": torch.randn(100, 100), "bad": threading.Lock()}])
    with pytest.raises(EncodeError):
        codec.encode(bad)
    msg = prepared(name, text_messages()["request"])
    frames = codec.encode(msg)
    assert len(frames) == 1, "frames of the failed encode leaked into the next one"
    assert_delivered(name, msg, wirecodecs.get_codec(name).decode(frames, type(msg)))
