"""Every registered codec round-trips every wire message, bit for bit.

Parametrized over ``available_codecs()``, so a newly registered codec is
covered automatically; ``test_every_codec_has_expectations`` makes its author
say what it promises (multimodal or not, out-of-band frames or not).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import zmq
from PIL import Image

import wirecodecs
from harness.wire.messages import EngineCoreAbort, EngineCoreOutput, EngineCoreOutputs

from wire_samples import (
    EXPECTATIONS,
    UNICODE_TEXT,
    CodecExpectation,
    assert_wire_equal,
    frames_as,
    mixed_mm_inputs,
    multimodal_request,
    output_batch,
    sample_arrays,
    sample_images,
    sample_tensors,
    text_messages,
    text_request,
)

CODECS = wirecodecs.available_codecs()


def expectation(name: str) -> CodecExpectation:
    """The table's entry, or (for an unlisted codec) what its class claims."""
    if name in EXPECTATIONS:
        return EXPECTATIONS[name]
    cls = wirecodecs.registry.codec_class(name)
    return CodecExpectation(
        cls.carries_multimodal, out_of_band=cls.out_of_band, family=name, kinds=cls.multimodal_kinds
    )


def roundtrip(name: str, msg: Any) -> Any:
    """Encode with one instance and decode with another, as two processes would."""
    msg = expectation(name).prepare(msg)
    frames = wirecodecs.get_codec(name).encode(msg)
    assert isinstance(frames, list) and frames, "encode must return a non-empty list"
    assert all(isinstance(f, (bytes, memoryview)) for f in frames), [type(f) for f in frames]
    return wirecodecs.get_codec(name).decode(frames, type(msg))


def assert_roundtrips(name: str, msg: Any) -> None:
    decoded = roundtrip(name, msg)
    assert_wire_equal(expectation(name).delivered(msg, decoded), decoded)


KIND_OF = {"torch.Tensor": "tensor", "numpy.ndarray": "array", "PIL.Image.Image": "image"}


def assert_multimodal(name: str, msg: Any, type_name: str) -> None:
    """Round-trips on a codec that carries its kind; any other refuses it, helpfully."""
    kind = KIND_OF[type_name]
    if expectation(name).carries(kind):
        assert_roundtrips(name, msg)
        return
    with pytest.raises(wirecodecs.UnsupportedPayloadError) as info:
        wirecodecs.get_codec(name).encode(msg)
    text = str(info.value)
    assert repr(name) in text
    assert type_name in text
    capable = wirecodecs.codecs_that_carry_multimodal(kind)
    assert capable, "no registered codec carries multimodal inputs"
    assert capable == [n for n in CODECS if expectation(n).carries(kind)]
    for other in capable:
        assert other in text
    assert info.value.codec == name
    assert info.value.type_name == type_name
    assert info.value.capable == capable


# --- the expectations table ------------------------------------------------------


def test_every_codec_has_expectations() -> None:
    missing = sorted(set(CODECS) - set(EXPECTATIONS))
    assert not missing, f"add these codecs to wire_samples.EXPECTATIONS: {missing}"


def test_builtin_codecs_are_registered() -> None:
    assert set(EXPECTATIONS) <= set(CODECS)


@pytest.mark.parametrize("name", CODECS)
def test_codec_matches_expectations(name: str) -> None:
    codec = wirecodecs.get_codec(name)
    assert isinstance(codec, wirecodecs.Codec)
    assert codec.name == name
    assert codec.carries_multimodal is expectation(name).carries_multimodal
    # The facts its class declares, as the registry reads them, are the ones the table promises.
    assert wirecodecs.sends_out_of_band(name) is expectation(name).out_of_band
    carried = expectation(name).kinds if expectation(name).carries_multimodal else frozenset()
    assert wirecodecs.registry.multimodal_kinds(name) == carried


def test_capable_codecs_listed() -> None:
    expected = [n for n in CODECS if expectation(n).carries_multimodal]
    assert wirecodecs.codecs_that_carry_multimodal() == expected


