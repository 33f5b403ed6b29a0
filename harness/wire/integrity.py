"""``--verify``: a digest of what a request carries, checked after it crossed to the engine.

The frontend computes ``request_digest`` of a request's prompt token ids and
multimodal buffers before encoding it and sends it outside the codec under
test (a last frame, flagged in the envelope: every codec carries exactly its
usual frames). The engine computes it again on the decoded request and fails
the request with a clear error on a mismatch. A transport that hands one
request's buffer to another (the CUDA-IPC race SGLang once shipped) or tears a
frame is caught, not served.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

DIGEST_BYTES = 16


def _buffer(value: Any) -> memoryview:
    """The raw bytes of one multimodal value (a copy only for PIL, which exposes none)."""
    import torch
    from PIL import Image

    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        return memoryview(t.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
    if isinstance(value, np.ndarray):
        return memoryview(np.ascontiguousarray(value)).cast("B")  # type: ignore[arg-type]
    if isinstance(value, Image.Image):
        return memoryview(value.tobytes())
    raise TypeError(f"cannot digest a {type(value).__name__}")


def request_digest(request: Any) -> bytes:
    """blake2b-128 over the prompt token ids (int64) and every multimodal buffer, in order."""
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    h.update(np.asarray(request.prompt_token_ids, dtype=np.int64).tobytes())
    for item in request.mm_inputs or ():
        values = [item[k] for k in sorted(item)] if isinstance(item, dict) else [item]
        for value in values:
            buf = _buffer(value)
            h.update(len(buf).to_bytes(8, "little"))
            h.update(buf)
    return h.digest()
