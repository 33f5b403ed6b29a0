"""A small vision encoder: one image -> exactly ``image_tokens`` embeddings.

Patch embedding (a strided conv) over a fixed-size image, one MLP block,
pooling of the patch sequence down to ``image_tokens`` rows and a projection to
the language model's width. Weights are random from a seed; what matters for
wirebench is that the engine really reads every pixel it was sent, so the
embeddings depend on the payload.

Accepted inputs (one multimodal item of ``EngineCoreRequest.mm_inputs``):
- a ``PIL.Image.Image`` (any mode; converted to RGB, resized to IMAGE_SIZE² by PIL, scaled to [-1, 1]);
- a dict with ``pixel_values``: torch tensor or numpy array, [1, 3, H, W] or
  [3, H, W], any float dtype (bfloat16 included) taken as already normalised,
  or uint8 taken as 0..255.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor, nn

IMAGE_SIZE = 224
PATCH = 16
_MAX_SIDE = 8192  # refuse absurd images before allocating for them


def _describe(item: Any) -> str:
    return type(item).__module__ + "." + type(item).__qualname__


def check_mm_input(item: Any) -> None:
    """Raise ValueError if ``item`` is not an input ``to_pixels`` accepts (shape/type only)."""
    if isinstance(item, Image.Image):
        w, h = item.size
        if not (0 < w <= _MAX_SIDE and 0 < h <= _MAX_SIDE):
            raise ValueError(f"image size {w}x{h} outside 1..{_MAX_SIDE}")
        return
    if isinstance(item, dict):
        if "pixel_values" not in item:
            raise ValueError(f"multimodal dict input needs a 'pixel_values' entry, got keys {sorted(map(str, item))}")
        pv = item["pixel_values"]
        if isinstance(pv, Tensor):
            shape, ok_dtype = tuple(pv.shape), (pv.is_floating_point() or pv.dtype == torch.uint8)
            dtype = str(pv.dtype)
        elif isinstance(pv, np.ndarray):
            shape, ok_dtype = pv.shape, (np.issubdtype(pv.dtype, np.floating) or pv.dtype == np.uint8)
            dtype = str(pv.dtype)
        else:
            raise ValueError(f"pixel_values must be a torch.Tensor or numpy.ndarray, got {_describe(pv)}")
        if not ok_dtype:
            raise ValueError(f"pixel_values dtype {dtype} not supported (float or uint8)")
        if len(shape) == 4 and shape[0] == 1:
            shape = shape[1:]
        if len(shape) != 3 or shape[0] != 3:
            raise ValueError(f"pixel_values shape {tuple(pv.shape)} is not [1,3,H,W] or [3,H,W]")
        if not (0 < shape[1] <= _MAX_SIDE and 0 < shape[2] <= _MAX_SIDE):
            raise ValueError(f"pixel_values spatial size {shape[1]}x{shape[2]} outside 1..{_MAX_SIDE}")
        return
    raise ValueError(f"multimodal input must be a PIL image or a dict with 'pixel_values', got {_describe(item)}")


@dataclass(frozen=True)
class RawPixels:
    """An input's pixels as they arrived, not yet converted (``to_float`` does that, on any device).

    ``data``: a CPU tensor, [H, W, 3] uint8 for a PIL image (channels last, as
    PIL stores them) or [3, H, W] as sent for pixel_values (uint8, or any float
    dtype, bfloat16 included). Moving this to the GPU moves 1 byte per uint8
    channel (2 for bf16), and the float conversion runs there.
    """

    data: Tensor
    kind: str  # "pil": uint8 0..255 -> [-1, 1]; "uint8": 0..255 -> [0, 1]; "float": as is

    def to_float(self, t: Tensor | None = None) -> Tensor:
        """float32 [3, H, W] from ``data`` (or from ``t``, the same data on another device)."""
        t = self.data if t is None else t
        if self.kind == "pil":
            return t.permute(2, 0, 1).float() / 127.5 - 1.0  # [0, 255] -> [-1, 1]
        if self.kind == "uint8":
            return t.float() / 255.0
        return t.float()


def raw_pixels(item: Any) -> RawPixels:
    """One input -> its pixels on the CPU, unconverted (one copy at most). Validates first."""
    check_mm_input(item)
    if isinstance(item, dict):
        pv = item["pixel_values"]
        if isinstance(pv, np.ndarray):
            # np.array copies: the codec's buffer may be read-only, which torch warns about.
            t = torch.from_numpy(np.array(pv))
        else:
            t = pv.detach().cpu()
        t = t.reshape(t.shape[-3:])
        return RawPixels(t, "uint8" if t.dtype == torch.uint8 else "float")
    rgb = item if item.mode == "RGB" else item.convert("RGB")
    # Resized by PIL first, as an image processor does: every pixel is read, but the tensor is the
    # model's size, not the image's (a 4096² image converted at full size cost the engine ~0.5 GB).
    if rgb.size != (IMAGE_SIZE, IMAGE_SIZE):
        rgb = rgb.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BILINEAR)
    return RawPixels(torch.from_numpy(np.array(rgb, dtype=np.uint8)), "pil")  # [S, S, 3], a fresh copy


def to_pixels(item: Any) -> Tensor:
    """One input -> float32 CPU tensor [3, H, W] (PIL images already at IMAGE_SIZE²). Validates first."""
    return raw_pixels(item).to_float()


class VisionEncoder(nn.Module):
    """[3, H, W] pixels -> [image_tokens, dim] embeddings."""

    def __init__(
        self, vision_dim: int, out_dim: int, image_tokens: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        super().__init__()
        if image_tokens < 1:
            raise ValueError(f"image_tokens must be >= 1, got {image_tokens}")
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.image_tokens = image_tokens
        n_patches = (IMAGE_SIZE // PATCH) ** 2
        self.patch = nn.Conv2d(3, vision_dim, kernel_size=PATCH, stride=PATCH, **factory)
        self.pos = nn.Parameter(torch.zeros(n_patches, vision_dim, **factory))
        self.norm = nn.LayerNorm(vision_dim, **factory)
        self.fc1 = nn.Linear(vision_dim, 4 * vision_dim, **factory)
        self.fc2 = nn.Linear(4 * vision_dim, vision_dim, **factory)
        self.proj = nn.Linear(vision_dim, out_dim, **factory)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        gen = torch.Generator(device=self.proj.weight.device).manual_seed(seed)
        for p in (self.patch.weight, self.pos, self.fc1.weight, self.fc2.weight):
            p.normal_(0.0, 0.02, generator=gen)
        # Patch conv sees 3*16*16 inputs; scale so patch features have ~unit std.
        self.patch.weight.normal_(0.0, (3 * PATCH * PATCH) ** -0.5, generator=gen)
        self.proj.weight.normal_(0.0, self.proj.in_features**-0.5, generator=gen)
        for b in (self.patch.bias, self.fc1.bias, self.fc2.bias, self.proj.bias):
            if b is not None:
                b.zero_()

    def forward(self, pixels: Tensor) -> Tensor:
        # pixels: [3, H, W] float32 on any device -> [image_tokens, out_dim]
        w = self.proj.weight
        x = pixels.to(device=w.device, dtype=torch.float32)[None]
        x = F.interpolate(x, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", align_corners=False)
        x = self.patch(x.to(w.dtype))  # [1, C, 14, 14]
        x = x.flatten(2).transpose(1, 2)[0] + self.pos  # [P=196, C]
        x = x + self.fc2(F.gelu(self.fc1(self.norm(x))))
        # Pool the patch sequence to exactly image_tokens rows: [P, C] -> [N, C]
        x = F.adaptive_avg_pool1d(x.T[None].float(), self.image_tokens)[0].T.to(w.dtype)
        x = self.proj(x).float()  # [N, out_dim]
        # Unit RMS per row, the scale of the token embeddings it stands in for.
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).to(w.dtype)

    def encode(self, item: Any, to_device: Callable[[Tensor], Tensor] | None = None) -> Tensor:
        """Embeddings of one input: its raw pixels go to the device (``to_device``, e.g. a pinned
        non-blocking copy) unconverted, and become float32 there."""
        raw = raw_pixels(item)
        data = to_device(raw.data) if to_device is not None else raw.data.to(self.proj.weight.device)
        return self(raw.to_float(data))


def build_vision_encoder(
    vision_dim: int, out_dim: int, image_tokens: int, device: torch.device, dtype: torch.dtype, seed: int
) -> VisionEncoder:
    enc = VisionEncoder(vision_dim, out_dim, image_tokens, device, dtype)
    enc.init_weights(seed)
    return enc.eval().requires_grad_(False)


def splice_images(x: Tensor, start: int, images: list[tuple[int, Tensor]]) -> None:
    """Overwrite, in place, the rows of a chunk that fall inside image placeholders.

    x: [T, dim] embeddings of positions [start, start+T); images: (placeholder
    offset, embeddings [N, dim]) pairs. A placeholder may span several chunks:
    each chunk takes the slice of the image's rows that lies inside it.
    """
    end = start + x.shape[0]
    for offset, emb in images:
        lo, hi = max(start, offset), min(end, offset + emb.shape[0])
        if lo < hi:
            x[lo - start : hi - start] = emb[lo - offset : hi - offset]