# --- text messages ----------------------------------------------------------------


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("kind", ["request", "outputs", "abort"])
def test_text_message_roundtrip(name: str, kind: str) -> None:
    assert_roundtrips(name, text_messages()[kind])


@pytest.mark.parametrize("name", CODECS)
def test_request_defaults_and_nones_roundtrip(name: str) -> None:
    msg = text_request(prompt=None, num_tokens=0)
    msg.eos_token_id = None
    msg.lora_request = msg.cache_salt = None
    assert_roundtrips(name, msg)
    assert_roundtrips(name, EngineCoreOutputs())
    assert_roundtrips(name, EngineCoreAbort(request_ids=[]))


@pytest.mark.parametrize("name", CODECS)
def test_output_batch_of_64_roundtrip(name: str) -> None:
    msg = output_batch(64)
    assert len(msg.outputs) == 65  # 64 requests plus one error output
    assert_roundtrips(name, msg)


@pytest.mark.parametrize("name", CODECS)
def test_unicode_roundtrip(name: str) -> None:
    uid = "請求-🚀-ß-\u0301-" + "\U0010fffd"
    assert_roundtrips(name, text_request(request_id=uid, prompt=UNICODE_TEXT * 20))
    outputs = EngineCoreOutputs(
        outputs=[EngineCoreOutput(request_id=uid, new_token_ids=[1], stop_reason="終わり🛑")],
    )
    assert_roundtrips(name, outputs)
    assert_roundtrips(name, EngineCoreAbort(request_ids=[uid, "", "🦙" * 100]))


@pytest.mark.parametrize("name", CODECS)
def test_100k_token_prompt_roundtrip(name: str) -> None:
    msg = text_request(prompt="lorem ipsum " * 50_000, num_tokens=100_000)
    assert len(msg.prompt_token_ids) == 100_000
    assert_roundtrips(name, msg)


# --- multimodal values -------------------------------------------------------------


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("key", sorted(sample_tensors()))
def test_tensor_roundtrip(name: str, key: str) -> None:
    msg = multimodal_request([{"pixel_values": sample_tensors()[key]}])
    if key in expectation(name).refused_tensors:
        with pytest.raises(wirecodecs.EncodeError, match=repr(name)):
            wirecodecs.get_codec(name).encode(msg)
        return
    assert_multimodal(name, msg, "torch.Tensor")


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("key", sorted(sample_arrays()))
def test_array_roundtrip(name: str, key: str) -> None:
    msg = multimodal_request([{"pixel_values": sample_arrays()[key]}])
    assert_multimodal(name, msg, "numpy.ndarray")


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("key", sorted(sample_images()))
def test_image_roundtrip(name: str, key: str) -> None:
    msg = multimodal_request([sample_images()[key]])
    assert_multimodal(name, msg, "PIL.Image.Image")


def test_sample_images_cover_required_modes() -> None:
    modes = {img.mode for img in sample_images().values()}
    assert {"RGB", "RGBA", "L", "P", "I;16"} <= modes
    assert sample_images()["P"].palette is not None


@pytest.mark.parametrize("name", CODECS)
def test_mixed_multimodal_request_roundtrip(name: str) -> None:
    msg = multimodal_request(mixed_mm_inputs())
    if not expectation(name).kinds >= {"tensor", "array", "image"} or not expectation(name).carries_multimodal:
        with pytest.raises(wirecodecs.UnsupportedPayloadError):
            wirecodecs.get_codec(name).encode(msg)
        return
    frames = wirecodecs.get_codec(name).encode(msg)
    # Encoding must leave the message alone.
    assert_wire_equal(multimodal_request(mixed_mm_inputs()), msg)
    assert_wire_equal(msg, wirecodecs.get_codec(name).decode(frames, type(msg)))


# --- how frames arrive -------------------------------------------------------------


