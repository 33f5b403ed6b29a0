"""``cuda-ipc``: big frames handed over as CUDA tensors through torch.multiprocessing's CUDA IPC reduction.

The sender copies a frame into a CUDA tensor and pickles torch's reduction of it (a cudaIpcMemHandle,
offsets and a reference-count file); the receiver rebuilds the tensor from it, on the same device.
Lifetime: the sender holds the tensor until the receiver reports it taken; torch's own reference
counting keeps the memory until the receiver's tensor is gone too. Refused where there is no CUDA
device (harness.wire.policy). The engine copies the bytes back to host memory for the codec: this
transport shows what handing over GPU memory costs, the model here runs on the CPU anyway.
"""

from __future__ import annotations

import io
import pickle
from typing import Any


def share_cuda(view: memoryview) -> tuple[Any, bytes]:
    """A CUDA copy of ``view``'s bytes and the pickled IPC handle of it."""
    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    tensor = torch.frombuffer(view, dtype=torch.uint8).to("cuda")
    torch.cuda.current_stream().synchronize()  # the receiver reads it on another stream
    buf = io.BytesIO()
    pickle.Pickler(buf).dump(reduce_tensor(tensor))
    return tensor, buf.getvalue()


def open_cuda_handle(raw: bytes) -> memoryview:
    """The bytes of a CUDA tensor another process shared, copied to host memory."""
    rebuild, args = pickle.loads(raw)  # our frontend's, over the private ipc link (harness.wire.policy)
    tensor = rebuild(*args)
    return memoryview(tensor.cpu().numpy())
