"""Turn a chat request's image data URLs into the engine's multimodal inputs.

``open_data_url`` refuses malformed, undecodable or oversized input with a
``ValueError`` saying what was wrong (sizes from the header, before any pixel
is decoded); ``process_image`` then decodes and gives the engine-bound form.

Two payload shapes, because what a frontend sends for an image is exactly what
the codecs are compared on:

* ``"pil"``: the decoded ``PIL.Image`` itself (what vLLM's requests carried
  when it switched to pickle; msgspec cannot carry it without help).
* ``"tensor"``: processed pixels, ``{"pixel_values": torch.Tensor[1, 3, S, S]}``
  resized to S×S and normalised with CLIP's mean/std, in a chosen dtype —
  the shape a LLaVA-style vision tower takes.

Everything here is CPU-heavy and synchronous; the server runs it in a worker
thread (``asyncio.to_thread``) so the event loop keeps streaming.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import ctypes
import hashlib
import io
import re
import warnings
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from PIL import Image

from harness.frontend.protocol import ProtocolError

MmPayload = Literal["pil", "tensor"]
MM_PAYLOADS: tuple[str, ...] = ("pil", "tensor")

# CLIP ViT-L/14-336's normalisation (LLaVA-1.5's vision tower).
CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)

TENSOR_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")

DEFAULT_MAX_IMAGE_BYTES = 20 * 1024 * 1024
DEFAULT_MAX_PIXELS = 4096 * 4096
_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^,;]*)*),", re.ASCII)


@dataclass(frozen=True)
class ProcessedImage:
    mm_input: Any  # PIL.Image.Image or {"pixel_values": torch.Tensor}
    mm_hash: str  # sha256 hex of the decoded pixels


def image_hash(image: Image.Image) -> str:
    """sha256 of the decoded image (mode, size and pixel bytes), like vLLM's MM hasher.

    Hashing pixels rather than the file bytes makes two encodings of the same
    picture share a hash, which is what a prefix/encoder cache would key on.
    """
    h = hashlib.sha256()
    h.update(f"{image.mode}:{image.width}x{image.height}:".encode())
    h.update(image.tobytes())
    return h.hexdigest()


def torch_dtype(name: str) -> Any:
    """The torch dtype for one of TENSOR_DTYPES; ValueError otherwise."""
    if name not in TENSOR_DTYPES:
        raise ValueError(f"unsupported image tensor dtype {name!r}; choose one of {', '.join(TENSOR_DTYPES)}")
    import torch  # only the tensor payload needs torch here

    return getattr(torch, name)


class PixelBudget:
    """Decoded pixels in flight across all requests. A request acquires its images' pixels (counted
    from the headers) before any pixel is decoded, and gives them back once the engine has answered
    it (its first output, or its end): until then its decoded images live in this process. So
    concurrent image requests queue for memory instead of multiplying it; one that waits longer than
    ``wait_s`` gets a 503. At each release the C heap's free pages are given back to the system
    (glibc keeps them otherwise: 16 concurrent 4096² images left ~0.5 GB resident)."""

    def __init__(self, total: int, wait_s: float = 10.0) -> None:
        self.total = total
        self.wait_s = wait_s
        self.used = 0
        self._waiters: list[asyncio.Future[None]] = []

    async def acquire(self, pixels: int) -> Callable[[], None]:
        """Wait for room for ``pixels``; the function that gives them back (once, however often called)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        while self.used + pixels > self.total:
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise ProtocolError(
                    f"the server holds {self.used} decoded pixels of other requests' images (limit {self.total}, "
                    "bench serve --max-inflight-pixels); retry later",
                    status=503,
                ) from None
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        self.used += pixels
        held = [pixels]

        def release() -> None:
            if not held:
                return
            self.used -= held.pop()
            for waiter in self._waiters:
                if not waiter.done():
                    waiter.set_result(None)
            loop.run_in_executor(None, _give_back_free_memory)

        return release

    @contextlib.asynccontextmanager
    async def hold(self, pixels: int) -> AsyncIterator[None]:
        release = await self.acquire(pixels)
        try:
            yield
        finally:
            release()


_MALLOC_TRIM: Callable[[int], int] | None
try:  # looked up once: the release path of every image request calls it
    _MALLOC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
except (OSError, AttributeError):  # not glibc
    _MALLOC_TRIM = None


