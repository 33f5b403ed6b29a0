"""The codec base class (its facts declared, typed), its errors, and helpers every codec shares."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import zmq

# A frame as it arrives: bytes, a memoryview, or a zmq.Frame from recv(copy=False).
Frame = bytes | bytearray | memoryview | zmq.Frame
# What encode returns: frame 0 is the body, later frames are out-of-band buffers.
# Items are bytes or memoryviews that may point into the message's own tensors,
# so the caller must not mutate those tensors until the frames are sent.
Frames = list[bytes | memoryview]

# Out-of-band codecs copy buffers smaller than this into the body: a separate
# frame costs more than copying a few hundred bytes.
INLINE_THRESHOLD = 256

T = TypeVar("T")


class CodecError(Exception):
    """Base class of every error a codec raises on purpose.

    ``code`` is a stable, machine-readable kind: callers branch on it (and it
    travels to HTTP clients as the error's type), never on the message text.
    """

    code: ClassVar[str] = "codec_error"


class DecodeError(CodecError, ValueError):
    """Frames could not be decoded into the requested message type.

    Raised for truncated, corrupted or empty frames, frames written by another
    codec, and well-formed messages of the wrong type. Never anything else.
    """

    code: ClassVar[str] = "decode_error"


class EncodeError(CodecError, TypeError):
    """A message could not be encoded."""

    code: ClassVar[str] = "encode_error"


UNSUPPORTED_PAYLOAD = "unsupported_payload"

# The kinds of multimodal value a message can carry, by the top-level package of their type.
MULTIMODAL_KINDS = {"torch": "tensor", "numpy": "array", "PIL": "image"}
ALL_MULTIMODAL_KINDS = frozenset(MULTIMODAL_KINDS.values())


def multimodal_kind(obj: Any) -> str:
    """ "tensor", "array" or "image" (empty for anything else)."""
    return MULTIMODAL_KINDS.get(type(obj).__module__.partition(".")[0], "")


class UnsupportedPayloadError(EncodeError):
    """The codec cannot carry a value in this message (e.g. an image in text-only msgspec)."""

    code: ClassVar[str] = UNSUPPORTED_PAYLOAD

    def __init__(self, codec: str, obj: Any, capable: Sequence[str] | Mapping[str, Sequence[str]]) -> None:
        kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
        if isinstance(capable, Mapping):  # the capable codecs per kind of value
            capable = capable.get(multimodal_kind(obj), ())
        self.codec = codec
        self.type_name = kind
        self.capable = list(capable)
        others = ", ".join(self.capable) or "none registered"
        super().__init__(
            f"codec {codec!r} cannot carry {kind} (multimodal inputs: images, "
            f"tensors, arrays); use a codec that can: {others}"
        )


class Codec(ABC):
    """What the transport needs from a codec, and the facts the rest of wirebench reads from its class.

    A codec subclasses this, sets ``name`` and the facts that differ from the
    defaults below, and defines ``encode`` and ``decode``. The registry reads
    the facts from the class without making an instance (a codec may import
    something heavy when instantiated), and refuses a registered class that is
    not a subclass or leaves ``encode``/``decode`` undefined.

    An instance is not safe for two concurrent ``encode`` calls (or two
    concurrent ``decode`` calls); one encode and one decode may run at once on
    different threads. ``get_codec`` returns a fresh instance per call.
    """

    name: ClassVar[str]
    # Images, tensors and arrays can travel in EngineCoreRequest.mm_inputs; a codec without
    # it refuses them with UnsupportedPayloadError.
    carries_multimodal: ClassVar[bool] = False
    # Of those, the kinds it carries ("tensor", "array", "image"); it refuses the others.
    multimodal_kinds: ClassVar[frozenset[str]] = ALL_MULTIMODAL_KINDS
    # Big buffers leave the body as frames of their own (frame 1 on), which decode takes as
    # views: the shm transports need it, they carry exactly those frames.
    out_of_band: ClassVar[bool] = False
    # It wants prompt_token_ids as a little-endian int32 numpy array (the frontend converts
    # before encoding) and decodes them as one.
    packed_token_ids: ClassVar[bool] = False
    # Decode runs code the sender chooses (pickle), so it must never face an untrusted peer:
    # bench serve refuses it over non-loopback tcp.
    unpickles_peer_data: ClassVar[bool] = False

    # For a codec that refuses some multimodal kinds: the codecs that carry each kind, for
    # its refusal to name. get_codec fills it in from the registry.
    alternatives: Mapping[str, Sequence[str]] = {}

    @abstractmethod
    def encode(self, msg: Any) -> Frames:
        """The message as frames: frame 0 the body, later frames out-of-band buffers."""

    @abstractmethod
    def decode(self, frames: Sequence[Frame], msg_type: type[T]) -> T:
        """The message of type ``msg_type`` in ``frames``; DecodeError for anything else."""


class CodecCalls:
    """A codec's encode and decode split from its adapter, for callers that time them apart.

    A codec whose native messages are another project's (``vllm``) defines
    ``to_native(msg)``, ``encode_native(native)``, ``decode_native(frames,
    msg_type)`` and ``from_native(native, msg_type)``: the adapter turns our
    message into its own and back, which is not codec time. Any other codec's
    adapter is the identity and ``adapts`` is False.
    """

    __slots__ = ("to_native", "encode", "decode", "from_native", "adapts")

    def __init__(self, codec: Any) -> None:
        self.adapts = hasattr(codec, "to_native")
        if self.adapts:
            self.to_native, self.encode = codec.to_native, codec.encode_native
            self.decode, self.from_native = codec.decode_native, codec.from_native
        else:
            self.to_native, self.encode = _same, codec.encode
            self.decode, self.from_native = codec.decode, _same


def _same(msg: Any, *_: Any) -> Any:
    return msg


def as_buffer(frame: Frame) -> bytes | bytearray | memoryview:
    """The bytes of a frame without copying (zmq.Frame exposes a memoryview)."""
    if isinstance(frame, zmq.Frame):
        return frame.buffer
    return frame


def check_type(msg: Any, msg_type: type[T], codec: str) -> T:
    if type(msg) is not msg_type:
        raise DecodeError(f"codec {codec!r}: expected {msg_type.__name__}, got {type(msg).__name__}")
    return msg


def require_frames(frames: Sequence[Frame], codec: str) -> None:
    if not frames:
        raise DecodeError(f"codec {codec!r}: no frames to decode")