def tensor_only_mm_inputs() -> list[Any]:
    tensors = sample_tensors()
    return [
        {"pixel_values": tensors["bf16"], "image_grid_thw": torch.tensor([[1, 4, 4]])},
        {"pixel_values": tensors["fp32"], "mask": tensors["bool"]},
    ]


def _messages(name: str) -> list[Any]:
    """One of each message the codec carries, as the codec's own rules allow (``prepare``), and as delivered."""
    exp = expectation(name)
    msgs = list(text_messages().values())
    if exp.carries("image") and exp.carries("array"):
        msgs.append(multimodal_request(mixed_mm_inputs()))
    elif exp.carries("tensor"):
        msgs.append(multimodal_request(tensor_only_mm_inputs()))
    return [exp.prepare(m) for m in msgs]


def assert_decoded(name: str, msg: Any, decoded: Any) -> None:
    assert_wire_equal(expectation(name).delivered(msg, decoded), decoded)


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview"])
def test_decode_from_frame_kinds(name: str, kind: str) -> None:
    encoder, decoder = wirecodecs.get_codec(name), wirecodecs.get_codec(name)
    for msg in _messages(name):
        frames = frames_as(encoder.encode(msg), kind)
        assert_decoded(name, msg, decoder.decode(frames, type(msg)))


