"""msgpack codecs built on msgspec's typed Structs.

- ``msgspec``: text only; a multimodal value raises UnsupportedPayloadError.
- ``msgspec-b64``: images, tensors and arrays become maps holding the base64
  string of their raw bytes plus mode/size or dtype/shape (no PNG re-encoding).
- ``msgspec-oob``: their buffers above a small threshold leave the body as
  separate frames, uncopied; decode builds views on the received frames.

Encoders and one typed decoder per message type are built once per instance.
"""

from __future__ import annotations

import binascii
from collections.abc import Sequence
from typing import Any, ClassVar

import msgspec
import numpy as np
from PIL import Image

from .base import (
    INLINE_THRESHOLD,
    Codec,
    DecodeError,
    EncodeError,
    Frame,
    Frames,
    T,
    UnsupportedPayloadError,
    as_buffer,
    require_frames,
)
from .rawbuf import (
    array_from_raw,
    array_to_raw,
    image_from_raw,
    image_to_raw,
    is_tensor,
    tensor_from_raw,
    tensor_to_raw,
)


def is_multimodal(obj: Any) -> bool:
    return is_tensor(obj) or isinstance(obj, (np.ndarray, Image.Image))


class _MsgspecBase(Codec):
    """Shared encode/decode plumbing; subclasses say how multimodal values travel."""

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)
        self._decoders: dict[type, msgspec.msgpack.Decoder] = {}

    def _enc_hook(self, obj: Any) -> Any:
        raise NotImplementedError

    def _decoder(self, msg_type: type) -> msgspec.msgpack.Decoder:
        dec = self._decoders.get(msg_type)
        if dec is None:
            dec = self._decoders[msg_type] = self._make_decoder(msg_type)
        return dec

    def _make_decoder(self, msg_type: type) -> msgspec.msgpack.Decoder:
        return msgspec.msgpack.Decoder(msg_type)

    def encode(self, msg: Any) -> Frames:
        return [self._encode_body(msg)]

    def _encode_body(self, msg: Any) -> bytes:
        try:
            return self._encoder.encode(msg)
        except EncodeError:
            raise
        except Exception as exc:  # enc_hook may surface torch/PIL errors of any type
            raise EncodeError(f"codec {self.name!r}: {type(exc).__name__}: {exc}") from exc

    def decode(self, frames: Sequence[Frame], msg_type: type[T]) -> T:
        require_frames(frames, self.name)
        if len(frames) != 1:
            raise DecodeError(f"codec {self.name!r}: expected 1 frame, got {len(frames)}")
        try:
            msg = self._decoder(msg_type).decode(as_buffer(frames[0]))
            return self._restore(msg)
        except Exception as exc:  # a corrupt header can make torch/PIL raise anything
            raise _decode_error(self.name, exc) from exc

    def _restore(self, msg: Any) -> Any:
        return msg


def _decode_error(codec: str, exc: Exception) -> DecodeError:
    if isinstance(exc, DecodeError):  # ours (msgspec.DecodeError is unrelated)
        return exc
    return DecodeError(f"codec {codec!r}: {type(exc).__name__}: {exc}")


class MsgspecCodec(_MsgspecBase):
    """Typed msgpack, text only: the codec vLLM could not use for PIL images."""

    name: ClassVar[str] = "msgspec"
    carries_multimodal: ClassVar[bool] = False

    def _enc_hook(self, obj: Any) -> Any:
        if is_multimodal(obj):
            raise UnsupportedPayloadError(self.name, obj, self.alternatives)
        raise EncodeError(f"codec {self.name!r} cannot encode {type(obj).__qualname__}")

    def _restore(self, msg: Any) -> Any:
        # This codec never writes multimodal inputs, so any that arrive were
        # written by another codec (b64 maps, oob extensions): refuse them
        # rather than hand the engine raw wire structures.
        if getattr(msg, "mm_inputs", None):
            raise ValueError("text-only codec received multimodal inputs (frames from another codec?)")
        return msg


# Key that marks a base64 map in msgspec-b64; user dict keys never start with it.
_B64_TAG = "__wirebench__"


