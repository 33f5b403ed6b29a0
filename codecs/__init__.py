"""wirebench's codecs: interchangeable serializations of the wire messages.

Installed as ``wirecodecs`` from the ``codecs/`` folder (a package named
``codecs`` would be shadowed by the standard library's).

Its modules, each with its job: docs/architecture.md (Packages, bottom-up).
"""

from .base import (
    UNSUPPORTED_PAYLOAD,
    Codec,
    CodecCalls,
    CodecError,
    DecodeError,
    EncodeError,
    Frame,
    Frames,
    UnsupportedPayloadError,
    as_buffer,
)
from .registry import (
    ENTRY_POINT_GROUP,
    UnknownCodecError,
    available_codecs,
    check_codec_spec,
    codec_listing,
    codecs_out_of_band,
    codecs_that_carry_multimodal,
    get_codec,
    packs_token_ids,
    sends_out_of_band,
    unavailable_codecs,
    unpickles_peer_data,
)

__all__ = [
    "UNSUPPORTED_PAYLOAD",
    "Codec",
    "CodecCalls",
    "CodecError",
    "DecodeError",
    "EncodeError",
    "ENTRY_POINT_GROUP",
    "Frame",
    "Frames",
    "UnknownCodecError",
    "UnsupportedPayloadError",
    "as_buffer",
    "available_codecs",
    "codec_listing",
    "unavailable_codecs",
    "check_codec_spec",
    "codecs_out_of_band",
    "codecs_that_carry_multimodal",
    "get_codec",
    "packs_token_ids",
    "sends_out_of_band",
    "unpickles_peer_data",
]
