"""Synthetic workload images and their data URLs, built before the clock starts.

The frontend's side (decoding what arrives) is ``harness.frontend.images``.
"""

from __future__ import annotations

import base64
import io
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from PIL import Image

# Formats we write, with the PIL format name and MIME type.
FORMATS: dict[str, tuple[str, str]] = {
    "png": ("PNG", "image/png"),
    "jpeg": ("JPEG", "image/jpeg"),
    "jpg": ("JPEG", "image/jpeg"),
}
JPEG_QUALITY = 90


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


@dataclass(frozen=True)
class ImageSpec:
    """Synthetic images attached to every request (the workload's --images-per-request and --image-*)."""

    per_request: int
    width: int
    height: int
    fmt: str


def make_image_urls(spec: ImageSpec | None, num_requests: int, seed: int) -> list[tuple[str, ...]]:
    """Per request, ``spec.per_request`` data URLs of distinct deterministic images."""
    if spec is None or spec.per_request == 0:
        return [() for _ in range(num_requests)]
    if spec.per_request < 0:
        raise ValueError(f"--images-per-request must be >= 0, got {spec.per_request}")
    if spec.width <= 0 or spec.height <= 0:
        raise ValueError(f"--image-width/--image-height must be positive, got {spec.width}x{spec.height}")
    if spec.fmt.lower() not in FORMATS:
        raise ValueError(f"--image-format must be png or jpeg, got {spec.fmt!r}")

    def one(job: tuple[int, int]) -> str:
        # Each image's seed depends on (seed, request, image) only, so the
        # result is the same whatever the thread scheduling.
        image_seed = int(np.random.SeedSequence([seed, *job]).generate_state(1)[0])
        return to_data_url(synthetic_image(spec.width, spec.height, image_seed), spec.fmt)

    jobs = [(i, j) for i in range(num_requests) for j in range(spec.per_request)]
    # numpy and zlib/libjpeg release the GIL, so threads do speed this up.
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        flat = list(pool.map(one, jobs))
    k = spec.per_request
    return [tuple(flat[i * k : (i + 1) * k]) for i in range(num_requests)]