class MsgspecB64Codec(_MsgspecBase):
    """Multimodal values as maps with a base64 string of their raw bytes."""

    name: ClassVar[str] = "msgspec-b64"
    carries_multimodal: ClassVar[bool] = True

    def _enc_hook(self, obj: Any) -> Any:
        if is_tensor(obj):
            dtype, shape, buf = tensor_to_raw(obj)
            return {_B64_TAG: "tensor", "dtype": dtype, "shape": shape, "data": _b64(buf)}
        if isinstance(obj, np.ndarray):
            dtype, shape, buf = array_to_raw(obj)
            return {_B64_TAG: "array", "dtype": dtype, "shape": shape, "data": _b64(buf)}
        if isinstance(obj, Image.Image):
            (mode, w, h, pal_mode, pal), pixels = image_to_raw(obj)
            return {
                _B64_TAG: "image",
                "mode": mode,
                "size": [w, h],
                "palette_mode": pal_mode,
                "palette": pal,
                "data": _b64(pixels),
            }
        raise EncodeError(f"codec {self.name!r} cannot encode {type(obj).__qualname__}")

    def _restore(self, msg: Any) -> Any:
        # Only EngineCoreRequest's untyped fields can hold base64 maps: mm_inputs, and
        # prompt_token_ids when the sender packed them into an array.
        ids = getattr(msg, "prompt_token_ids", None)
        if isinstance(ids, dict):
            msg.prompt_token_ids = _from_b64_map(ids)
        items = getattr(msg, "mm_inputs", None)
        if items:
            msg.mm_inputs = [self._restore_item(item) for item in items]
        return msg

    def _restore_item(self, item: Any) -> Any:
        if not isinstance(item, dict):
            raise ValueError(f"multimodal input is a {type(item).__name__}, not a map")
        if _B64_TAG in item:
            return _from_b64_map(item)
        return {key: _from_b64_map(value) for key, value in item.items()}


def _b64(buf: Any) -> str:
    return binascii.b2a_base64(buf, newline=False).decode("ascii")


def _from_b64_map(obj: Any) -> Any:
    if not isinstance(obj, dict):
        raise ValueError(f"expected a base64 map, got {type(obj).__name__}")
    kind = obj.get(_B64_TAG)
    try:
        data = binascii.a2b_base64(obj["data"], strict_mode=True)
    except (binascii.Error, TypeError) as exc:
        raise ValueError(f"invalid base64 data: {exc}") from exc
    if kind == "tensor":
        return tensor_from_raw(obj["dtype"], obj["shape"], data)
    if kind == "array":
        return array_from_raw(obj["dtype"], obj["shape"], data)
    if kind == "image":
        size = obj["size"]
        if not isinstance(size, list) or len(size) != 2:
            raise ValueError(f"invalid image size {size!r}")
        header = (obj["mode"], size[0], size[1], obj.get("palette_mode"), obj.get("palette"))
        return image_from_raw(header, data)
    raise ValueError(f"unknown multimodal kind {kind!r}")


# msgpack extension codes of msgspec-oob.
# (msgspec-packed shifts them by EXT_SHIFT: its frames are not msgspec-oob's, and a decoder told the
# wrong codec refuses them instead of half-reading them.)
_EXT_TENSOR, _EXT_ARRAY, _EXT_IMAGE, _EXT_IDS = 1, 2, 3, 4


