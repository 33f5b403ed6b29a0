"""Count the torch ops one engine step dispatches, and those that make the host wait.

A GPU runs ahead of the Python that feeds it only while nothing asks for a
device value on the host. These ops do (on CUDA; on the CPU they are
ordinary, so the count is the same on either device and a CPU test can
check it):

- ``aten::_local_scalar_dense``: ``.item()``, ``int(t)``, ``bool(t)``, ``float(t)``;
- ops whose output size depends on the data: ``nonzero``, ``masked_select``,
  ``unique``, ``repeat_interleave`` without ``output_size``, ``bincount``;
- ``aten::is_nonzero`` and ``aten::equal`` (a Python truth value);
- ``aten::lift_fresh``: a tensor made from Python data (``torch.tensor(list)``),
  which on CUDA is followed by a blocking copy from pageable memory. A setitem
  of a Python scalar (``t[i] = 0``) lifts one too, harmlessly (it is filled on
  the device); the engine uses ``fill_``/``index_fill_`` so that a clean count is zero;
- a copy between devices that is not ``non_blocking`` from pinned memory
  (never seen on the CPU, where every tensor is on one device).

``.tolist()`` of a CPU tensor dispatches nothing; the copy to the host before
it does. Use it as a context manager::

    with OpCounter() as ops:
        executor.execute(scheduled)
    ops.total, ops.syncs  # Counter of op names
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = frozenset(
    {
        "aten::_local_scalar_dense",
        "aten::item",
        "aten::is_nonzero",
        "aten::equal",
        "aten::nonzero",
        "aten::masked_select",
        "aten::_unique",
        "aten::_unique2",
        "aten::unique_dim",
        "aten::unique_consecutive",
        "aten::unique_dim_consecutive",
        "aten::bincount",
        "aten::lift_fresh",
    }
)
_COPIES = frozenset({"aten::copy_", "aten::_to_copy", "aten::to"})


def _is_blocking_transfer(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """A copy between devices that makes the host wait (anything but non_blocking from pinned memory)."""
    if name not in _COPIES:
        return False
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if name == "aten::copy_":
        if len(tensors) < 2 or tensors[0].device == tensors[1].device:
            return False
        dst, src = tensors[0], tensors[1]
        non_blocking = bool(kwargs.get("non_blocking", args[2] if len(args) > 2 else False))
        return not (non_blocking and src.device.type == "cpu" and src.is_pinned() and dst.device.type != "cpu")
    device = kwargs.get("device")
    if not tensors or device is None or torch.device(device) == tensors[0].device:
        return False
    src = tensors[0]
    return not (bool(kwargs.get("non_blocking")) and src.device.type == "cpu" and src.is_pinned())


def _repeats_from_tensor(func: Any, kwargs: dict[str, Any]) -> bool:
    """repeat_interleave with a tensor of repeats and no output_size reads the repeats on the host."""
    return func._overloadname in ("Tensor", "self_Tensor") and kwargs.get("output_size") is None


class OpCounter(TorchDispatchMode):
    """Counts every dispatched aten op (``total``) and the synchronizing ones (``syncs``)."""

    def __init__(self) -> None:
        super().__init__()
        self.total: Counter[str] = Counter()
        self.syncs: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = func._schema.name
        self.total[name] += 1
        if name in SYNC_OPS or name == "aten::repeat_interleave" and _repeats_from_tensor(func, kwargs):
            self.syncs[name] += 1
        elif _is_blocking_transfer(name, args, kwargs):
            self.syncs[f"{name} (blocking transfer)"] += 1
        return func(*args, **kwargs)

    @property
    def num_ops(self) -> int:
        return sum(self.total.values())

    @property
    def num_syncs(self) -> int:
        return sum(self.syncs.values())
