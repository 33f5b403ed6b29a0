"""What the torch-shm and cuda-ipc senders share: each big frame's buffer kept until the engine takes it.

Both hand the engine a handle to memory only the sender's reference keeps alive (a torch shared
storage, a CUDA tensor). The engine reports each handle taken (a RELEASE entry in segment
``torch_shm.TAKEN``, with the handle's fd, or 0, and its serial) once it holds its own reference;
only then may the sender drop its own (harness.wire.torch_shm has the lifetime rules).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from harness.wire import torch_shm


class HeldUntilTaken:
    """The buffers a sender holds for the engine, by the (fd or 0, serial) its TAKEN entry names."""

    def __init__(self) -> None:
        self._serial = 0  # numbers every handed-over buffer: a TAKEN entry names it by its serial
        self._held: dict[Hashable, Any] = {}

    def _next_serial(self) -> int:
        self._serial += 1
        return self._serial

    def _hold(self, key: Hashable, buffer: Any, held: list[Any]) -> None:
        """Keep ``buffer`` until it is taken; ``held``: the request's keys, for ``unsent``."""
        self._held[key] = buffer
        held.append(key)

    def released(self, entries: Sequence[Sequence[Any]]) -> None:
        """The engine's RELEASE entries: [segment, fd, serial] each; TAKEN ones free their buffer."""
        for segment, fd, serial in entries:
            if segment == torch_shm.TAKEN:
                self._held.pop((int(fd), int(serial)), None)

    def unsent(self, held: Sequence[Any]) -> None:
        for key in held:
            self._held.pop(key, None)

    @property
    def held_count(self) -> int:
        return len(self._held)

    def close(self) -> None:
        self._held.clear()