def _give_back_free_memory() -> None:
    """glibc's malloc_trim(0): free heap pages back to the system (elsewhere nothing)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


# Where a request's pixel tensors are built, all at once: ([shape, ...], torch dtype) → empty tensors,
# e.g. in the shm arena.
TensorAlloc = Callable[[list[tuple[int, ...]], Any], list[Any]]


def pixel_values(image: Image.Image, size: int, dtype: str = "float16", out: Any = None) -> Any:
    """Resize to size×size, scale to [0, 1], normalise; a torch tensor [1, 3, size, size].

    ``out`` is the tensor to write (e.g. one in the shm transport's arena, so the
    frame that carries it needs no copy); by default torch allocates.
    """
    import torch

    rgb = image.convert("RGB").resize((size, size), Image.Resampling.BICUBIC)
    arr = np.asarray(rgb, dtype=np.float32) / 255.0  # [S, S, 3]
    arr = (arr - CLIP_MEAN) / CLIP_STD
    chw = torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1))).unsqueeze(0)  # [1, 3, S, S]
    if out is None:
        return chw.to(torch_dtype(dtype)).contiguous()
    out.copy_(chw)  # the same conversion, written straight into the given memory
    return out


def to_mm_input(image: Image.Image, payload: MmPayload, size: int, dtype: str, out: Any = None) -> Any:
    """The engine-bound form of one decoded image (``out``: where its pixel tensor goes)."""
    if payload == "pil":
        return image
    if payload == "tensor":
        return {"pixel_values": pixel_values(image, size, dtype, out)}
    raise ValueError(f"unknown mm payload {payload!r}; choose one of {', '.join(MM_PAYLOADS)}")


def process_image(image: Image.Image, *, payload: MmPayload, size: int, dtype: str, out: Any = None) -> ProcessedImage:
    """Decode an opened image's pixels and convert them; ValueError with a clear message on bad input."""
    load_pixels(image)
    # A plain RGB image, as vLLM's image loader hands on: one mode for every
    # codec to carry, and no file object or PNG metadata riding along.
    rgb = image.convert("RGB")
    return ProcessedImage(to_mm_input(rgb, payload, size, dtype, out), image_hash(rgb))


def decode_data_url(
    url: str,
    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> Image.Image:
    """Decode a base64 image data URL into a loaded PIL image (``open_data_url``, then the pixels)."""
    img = open_data_url(url, max_bytes, max_pixels)
    load_pixels(img)
    return img


def load_pixels(img: Image.Image) -> None:
    """Decode the pixels of an image ``open_data_url`` opened; ValueError on truncated or corrupt data."""
    with warnings.catch_warnings():
        # We enforce our own pixel limit; PIL's bomb warning is noise here.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            img.load()
        except Exception as exc:  # truncated or corrupt pixel data
            raise ValueError(f"image data could not be decoded ({img.format or 'image'}): {exc}") from exc


def open_data_url(
    url: str,
    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> Image.Image:
    """Open a base64 image data URL: its header is read and its size checked, its pixels not yet decoded.

    Raises ValueError when the URL is not a base64 ``data:image/...`` URL, the
    payload is larger than ``max_bytes`` decoded bytes (checked before
    decoding), the bytes are not an image PIL can read, or the image has more
    than ``max_pixels`` pixels (checked from the header, before any pixel is
    decoded: a 128-byte PNG can claim 4096×4096).
    """
    if not isinstance(url, str):
        raise ValueError(f"image URL must be a string, got {type(url).__name__}")
    match = _DATA_URL.match(url[:256])
    if match is None:
        shown = url[:40] + ("..." if len(url) > 40 else "")
        raise ValueError(f"not a data URL (expected 'data:image/...;base64,...'): {shown!r}")
    mime = (match.group("mime") or "").lower()
    if not mime.startswith("image/"):
        raise ValueError(f"data URL media type must be image/*, got {mime or 'none'!r}")
    if "base64" not in [p.strip().lower() for p in match.group("params").split(";")]:
        raise ValueError("data URL must be base64-encoded (';base64,')")
    payload = url[match.end() :]
    # 4 base64 chars carry 3 bytes: refuse oversized input before decoding it.
    if len(payload) // 4 * 3 > max_bytes + 3:
        raise ValueError(f"image data is too large: about {len(payload) // 4 * 3} bytes, limit {max_bytes}")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"image data is not valid base64: {exc}") from exc
    if len(raw) > max_bytes:
        raise ValueError(f"image data is too large: {len(raw)} bytes, limit {max_bytes}")
    if not raw:
        raise ValueError("image data is empty")
    with warnings.catch_warnings():
        # We enforce our own pixel limit; PIL's bomb warning is noise here.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            img = Image.open(io.BytesIO(raw))
        except Exception as exc:  # UnidentifiedImageError, or a decoder's own error
            raise ValueError(f"image data is not a readable image ({mime}): {exc}") from exc
        w, h = img.size
        if w * h > max_pixels:
            raise ValueError(f"image is too large: {w}x{h} pixels, limit {max_pixels}")
    return img
