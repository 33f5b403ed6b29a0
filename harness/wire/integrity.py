"""``--verify``: a digest of what a message carries, checked after it crossed to the other process.

Requests: the frontend computes ``request_digest`` of a request's prompt token
ids and multimodal buffers before encoding it and sends it outside the codec
under test (a last frame, flagged in the envelope: every codec carries exactly
its usual frames). The engine computes it again on the decoded request and
fails the request with a clear error on a mismatch. A transport that hands one
request's buffer to another (the CUDA-IPC race SGLang once shipped) or tears a
frame is caught, not served.

Outputs, once the engine has seen a verified request: each batch's last frame
(``outputs_check``) names its request ids and the digest of what they carry
(``outputs_digest``: ids, new tokens, finished flags, logprobs), computed
before encoding; the frontend recomputes it on the decoded batch and fails
those requests on a mismatch. An output buffer reused before ZeroMQ sent it
(vLLM #45730's bug class) is caught here.
"""

from __future__ import annotations

import hashlib
import json
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


def outputs_digest(batch: Any) -> bytes:
    """blake2b-128 over each output's request id, new token ids, finished flag and logprobs, in order."""
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for o in batch.outputs:
        rid = o.request_id.encode("utf-8", "surrogatepass")
        h.update(len(rid).to_bytes(4, "little") + rid + bytes((o.finished,)))
        h.update(np.asarray(o.new_token_ids, dtype=np.int64).tobytes())
        lp = o.new_logprobs
        if lp is not None:
            h.update(np.asarray(lp.ranks, dtype=np.int64).tobytes())
            for ids, values in zip(lp.token_ids, lp.logprobs, strict=True):
                h.update(np.asarray(ids, dtype=np.int64).tobytes() + np.asarray(values, dtype=np.float64).tobytes())
    return h.digest()


def outputs_check(batch: Any) -> bytes:
    """The batch's check frame: its request ids (whom to fail on a mismatch) and its digest."""
    return json.dumps([[o.request_id for o in batch.outputs], outputs_digest(batch).hex()]).encode()


def read_outputs_check(frame: bytes) -> tuple[list[str], bytes]:
    ids, digest = json.loads(frame)
    return [str(i) for i in ids], bytes.fromhex(digest)
