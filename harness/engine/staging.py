"""Python lists to device tensors, and sampled ids back, without hidden host syncs.

``torch.tensor(list, device="cuda")`` copies from pageable memory and waits for
the copy: the host stalls behind every kernel queued before it, once per call.
Here all of a step's small integer inputs (token ids, positions, slots, ...)
are written into ONE pinned host buffer and cross with ONE ``non_blocking``
copy; the caching host allocator keeps the pinned block alive until the copy
is done, so nothing is overwritten early. On the CPU the buffer is the tensor
(no copy at all). Either way no ``torch.tensor`` of Python data is built, so
no op that makes the host wait is dispatched (``harness.engine.opcount``).

``StepBuffers`` does the same into buffers made once and reused every step (the engine's
step inputs); ``fetch`` is the one intended sync of a step: the sampled ids to the host.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor


def step_token_ids(
    decode_ids: Sequence[int], prefill_chunks: Sequence[Sequence[int] | np.ndarray]
) -> Sequence[int] | np.ndarray:
    """A step's token per row for ``Stager.ints``: each decode row's newest token, then each prefill chunk.

    A chunk of a packed prompt (a slice of the decoded int32 array, a view) is cast into place
    by numpy in one C loop, without a Python int per token; a list chunk is converted item by
    item, as any list is. Several rows become one int64 array, each chunk written once; a step of
    one source (decodes alone, the commonest step, or one prefill chunk) is handed on as it is,
    for the stager to cast into its buffer (one copy, not two).
    """
    if not prefill_chunks:
        return decode_ids
    if not decode_ids and len(prefill_chunks) == 1:
        return prefill_chunks[0]
    at = len(decode_ids)
    out = np.empty(at + sum(len(c) for c in prefill_chunks), dtype=np.int64)
    out[:at] = decode_ids
    for chunk in prefill_chunks:
        out[at : at + len(chunk)] = chunk
        at += len(chunk)
    return out


def _pack(view: np.ndarray, lists: Sequence[Sequence[int] | Sequence[float] | np.ndarray], sizes: list[int]) -> None:
    """The lists one after another into the flat host ``view`` (numpy writes: no torch op)."""
    at = 0
    for values, n in zip(lists, sizes, strict=True):
        view[at : at + n] = values
        at += n


class Stager:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pinned = device.type == "cuda"
        self.fetches = 0  # device-to-host reads of results, for tests and profiles

    def _stage(self, lists: Sequence[Sequence[int] | Sequence[float] | np.ndarray], dtype: torch.dtype) -> list[Tensor]:
        sizes = [len(x) for x in lists]
        host = torch.empty(sum(sizes), dtype=dtype, pin_memory=self.pinned)
        view = host.numpy()  # writes through numpy dispatch no torch op
        _pack(view, lists, sizes)
        flat = host.to(self.device, non_blocking=True) if self.pinned else host
        return list(flat.split(sizes)) if len(sizes) > 1 else [flat]

    def ints(self, *lists: Sequence[int] | np.ndarray) -> list[Tensor]:
        """Each list as an int64 tensor on the device, all in one transfer."""
        return self._stage(lists, torch.int64)

    def floats(self, *lists: Sequence[float] | np.ndarray) -> list[Tensor]:
        """Each list as a float32 tensor on the device, all in one transfer."""
        return self._stage(lists, torch.float32)

    def tensor(self, t: Tensor) -> Tensor:
        """A host tensor on the device: copied into pinned memory, then sent without waiting.

        On the CPU, ``t`` itself. The dtype is kept: send uint8 or bfloat16 pixels
        and convert on the device, where it is cheap.
        """
        if not self.pinned or t.device.type != "cpu":
            return t.to(self.device)
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t)
        return host.to(self.device, non_blocking=True)

    def fetch(self, t: Tensor) -> list[int]:
        """The step's sampled ids on the host: one copy, the one sync the step needs."""
        self.fetches += 1
        return t.to("cpu").tolist()

    def fetch_array(self, t: Tensor) -> np.ndarray:
        """``fetch`` as a numpy array: the step's outputs stay one array until they are handed out."""
        self.fetches += 1
        return t.to("cpu").numpy()


class StepBuffers:
    """Preallocated buffers a step's int inputs cross in: a host one (pinned on CUDA) and a device one.

    ``ints`` writes every list into the host buffer and sends them in one non-blocking copy into
    the device buffer; the tensors it returns are views of that, valid until the next call. Nothing
    is allocated per step. Before the host buffer is rewritten, the previous copy out of it must
    have finished: an event recorded after the copy is waited for (a step ends with a sync, so it
    has long finished). On the CPU the host buffer is the device one: no copy at all.
    """

    def __init__(self, device: torch.device, capacity: int = 1 << 14) -> None:
        self.device = device
        self.pinned = device.type == "cuda"
        self._copied: torch.cuda.Event | None = None
        self._alloc(capacity)

    def _alloc(self, n: int) -> None:
        self.host = torch.empty(n, dtype=torch.int64, pin_memory=self.pinned)
        self._view = self.host.numpy()  # writes through numpy dispatch no torch op
        self.dev = torch.empty(n, dtype=torch.int64, device=self.device) if self.pinned else self.host
        self.capacity = n

    def ints(self, *lists: Sequence[int] | np.ndarray) -> list[Tensor]:
        """Each list as an int64 tensor on the device (views of the device buffer), in one transfer."""
        sizes = [len(x) for x in lists]
        total = sum(sizes)
        if self._copied is not None:
            self._copied.synchronize()
        if total > self.capacity:  # grow once to the largest step seen (the old buffers are free)
            self._alloc(max(total, 2 * self.capacity))
        _pack(self._view, lists, sizes)
        flat = self.dev[:total]
        if self.pinned:
            flat.copy_(self.host[:total], non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record()
        return list(flat.split(sizes))
