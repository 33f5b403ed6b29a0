"""``vllm``: vLLM's own serializer (``vllm.v1.serial_utils.MsgpackEncoder``/``MsgpackDecoder``) on vLLM's own messages.

Needs vLLM installed beside the CPU torch (``scripts/setup.sh --with-vllm``: the
wheel with ``--no-deps`` and its import-time dependencies). Written against
vLLM 0.33.0 (``vllm_messages.VLLM_VERSION``); another version is used as found,
with one warning, since its message fields may have moved.

The codec clock covers what a vLLM server runs: ``MsgpackEncoder.encode`` (tensors
of 256 B and more leave as frames of their own, uncopied) and
``MsgpackDecoder.decode`` (typed msgspec decode with vLLM's hooks: SamplingParams
validated in ``__post_init__``, tensors as views on the frames). Turning our
message into vLLM's and back (``to_native`` / ``from_native``) is timed apart by
the transport: the adapter's cost, which a vLLM server does not pay.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any, ClassVar

from .base import Codec, DecodeError, EncodeError, Frame, Frames, T, UnsupportedPayloadError, as_buffer, require_frames

_warned_version = False


def _load() -> ModuleType:
    """vLLM and the adapter, imported by the first instance: the class's facts (what the registry
    reads to list codecs) must not cost vLLM's import (seconds; minutes under callgrind)."""
    global _warned_version
    # vLLM logs at import and warns about platform plugins; the codec's user wants neither.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import vllm

    from . import vllm_messages as vm

    if vllm.__version__ != vm.VLLM_VERSION and not _warned_version:
        _warned_version = True
        warnings.warn(
            f"codec 'vllm' was written against vLLM {vm.VLLM_VERSION}, found {vllm.__version__}: "
            "its message fields may differ (the conformance suite says whether they round-trip)",
            stacklevel=3,
        )
    return vm


class VllmCodec(Codec):
    name: ClassVar[str] = "vllm"
    carries_multimodal: ClassVar[bool] = True
    out_of_band: ClassVar[bool] = True
    # vLLM's multimodal items hold processed tensors; PIL images and numpy arrays are refused.
    multimodal_kinds: ClassVar[frozenset[str]] = frozenset({"tensor"})

    def __init__(self) -> None:
        from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

        self._vm = vm = _load()
        self._mappings = vm.MAPPINGS
        self._not_carried = vm.NotCarried
        self._encoder = MsgpackEncoder()
        self._decoder_class = MsgpackDecoder
        self._decoders: dict[type, Any] = {}

    # --- the adapter (not codec time) ---

    def to_native(self, msg: Any) -> Any:
        mapping = self._mappings.get(type(msg))
        if mapping is None:
            raise EncodeError(f"codec {self.name!r} cannot encode {type(msg).__qualname__}")
        try:
            return mapping[1](msg)
        except self._not_carried as exc:
            raise UnsupportedPayloadError(self.name, exc.value, self.alternatives) from None
        except Exception as exc:  # vLLM's SamplingParams validation raises ValueError
            raise EncodeError(f"codec {self.name!r}: {type(exc).__name__}: {exc}") from exc

    def from_native(self, native: Any, msg_type: type[T]) -> T:
        try:
            return self._mappings[msg_type][2](native)
        except Exception as exc:
            raise DecodeError(f"codec {self.name!r}: {type(exc).__name__}: {exc}") from exc

    # --- vLLM's serializer (codec time) ---

    def encode_native(self, native: Any) -> Frames:
        try:
            return list(self._encoder.encode(native))  # type: ignore[arg-type]  # vLLM: bytes and memoryviews
        except Exception as exc:
            raise EncodeError(f"codec {self.name!r}: {type(exc).__name__}: {exc}") from exc

    def decode_native(self, frames: Sequence[Frame], msg_type: type) -> Any:
        require_frames(frames, self.name)
        if msg_type not in self._mappings:
            raise DecodeError(f"codec {self.name!r} cannot decode {msg_type.__name__}")
        decoder = self._decoders.get(msg_type)
        if decoder is None:
            decoder = self._decoders[msg_type] = self._decoder_class(self._mappings[msg_type][0])
        try:
            return decoder.decode([as_buffer(f) for f in frames])
        except Exception as exc:  # msgspec, vLLM's hooks and torch can raise anything on bad frames
            raise DecodeError(f"codec {self.name!r}: {type(exc).__name__}: {exc}") from exc

    # --- the Codec protocol: both together ---

    def encode(self, msg: Any) -> Frames:
        return self.encode_native(self.to_native(msg))

    def decode(self, frames: Sequence[Frame], msg_type: type[T]) -> T:
        return self.from_native(self.decode_native(frames, msg_type), msg_type)
