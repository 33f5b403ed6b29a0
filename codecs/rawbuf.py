"""Tensors, arrays and PIL images as (small header, raw byte buffer) and back.

Shared by every codec that carries multimodal inputs without pickling them
(``msgspec-b64``, ``msgspec-oob``, ``pickle-oob``), so all of them move the
same bytes and differ only in how those bytes travel.

To bytes: a contiguous CPU tensor or array gives a zero-copy uint8 view (so
bfloat16, which numpy lacks, travels as plain bytes); a non-contiguous or GPU
tensor costs one copy. A PIL image always costs one copy (``tobytes``): PIL
exposes no buffer of its pixels.

From bytes: the result is a view on the given buffer wherever the buffer
allows, so a tensor decoded from a received frame shares its memory. Every
header field is validated, and the buffer size must match the header exactly,
so a corrupt header is a ValueError, never a wrong-shaped tensor.
"""

from __future__ import annotations

import functools
import math
import sys
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

if TYPE_CHECKING:
    import torch

# torch.frombuffer warns once per process about read-only buffers (bytes from
# base64, msgpack inline data). Decoded tensors are documented as read-only
# views: clone before writing in place.
warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)


def is_tensor(obj: Any) -> bool:
    """A torch tensor. torch is imported only where a tensor is built or decoded, so a codec on text
    messages never loads it (a process that made a tensor has already imported torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


@functools.cache
def torch_dtypes() -> dict[str, torch.dtype]:
    """The dtypes accepted from the wire, by name: a header cannot make us getattr() arbitrary
    attributes of torch."""
    import torch

    return {
        str(d).removeprefix("torch."): d
        for d in (
            torch.float64,
            torch.float32,
            torch.float16,
            torch.bfloat16,
            torch.int64,
            torch.int32,
            torch.int16,
            torch.int8,
            torch.uint8,
            torch.bool,
            torch.complex64,
            torch.complex128,
        )
    }


# Bits per pixel of the PIL modes we carry (rows are padded to whole bytes).
IMAGE_MODE_BITS: dict[str, int] = {
    "1": 1,
    "L": 8,
    "P": 8,
    "LA": 16,
    "PA": 16,
    "La": 16,
    "RGB": 24,
    "YCbCr": 24,
    "LAB": 24,
    "HSV": 24,
    "RGBA": 32,
    "RGBa": 32,
    "RGBX": 32,
    "CMYK": 32,
    "I": 32,
    "F": 32,
    "I;16": 16,
    "I;16L": 16,
    "I;16B": 16,
}

_EMPTY = memoryview(b"")


def _shape(shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, (list, tuple)) or not all(type(d) is int and d >= 0 for d in shape):
        raise ValueError(f"invalid shape {shape!r}")
    return tuple(shape)


def _check_size(buf: Any, expected: int, what: str) -> memoryview:
    view = memoryview(buf)
    if view.nbytes != expected:
        raise ValueError(f"{what}: buffer holds {view.nbytes} bytes, header says {expected}")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


# --- torch tensors -----------------------------------------------------------


def tensor_to_raw(t: torch.Tensor) -> tuple[str, list[int], memoryview]:
    """(dtype name, shape, uint8 buffer); zero-copy for contiguous CPU tensors."""
    # resolve_conj/resolve_neg materialize lazy conjugate/negation views (a
    # no-op otherwise): view(uint8) refuses tensors with those bits set.
    t = t.detach().resolve_conj().resolve_neg()
    if t.device.type != "cpu":
        t = t.cpu()
    dtype = str(t.dtype).removeprefix("torch.")
    if dtype not in torch_dtypes():
        raise TypeError(f"tensor dtype {t.dtype} is not supported on the wire")
    shape = list(t.shape)
    if t.numel() == 0:
        return dtype, shape, _EMPTY
    # reshape(-1) of a contiguous tensor is a view; view(uint8) reinterprets
    # the bytes, which is how bfloat16 gets through numpy.
    import torch

    flat = t.contiguous().reshape(-1).view(torch.uint8)
    return dtype, shape, memoryview(flat.numpy())  # type: ignore[arg-type]  # ndarray is a buffer


def tensor_from_raw(dtype: Any, shape: Any, buf: Any) -> torch.Tensor:
    import torch

    torch_dtype = torch_dtypes().get(dtype) if isinstance(dtype, str) else None
    if torch_dtype is None:
        raise ValueError(f"unknown tensor dtype {dtype!r}")
    dims = _shape(shape)
    itemsize = torch_dtype.itemsize  # no throwaway tensor per decode
    view = _check_size(buf, math.prod(dims) * itemsize, "tensor")
    if view.nbytes == 0:
        return torch.empty(dims, dtype=torch_dtype)
    return torch.frombuffer(view, dtype=torch.uint8).view(torch_dtype).view(dims)


# --- numpy arrays ------------------------------------------------------------


def array_to_raw(a: np.ndarray) -> tuple[str, list[int], memoryview]:
    """(dtype.str with byte order, shape, uint8 buffer); zero-copy when C-contiguous."""
    if a.dtype.hasobject or a.dtype.fields is not None:
        raise TypeError(f"numpy dtype {a.dtype} is not supported on the wire")
    shape = list(a.shape)  # before ascontiguousarray, which turns 0-d into shape (1,)
    flat = np.ascontiguousarray(a).reshape(-1)
    return a.dtype.str, shape, memoryview(flat.view(np.uint8))  # type: ignore[arg-type]  # ndarray is a buffer


def array_from_raw(dtype: Any, shape: Any, buf: Any) -> np.ndarray:
    try:
        np_dtype = np.dtype(dtype) if isinstance(dtype, str) else None
    except TypeError as exc:
        raise ValueError(f"unknown array dtype {dtype!r}") from exc
    if np_dtype is None or np_dtype.hasobject or np_dtype.fields is not None:
        raise ValueError(f"unsupported array dtype {dtype!r}")
    dims = _shape(shape)
    view = _check_size(buf, math.prod(dims) * np_dtype.itemsize, "array")
    return np.frombuffer(view, dtype=np_dtype).reshape(dims)


# --- PIL images --------------------------------------------------------------

ImageHeader = tuple[str, int, int, str | None, bytes | None]


def image_to_raw(img: Image.Image) -> tuple[ImageHeader, bytes]:
    """((mode, width, height, palette mode, palette bytes), pixel bytes)."""
    if img.mode not in IMAGE_MODE_BITS:
        raise TypeError(f"PIL image mode {img.mode!r} is not supported on the wire")
    palette_mode = palette = None
    if img.mode in ("P", "PA") and img.palette is not None:
        palette_mode, palette = img.palette.mode, img.palette.tobytes()
    return (img.mode, img.width, img.height, palette_mode, palette), img.tobytes()


def image_from_raw(header: Any, buf: Any) -> Image.Image:
    try:
        mode, width, height, palette_mode, palette = header
    except (TypeError, ValueError) as exc:
        raise ValueError(f"invalid image header {header!r}") from exc
    bits = IMAGE_MODE_BITS.get(mode) if isinstance(mode, str) else None
    if bits is None:
        raise ValueError(f"unsupported image mode {mode!r}")
    width, height = _shape([width, height])
    view = _check_size(buf, (width * bits + 7) // 8 * height, "image")
    if width == 0 or height == 0:
        img = Image.new(mode, (width, height))
    else:
        img = Image.frombuffer(mode, (width, height), view, "raw", mode, 0, 1)  # type: ignore[arg-type]
    if palette is not None:
        if palette_mode not in ("RGB", "RGBA") or not isinstance(palette, (bytes, bytearray, memoryview)):
            raise ValueError(f"invalid image palette mode {palette_mode!r}")
        img.putpalette(bytes(palette), palette_mode)
    return img