class MsgspecOobCodec(_MsgspecBase):
    """Multimodal buffers as extra ZeroMQ frames, referenced by index from the body.

    Each value becomes a msgpack extension whose payload is a small msgpack
    header ending in either the frame index (an int) or the inline bytes.
    """

    name: ClassVar[str] = "msgspec-oob"
    carries_multimodal: ClassVar[bool] = True
    out_of_band: ClassVar[bool] = True
    ext_shift: ClassVar[int] = 0

    def __init__(self) -> None:
        super().__init__()
        self._header_encoder = msgspec.msgpack.Encoder()
        self._header_decoder = msgspec.msgpack.Decoder(tuple)
        self._out: Frames = []  # frames of the encode in progress
        self._in: list[Any] = []  # oob buffers of the decode in progress
        self._used: set[int] = set()  # frame indices the decode referenced

    def _make_decoder(self, msg_type: type) -> msgspec.msgpack.Decoder:
        return msgspec.msgpack.Decoder(msg_type, ext_hook=self._ext_hook)

    def encode(self, msg: Any) -> Frames:
        self._out = [b""]
        try:
            self._out[0] = self._encode_body(msg)
            return self._out
        finally:
            self._out = []

    def _place(self, buf: Any) -> int | Any:
        """Frame index for a large buffer (uncopied), or the buffer itself to inline."""
        if memoryview(buf).nbytes < INLINE_THRESHOLD:
            return buf
        self._out.append(buf)
        return len(self._out) - 1

    def _enc_hook(self, obj: Any) -> Any:
        header: tuple[Any, ...]
        if is_tensor(obj):
            dtype, shape, buf = tensor_to_raw(obj)
            code, header = _EXT_TENSOR + self.ext_shift, (dtype, shape, self._place(buf))
        elif isinstance(obj, np.ndarray):
            dtype, shape, buf = array_to_raw(obj)
            code, header = _EXT_ARRAY + self.ext_shift, (dtype, shape, self._place(buf))
        elif isinstance(obj, Image.Image):
            image_header, pixels = image_to_raw(obj)
            code, header = _EXT_IMAGE + self.ext_shift, (*image_header, self._place(pixels))
        else:
            raise EncodeError(f"codec {self.name!r} cannot encode {type(obj).__qualname__}")
        return msgspec.msgpack.Ext(code, self._header_encoder.encode(header))

    def decode(self, frames: Sequence[Frame], msg_type: type[T]) -> T:
        require_frames(frames, self.name)
        self._in = [as_buffer(f) for f in frames[1:]]
        self._used.clear()
        try:
            msg = self._restore(self._decoder(msg_type).decode(as_buffer(frames[0])))
        except Exception as exc:  # a corrupt header can make torch/PIL raise anything
            raise _decode_error(self.name, exc) from exc
        finally:
            self._in = []
        if len(self._used) != len(frames) - 1:
            raise DecodeError(
                f"codec {self.name!r}: {len(frames) - 1} out-of-band frames sent, {len(self._used)} referenced"
            )
        return msg

    def _restore(self, msg: Any) -> Any:
        # Every image/tensor/array this codec writes comes back from _ext_hook;
        # anything else (e.g. msgspec-b64's maps) was written by another codec.
        for item in getattr(msg, "mm_inputs", None) or ():
            values = item.values() if isinstance(item, dict) else (item,)
            for value in values:
                if not is_multimodal(value):
                    raise ValueError(
                        f"multimodal input holds a {type(value).__name__}, not an "
                        "image, tensor or array (frames from another codec?)"
                    )
        return msg

    def _buffer(self, ref: Any) -> Any:
        if type(ref) is int:
            if not 1 <= ref <= len(self._in):
                raise ValueError(f"reference to missing frame {ref}")
            self._used.add(ref)
            return self._in[ref - 1]
        if isinstance(ref, (bytes, bytearray, memoryview)):
            # Inline bytes point into the body; copy so the value owns its memory.
            return bytearray(ref)
        raise ValueError(f"invalid buffer reference {ref!r}")

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        header = self._header_decoder.decode(data)
        code -= self.ext_shift
        if code == _EXT_TENSOR and len(header) == 3:
            return tensor_from_raw(header[0], header[1], self._buffer(header[2]))
        if code == _EXT_ARRAY and len(header) == 3:
            return array_from_raw(header[0], header[1], self._buffer(header[2]))
        if code == _EXT_IMAGE and len(header) == 6:
            return image_from_raw(header[:5], self._buffer(header[5]))
        raise ValueError(f"unknown extension code {code} with {len(header)} fields")


class MsgspecPackedCodec(MsgspecOobCodec):
    """msgspec-oob, and prompt token ids as one little-endian int32 buffer instead of a list of ints.

    The frontend hands it ``prompt_token_ids`` as an int32 array (``packed_token_ids``
    says so); the buffer travels inline in the body (a 550-token prompt is 2.2 KB)
    and decodes as a read-only numpy view on the received frame: no Python int is
    made per token on either side. A list still encodes as a list. Output token
    ids stay lists: a step's outputs carry one id each, where packing saves nothing.
    """

    name: ClassVar[str] = "msgspec-packed"
    packed_token_ids: ClassVar[bool] = True
    ext_shift: ClassVar[int] = 16

    def _enc_hook(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray) and obj.ndim == 1 and obj.dtype == _IDS_DTYPE:
            return msgspec.msgpack.Ext(_EXT_IDS + self.ext_shift, obj.tobytes())
        return super()._enc_hook(obj)

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        if code == _EXT_IDS + self.ext_shift:
            if len(data) % 4:
                raise ValueError(f"packed token ids of {len(data)} bytes: not a whole number of int32")
            return np.frombuffer(data, dtype=_IDS_DTYPE)
        return super()._ext_hook(code, data)


_IDS_DTYPE = np.dtype("<i4")
