"""Synthetic workload images and data-URL encoding/decoding.

The load generator attaches deterministic synthetic images to prompts (built
and encoded before the clock starts); the frontend turns the data URLs it
receives back into images with ``decode_data_url``, which refuses malformed,
undecodable or oversized input with a ``ValueError`` saying what was wrong.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings

import numpy as np
from PIL import Image

# Formats we write, with the PIL format name and MIME type.
FORMATS: dict[str, tuple[str, str]] = {
    "png": ("PNG", "image/png"),
    "jpeg": ("JPEG", "image/jpeg"),
    "jpg": ("JPEG", "image/jpeg"),
}
JPEG_QUALITY = 90
DEFAULT_MAX_IMAGE_BYTES = 20 * 1024 * 1024
DEFAULT_MAX_PIXELS = 4096 * 4096
_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^,;]*)*),", re.ASCII)


def synthetic_image(width: int, height: int, seed: int) -> Image.Image:
    """An RGB image: seeded colour gradients with a few blobs and pixel noise.

    Gradients and blobs give JPEG something photo-like to compress; the noise
    keeps PNG sizes realistic (a pure gradient would compress to almost
    nothing). Different seeds give different pixels and therefore different
    encoded sizes, so no two requests carry identical payloads.
    """
    if width <= 0 or height <= 0:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    rng = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :]
    channels = []
    for _ in range(3):
        fx, fy, phase = rng.uniform(0.5, 3.0), rng.uniform(0.5, 3.0), rng.uniform(0, 2 * np.pi)
        channels.append(0.5 + 0.5 * np.sin(2 * np.pi * (fx * x + fy * y) + phase))
    img = np.stack(channels, axis=-1)  # (h, w, 3) in [0, 1]
    for _ in range(int(rng.integers(2, 6))):
        cx, cy = rng.uniform(0, 1, size=2)
        radius = rng.uniform(0.05, 0.3)
        blob = np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * radius**2))[..., None]
        img = img * (1 - blob) + blob * rng.uniform(0, 1, size=3).astype(np.float32)
    pixels = img * 255.0 + rng.normal(0.0, 5.0, size=img.shape).astype(np.float32)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), mode="RGB")


def to_data_url(img: Image.Image, fmt: str = "png") -> str:
    """Encode ``img`` as ``data:image/<fmt>;base64,...`` (fmt: png or jpeg)."""
    key = fmt.lower()
    if key not in FORMATS:
        raise ValueError(f"unsupported image format {fmt!r}; choose png or jpeg")
    pil_format, mime = FORMATS[key]
    buf = io.BytesIO()
    if pil_format == "JPEG":
        img.convert("RGB").save(buf, format="JPEG", quality=JPEG_QUALITY)
    else:
        img.save(buf, format="PNG")
    return f"data:{mime};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"


def decode_data_url(
    url: str,
    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> Image.Image:
    """Decode a base64 image data URL into a loaded PIL image.

    Raises ValueError when the URL is not a base64 ``data:image/...`` URL, the
    payload is larger than ``max_bytes`` decoded bytes (checked before
    decoding), the bytes are not an image PIL can read, or the image has more
    than ``max_pixels`` pixels (checked before pixels are decoded).
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
    payload = url[match.end():]
    # 4 base64 chars carry 3 bytes: refuse oversized input before decoding it.
    if len(payload) // 4 * 3 > max_bytes + 3:
        raise ValueError(
            f"image data is too large: about {len(payload) // 4 * 3} bytes, limit {max_bytes}"
        )
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
        try:
            img.load()
        except Exception as exc:  # truncated or corrupt pixel data
            raise ValueError(f"image data could not be decoded ({mime}): {exc}") from exc
    return img
