"""``shm-store``: a bounded shared-memory object store of big frames, addressed by their content.

One segment of ``--mm-store-bytes`` (an ``Arena``: first-fit blocks, each with a generation header,
in ``/dev/shm/wirebench-<pid>-<hex>``, mode 0600) holds frames keyed by a content hash. The frontend
keeps the index; a frame already held (the same image again) is not copied again, only named: the
message carries where it lies. The engine views it in place, as over ``shm``.

Keys: a pixel tensor's comes from the request's ``mm_hashes`` (the SHA-256 of the decoded image, which
the image path computes for every image anyway) with the tensor's shape and dtype (``pixels_key``), so
a hit costs no hashing; any other big frame's is the SHA-256 of its bytes (``content_key``): faster
than blake2b where the CPU has SHA extensions, and still as costly as a copy, since an exact key
reads every byte.

Bound and eviction: a frame that does not fit evicts least-recently-used entries that no request in
flight points at (an entry is pinned from the moment a message names it until the engine's RELEASE
says its view died). When only pinned entries are left, the frame travels in the message instead
(a *fallback*), counted. Hits, misses, evictions and fallbacks are counted for ``/metrics``.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

from harness.wire.shm import HEADER, Arena, Handle, ShmError

KEY_BYTES = 16
DEFAULT_STORE_BYTES = 256 << 20
# Tests only: the store rewrites an entry's bytes after a message named it, as if it had evicted the entry
# while pinned and handed its slot to another frame. Never set in normal use.
FAULT_REWRITE_PINNED = "store-rewrite-pinned"
EVENTS = ("hit", "miss", "eviction", "fallback")


def content_key(view: memoryview) -> bytes:
    """A frame's key from its bytes (hashlib releases the GIL: big frames are keyed off the event loop)."""
    return hashlib.sha256(view).digest()[:KEY_BYTES]


def pixels_key(mm_hash: str, shape: tuple[int, ...], dtype: str) -> bytes:
    """The store's key of a pixel tensor from the hash the image path computed anyway (``mm_hashes``: SHA-256
    of the decoded image), with the tensor's shape and dtype: the same picture processed alike."""
    return hashlib.sha256(f"pixels:{mm_hash}:{shape}:{dtype}".encode()).digest()[:KEY_BYTES]


@dataclass
class Entry:
    block: int
    generation: int
    length: int
    pins: int = 0
    # Set once the bytes are in: a hit on an entry still being copied waits for it.
    ready: asyncio.Event = field(default_factory=asyncio.Event)


class MmStore:
    """The frontend's index over one arena; used from the event loop only (copies may run in threads, on
    entries already pinned)."""

    def __init__(self, capacity_bytes: int) -> None:
        self.arena = Arena(capacity_bytes)
        self._entries: OrderedDict[bytes, Entry] = OrderedDict()  # least recently used first
        self._by_block: dict[tuple[int, int], bytes] = {}  # (block, generation) → key
        self.counts: dict[str, int] = dict.fromkeys(EVENTS, 0)

    @property
    def name(self) -> str:
        return self.arena.name

    def lookup(self, key: bytes) -> Entry | None:
        """A held entry, pinned for the message about to name it (a hit), or None (a miss)."""
        entry = self._entries.get(key)
        if entry is None:
            self.counts["miss"] += 1
            return None
        self._entries.move_to_end(key)
        entry.pins += 1
        self.counts["hit"] += 1
        return entry

    def insert(self, key: bytes, length: int) -> tuple[Entry, memoryview] | None:
        """A new pinned entry and the view to copy its bytes into; None when no room can be made (a fallback)."""
        while True:
            try:
                ((block, generation, dst),) = self.arena.alloc_many([length])
                break
            except ShmError:
                if not self._evict_one():
                    self.counts["fallback"] += 1
                    return None
        entry = self._entries[key] = Entry(block, generation, length, pins=1)
        self._by_block[(block, generation)] = key
        return entry, dst

    def _evict_one(self) -> bool:
        for key, entry in self._entries.items():
            if entry.pins == 0 and entry.ready.is_set():
                self._drop(key, entry)
                self.counts["eviction"] += 1
                return True
        return False

    def _drop(self, key: bytes, entry: Entry) -> None:
        del self._entries[key]
        self._by_block.pop((entry.block, entry.generation), None)
        self.arena.free(entry.block, entry.generation)

    def discard(self, key: bytes) -> None:
        """Forget an entry whose copy failed (its bytes are not what the key says)."""
        entry = self._entries.get(key)
        if entry is not None:
            self._drop(key, entry)

    def clear(self) -> None:
        """Forget every entry no message points at (bench micro's misses: the same frame, never held)."""
        for key, entry in list(self._entries.items()):
            if entry.pins == 0:
                self._drop(key, entry)

    def unpin(self, block: int, generation: int) -> None:
        """A message that named the entry is done with it (the engine's view died, or it was never sent)."""
        key = self._by_block.get((block, generation))
        entry = self._entries.get(key) if key is not None else None
        if entry is not None and entry.pins > 0:
            entry.pins -= 1

    def handle(self, entry: Entry) -> Handle:
        return Handle(self.arena.name, entry.block, entry.length, entry.generation)

    def view(self, entry: Entry) -> memoryview:
        """The entry's bytes in the arena (tests and the fault hook write through it)."""
        start = entry.block + HEADER
        return memoryview(self.arena._mm)[start : start + entry.length]

    @property
    def held_bytes(self) -> int:
        return self.arena.used_bytes

    def close(self) -> None:
        self.arena.close()
