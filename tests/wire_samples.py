"""Sample wire messages and a deep equality check, shared by the codec tests.

Builders return fresh objects on every call (tests may hold frames that point
into a message's tensors). ``assert_wire_equal`` compares bit for bit, so NaN
equals NaN and -0.0 differs from 0.0: a codec must move bytes, not values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.wire.messages import (
    EngineCoreRequest,
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
    # Its SamplingParams validation refuses special floats (NaN, ±inf, some -0.0) with an EncodeError.
    validates_sampling_floats: bool = False

    def carries(self, kind: str) -> bool:
        return self.carries_multimodal and kind in self.kinds

    def delivered(self, msg: Any, decoded: Any) -> Any:
        """What ``msg`` should come back as: fields not carried at their default, re-stamped ones as decoded."""
        return Leeway(not_carried=self.not_carried, restamped=self.restamped).delivered(msg, decoded)


def prepared(codec: str, msg: Any) -> Any:
    """``msg`` made valid by the codec's own rules (unlisted codecs: as is)."""
    exp = EXPECTATIONS.get(codec)
    return exp.prepare(msg) if exp else msg


def assert_delivered(codec: str, msg: Any, decoded: Any, path: str = "msg") -> None:
    """``decoded`` is ``msg`` as the codec delivers it (fields its schema lacks at their default)."""
    exp = EXPECTATIONS.get(codec)
    assert_wire_equal(exp.delivered(msg, decoded) if exp else msg, decoded, path)


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
        validates_sampling_floats=True,
    ),
}

# The samples and the bit-for-bit equality live in the package (the conformance checks ship with it);
# the codec tests take them from there.
from wirecodecs.conformance import Leeway  # noqa: E402
from wirecodecs.conformance_samples import (  # noqa: E402  # below the expectations they serve
    assert_wire_equal,
    frames_as,
    multimodal_request,
    output_batch,
    sample_images,
    text_messages,
)

__all__ = [
    "EXPECTATIONS",
    "CodecExpectation",
    "assert_delivered",
    "assert_wire_equal",
    "frame_bytes",
    "frames_as",
    "multimodal_request",
    "output_batch",
    "prepared",
    "sample_images",
    "text_messages",
]


def frame_bytes(frame: Any) -> bytes:
    return bytes(memoryview(frame).cast("B"))
