"""``pickle`` and ``pickle-oob``: the standard library's pickle.

Never decode pickle frames from a peer you do not trust: unpickling runs
arbitrary code chosen by the sender.
"""

from __future__ import annotations

import io
import pickle
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from PIL import Image

from .base import (
    INLINE_THRESHOLD,
    Codec,
    DecodeError,
    EncodeError,
    Frame,
    Frames,
    T,
    as_buffer,
    check_type,
    require_frames,
)
from .rawbuf import image_from_raw, image_to_raw, tensor_from_raw, tensor_to_raw

if TYPE_CHECKING:
    import torch


class PickleCodec(Codec):
    """The whole message pickled with the highest protocol into one frame."""

    name: ClassVar[str] = "pickle"
    carries_multimodal: ClassVar[bool] = True
    unpickles_peer_data: ClassVar[bool] = True

    def encode(self, msg: Any) -> Frames:
        try:
            return [pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)]
        except Exception as exc:  # PicklingError, TypeError, AttributeError, ...
            raise _encode_error(self.name, exc) from exc

    def decode(self, frames: Sequence[Frame], msg_type: type[T]) -> T:
        require_frames(frames, self.name)
        if len(frames) != 1:
            raise DecodeError(f"codec {self.name!r}: expected 1 frame, got {len(frames)}")
        try:
            msg = pickle.loads(as_buffer(frames[0]))
        except Exception as exc:  # unpickling bad bytes can raise nearly anything
            raise DecodeError(f"codec {self.name!r}: {type(exc).__name__}: {exc}") from exc
        return check_type(msg, msg_type, self.name)


def _encode_error(codec: str, exc: Exception) -> EncodeError:
    if isinstance(exc, EncodeError):
        return exc
    return EncodeError(f"codec {codec!r}: {type(exc).__name__}: {exc}")


# Rebuild functions named in the pickle stream; module-level so pickle can find them.
def _rebuild_tensor(dtype: str, shape: list[int], buf: Any) -> torch.Tensor:
    return tensor_from_raw(dtype, shape, buf)


def _rebuild_image(header: tuple, buf: Any) -> Image.Image:
    return image_from_raw(header, buf)


class _OutOfBandPickler(pickle.Pickler):
    """Pickles tensors and images as raw buffers that can leave the stream.

    Torch tensors and PIL images do not produce pickle-5 out-of-band buffers on
    their own (torch serializes its storage in-band; PIL pickles ``tobytes``),
    so they are reduced here to a rebuild function plus a ``PickleBuffer``.
    numpy arrays already support out-of-band buffers natively.
    """

    def reducer_override(self, obj: Any) -> Any:
        # Called for nearly every object pickled: rawbuf.is_tensor written inline (no call per object).
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            dtype, shape, buf = tensor_to_raw(obj)
            return _rebuild_tensor, (dtype, shape, pickle.PickleBuffer(buf))
        if isinstance(obj, Image.Image):
            header, pixels = image_to_raw(obj)
            return _rebuild_image, (header, pickle.PickleBuffer(pixels))
        return NotImplemented


class PickleOobCodec(Codec):
    """Pickle protocol 5 with tensor, array and image buffers as separate frames."""

    name: ClassVar[str] = "pickle-oob"
    carries_multimodal: ClassVar[bool] = True
    out_of_band: ClassVar[bool] = True
    unpickles_peer_data: ClassVar[bool] = True

    def encode(self, msg: Any) -> Frames:
        if not getattr(msg, "mm_inputs", None):
            # Nothing to take out of band: the C pickler alone writes the same
            # stream, without a Python reducer_override call per object.
            try:
                return [pickle.dumps(msg, protocol=5)]
            except Exception as exc:
                raise _encode_error(self.name, exc) from exc
        frames: Frames = [b""]

        def keep_in_band(buf: pickle.PickleBuffer) -> bool:
            raw = buf.raw()
            if raw.nbytes < INLINE_THRESHOLD:
                return True
            frames.append(raw)
            return False

        body = io.BytesIO()
        try:
            _OutOfBandPickler(body, protocol=5, buffer_callback=keep_in_band).dump(msg)
        except Exception as exc:  # unsupported dtype/mode, unpicklable value, ...
            raise _encode_error(self.name, exc) from exc
        frames[0] = body.getbuffer()
        return frames

    def decode(self, frames: Sequence[Frame], msg_type: type[T]) -> T:
        require_frames(frames, self.name)
        # An iterator, so we can tell afterwards whether pickle consumed every
        # buffer: pickle.loads silently ignores extra ones.
        buffers = iter([as_buffer(f) for f in frames[1:]])
        try:
            msg = pickle.loads(as_buffer(frames[0]), buffers=buffers)
        except Exception as exc:
            raise DecodeError(f"codec {self.name!r}: {type(exc).__name__}: {exc}") from exc
        left = sum(1 for _ in buffers)
        if left:
            raise DecodeError(
                f"codec {self.name!r}: {len(frames) - 1} out-of-band frames sent, {len(frames) - 1 - left} referenced"
            )
        return check_type(msg, msg_type, self.name)


__all__ = ["PickleCodec", "PickleOobCodec"]
