"""Turn a chat request's image data URLs into the engine's multimodal inputs.

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

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from PIL import Image

MmPayload = Literal["pil", "tensor"]
MM_PAYLOADS: tuple[str, ...] = ("pil", "tensor")

# CLIP ViT-L/14-336's normalisation (LLaVA-1.5's vision tower).
CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)

TENSOR_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")


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


def pixel_values(image: Image.Image, size: int, dtype: str = "float16") -> Any:
    """Resize to size×size, scale to [0, 1], normalise; a torch tensor [1, 3, size, size]."""
    import torch

    rgb = image.convert("RGB").resize((size, size), Image.Resampling.BICUBIC)
    arr = np.asarray(rgb, dtype=np.float32) / 255.0  # [S, S, 3]
    arr = (arr - CLIP_MEAN) / CLIP_STD
    chw = np.ascontiguousarray(arr.transpose(2, 0, 1))  # [3, S, S]
    return torch.from_numpy(chw).unsqueeze(0).to(torch_dtype(dtype)).contiguous()


def to_mm_input(image: Image.Image, payload: MmPayload, size: int, dtype: str) -> Any:
    """The engine-bound form of one decoded image."""
    if payload == "pil":
        return image
    if payload == "tensor":
        return {"pixel_values": pixel_values(image, size, dtype)}
    raise ValueError(f"unknown mm payload {payload!r}; choose one of {', '.join(MM_PAYLOADS)}")


def process_image_url(url: str, *, max_bytes: int, payload: MmPayload, size: int, dtype: str) -> ProcessedImage:
    """Decode one data URL and convert it; ValueError with a clear message on bad input."""
    from .images import decode_data_url

    # A plain RGB image, as vLLM's image loader hands on: one mode for every
    # codec to carry, and no file object or PNG metadata riding along.
    image = decode_data_url(url, max_bytes).convert("RGB")
    return ProcessedImage(to_mm_input(image, payload, size, dtype), image_hash(image))