@pytest.mark.parametrize("name", CODECS)
def test_decode_from_zmq_frames(name: str, zmq_pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    sender, receiver = zmq_pair
    encoder, decoder = wirecodecs.get_codec(name), wirecodecs.get_codec(name)
    msgs = _messages(name)
    if expectation(name).carries_multimodal:
        # Above zmq's copy threshold, so copy=False really hands over the buffer.
        msgs.append(multimodal_request([{"pixel_values": torch.randn(3, 224, 224)}]))
    for msg in msgs:
        sender.send_multipart(encoder.encode(msg), copy=False)
        received = receiver.recv_multipart(copy=False)
        assert all(isinstance(f, zmq.Frame) for f in received)
        assert_decoded(name, msg, decoder.decode(received, type(msg)))


@pytest.mark.parametrize("name", CODECS)
def test_instances_are_reusable(name: str) -> None:
    """Decoders are cached per type and per-call state is reset between calls."""
    encoder, decoder = wirecodecs.get_codec(name), wirecodecs.get_codec(name)
    for _ in range(2):
        for msg in _messages(name):
            assert_decoded(name, msg, decoder.decode(encoder.encode(msg), type(msg)))


# --- out-of-band frames ----------------------------------------------------------

OOB_CODECS = [n for n in CODECS if expectation(n).out_of_band]
INBAND_CODECS = [n for n in CODECS if not expectation(n).out_of_band]


def _data_ptr(frame: Any) -> int:
    return np.frombuffer(frame, dtype=np.uint8).ctypes.data


def _shares(a: Any, frame: Any) -> bool:
    return np.shares_memory(np.asarray(a), np.frombuffer(frame, dtype=np.uint8))


@pytest.mark.parametrize("name", OOB_CODECS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_oob_tensor_is_separate_uncopied_frame(name: str, dtype: torch.dtype) -> None:
    tensor = torch.randn(256, 256).to(dtype)
    frames = wirecodecs.get_codec(name).encode(multimodal_request([{"pixel_values": tensor}]))
    assert len(frames) == 2
    assert memoryview(frames[1]).nbytes == tensor.nbytes
    assert memoryview(frames[0]).nbytes < 2048, "the tensor's bytes leaked into the body"
    assert _data_ptr(frames[1]) == tensor.data_ptr(), "encode copied the tensor"


@pytest.mark.parametrize("name", [n for n in OOB_CODECS if expectation(n).carries("image")])
def test_oob_array_and_image_are_separate_frames(name: str) -> None:
    array = np.random.default_rng(0).standard_normal((128, 128)).astype(">f4")
    image = sample_images()["RGB"]
    frames = wirecodecs.get_codec(name).encode(multimodal_request([{"a": array}, image]))
    assert len(frames) == 3
    sizes = sorted(memoryview(f).nbytes for f in frames[1:])
    assert sizes == sorted([array.nbytes, len(image.tobytes())])
    array_frame = next(f for f in frames[1:] if memoryview(f).nbytes == array.nbytes)
    assert _shares(array.view(np.uint8), array_frame), "encode copied the array"


@pytest.mark.parametrize("name", OOB_CODECS)
def test_oob_small_values_stay_inline(name: str) -> None:
    items: list[Any] = [{"t": torch.arange(8)}]
    if expectation(name).carries("image"):
        items.append(sample_images()["RGB_tiny"])
    msg = multimodal_request(items)
    frames = wirecodecs.get_codec(name).encode(msg)
    assert len(frames) == 1
    assert_decoded(name, msg, wirecodecs.get_codec(name).decode(frames, type(msg)))


@pytest.mark.parametrize("name", OOB_CODECS)
def test_oob_decode_is_view_on_received_frame(name: str, zmq_pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    sender, receiver = zmq_pair
    tensor = torch.randn(256, 256)
    array: Any = np.arange(40_000, dtype=np.int64)
    if not expectation(name).carries("array"):
        array = torch.from_numpy(array)
    msg = multimodal_request([{"t": tensor, "a": array}])
    sender.send_multipart(wirecodecs.get_codec(name).encode(msg), copy=False)
    received = receiver.recv_multipart(copy=False)
    assert len(received) == 3
    decoded = wirecodecs.get_codec(name).decode(received, type(msg))
    assert_decoded(name, msg, decoded)
    out = decoded.mm_inputs[0]
    buffers = [f.buffer for f in received[1:]]
    assert any(_shares(out["t"].numpy(), b) for b in buffers), "tensor was copied on decode"
    assert any(_shares(np.asarray(out["a"]), b) for b in buffers), "array was copied on decode"


@pytest.mark.parametrize("name", OOB_CODECS)
def test_oob_decode_is_view_on_bytes_frame(name: str) -> None:
    tensor = torch.randn(128, 128)
    msg = multimodal_request([{"t": tensor}])
    frames = frames_as(wirecodecs.get_codec(name).encode(msg), "bytes")
    decoded = wirecodecs.get_codec(name).decode(frames, type(msg))
    assert _shares(decoded.mm_inputs[0]["t"].numpy(), frames[1])


@pytest.mark.parametrize("name", [n for n in INBAND_CODECS if expectation(n).carries_multimodal])
def test_inband_codecs_send_one_frame(name: str) -> None:
    frames = wirecodecs.get_codec(name).encode(multimodal_request(mixed_mm_inputs()))
    assert len(frames) == 1


@pytest.mark.parametrize("name", CODECS)
def test_text_messages_are_one_frame(name: str) -> None:
    for msg in text_messages().values():
        assert len(wirecodecs.get_codec(name).encode(expectation(name).prepare(msg))) == 1


def test_unsupported_payload_names_image_subclass() -> None:
    """An image straight from Image.open is a subclass; the message names it."""
    if "msgspec" not in CODECS:
        pytest.skip("msgspec codec not registered")
    import io

    buf = io.BytesIO()
    sample_images()["RGB_tiny"].save(buf, "PNG")
    opened = Image.open(io.BytesIO(buf.getvalue()))
    with pytest.raises(wirecodecs.UnsupportedPayloadError, match="PngImageFile"):
        wirecodecs.get_codec("msgspec").encode(multimodal_request([opened]))


@pytest.mark.parametrize("name", [n for n in CODECS if expectation(n).carries("image")])
def test_lazily_loaded_png_roundtrips(name: str) -> None:
    """Frontends hand over images from Image.open, not yet loaded (palette pending)."""
    import io

    buf = io.BytesIO()
    sample_images()["P"].save(buf, "PNG")
    msg = multimodal_request([Image.open(io.BytesIO(buf.getvalue()))])
    decoded = roundtrip(name, msg)
    assert_wire_equal(sample_images()["P"], decoded.mm_inputs[0])
