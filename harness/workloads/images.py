"""Synthetic workload images and their data URLs, built before the clock starts.

The frontend's side (decoding what arrives) is ``harness.frontend.images``.
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from PIL import Image

from harness.workloads.progress import bar

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
    reuse: float = 0.0  # --image-reuse


Size = tuple[int, int]  # (width, height) in pixels

# The reuse draws' own stream, apart from the images' seeds (which are (seed, request, slot)).
_REUSE_STREAM = 0x5E5E


def check_reuse(reuse: float) -> None:
    if not 0.0 <= reuse <= 1.0:
        raise ValueError(f"--image-reuse must be in [0, 1], got {reuse}")


def plan_reuse(sizes: Sequence[Sequence[Size]], reuse: float, seed: int) -> list[list[int]]:
    """Which image fills each slot: per request, per slot, the index of the slot (counted over all
    requests, in order) whose new image it carries; a slot that carries its own index is a new image.

    A slot repeats, with probability ``reuse``, an image of an earlier request of the same size,
    drawn uniformly from those not already in its own request; when there is none it is new. So the
    share of slots that repeat an earlier image is ``reuse`` less the slots that found no candidate
    (those of the first request of each size), which vanish as the requests grow in number.
    """
    check_reuse(reuse)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_REUSE_STREAM,)))
    sent: dict[Size, list[int]] = {}  # distinct images of earlier requests, by size
    plan: list[list[int]] = []
    slot = 0
    for request in sizes:
        chosen: list[int] = []
        for size in request:
            draw = rng.random()  # drawn for every slot, so one slot's outcome never shifts another's
            candidates = [i for i in sent.get(size, ()) if i not in chosen] if draw < reuse else []
            chosen.append(candidates[int(rng.integers(len(candidates)))] if candidates else slot)
            slot += 1
        plan.append(chosen)
        first = slot - len(request)
        for size, image in zip(request, chosen):
            if image >= first:  # new in this request
                sent.setdefault(size, []).append(image)
    return plan


def check_format(fmt: str) -> None:
    if fmt.lower() not in FORMATS:
        raise ValueError(f"--image-format must be png or jpeg, got {fmt!r}")


def draw_image_urls(sizes: Sequence[Sequence[Size]], fmt: str, seed: int, reuse: float = 0.0) -> list[tuple[str, ...]]:
    """Per request, a data URL for each of its slots' sizes: a new deterministic image, or (with
    probability ``reuse``, see ``plan_reuse``) the very bytes of an image an earlier request carried."""
    check_format(fmt)
    for request in sizes:
        for width, height in request:
            if width <= 0 or height <= 0:
                raise ValueError(f"image size must be positive, got {width}x{height}")
    plan = plan_reuse(sizes, reuse, seed)
    jobs: list[tuple[int, int, int, int, int]] = []  # (slot, request, image, width, height) of new images
    slot = 0
    for i, (request, chosen) in enumerate(zip(sizes, plan)):
        for j, ((width, height), image) in enumerate(zip(request, chosen)):
            if image == slot:
                jobs.append((slot, i, j, width, height))
            slot += 1

    def one(job: tuple[int, int, int, int, int]) -> str:
        # Each image's seed depends on (seed, request, image) only, so the
        # result is the same whatever the thread scheduling.
        _, i, j, width, height = job
        image_seed = int(np.random.SeedSequence([seed, i, j]).generate_state(1)[0])
        return to_data_url(synthetic_image(width, height, image_seed), fmt)

    # numpy and zlib/libjpeg release the GIL, so threads do speed this up. Ctrl-C (SIGTERM) reaches this
    # thread while it waits for an image: the pool then drops the images not started and waits only
    # for the few being encoded.
    pool = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1))
    made: dict[int, str] = {}
    try:
        with bar(len(jobs), "drawing images", "image") as shown:
            for job, url in zip(jobs, pool.map(one, jobs)):
                made[job[0]] = url
                shown.update(1)
    finally:
        pool.shutdown(cancel_futures=True)
    return [tuple(made[image] for image in chosen) for chosen in plan]


def make_image_urls(spec: ImageSpec | None, num_requests: int, seed: int) -> list[tuple[str, ...]]:
    """Per request, ``spec.per_request`` data URLs of deterministic images, distinct within a request
    (and across requests when ``spec.reuse`` is 0)."""
    if spec is None or spec.per_request == 0:
        return [() for _ in range(num_requests)]
    if spec.per_request < 0:
        raise ValueError(f"--images-per-request must be >= 0, got {spec.per_request}")
    if spec.width <= 0 or spec.height <= 0:
        raise ValueError(f"--image-width/--image-height must be positive, got {spec.width}x{spec.height}")
    check_format(spec.fmt)
    sizes = [[(spec.width, spec.height)] * spec.per_request for _ in range(num_requests)]
    return draw_image_urls(sizes, spec.fmt, seed, spec.reuse)
