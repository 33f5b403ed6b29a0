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

The message is shm's (``ADD_SHM``): the engine views entries as it views arena blocks, with shm's
receiver, and its RELEASE unpins them.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.transports.base import (
    DEFAULT_THRESHOLD,
    FrameSender,
    SenderSettings,
    Transport,
    address_of,
    copy_frame,
)
from harness.transports.shm import ADD_SHM, HEADER, Arena, Handle, ShmError, ShmReceiver, remove_stale_segments

HASH_IN_THREAD_BYTES = 1 << 20  # hashing bigger frames leaves the event loop (hashlib releases the GIL)

KEY_BYTES = 16
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

    def close(self) -> None:
        self.arena.close()


# --- the sender -----------------------------------------------------------------------------------


def known_keys(request: Any) -> dict[int, tuple[int, bytes]]:
    """The store's keys of a request's pixel tensors, by their address: the image path hashed the decoded
    pixels already (``mm_hashes``), so a frame that is one of these tensors needs no hashing of its own."""
    out: dict[int, tuple[int, bytes]] = {}
    for item, mm_hash in zip(getattr(request, "mm_inputs", None) or [], getattr(request, "mm_hashes", None) or []):
        t: Any = item.get("pixel_values") if isinstance(item, dict) else None
        if mm_hash and hasattr(t, "data_ptr") and t.is_contiguous():
            out[t.data_ptr()] = (t.nbytes, pixels_key(mm_hash, tuple(t.shape), str(t.dtype)))
    return out


class StoreSender(FrameSender):
    """shm-store: big frames through the content-addressed store; a frame the store holds already is
    named, not copied. A pixel tensor's key comes from the request's image hashes (``known_keys``);
    other big frames are hashed here."""

    add_kind = ADD_SHM

    def __init__(self, store: MmStore, threshold: int = DEFAULT_THRESHOLD) -> None:
        self.store = store
        self.segment = store.name
        self.threshold = threshold
        self._fault_rewrite = os.environ.get("WIREBENCH_FAULT") == FAULT_REWRITE_PINNED
        self.copied_bytes = 0
        self.hashed_bytes = 0  # frames keyed by hashing them here (no key from the image path)

    @classmethod
    def from_settings(cls, settings: SenderSettings) -> StoreSender:
        return cls(MmStore(settings.store_bytes), settings.threshold)

    def context(self, request: Any) -> dict[int, tuple[int, bytes]]:
        return known_keys(request) if request is not None else {}

    async def place(self, view: memoryview, held: list[Any], context: Any) -> list[Any] | None:
        store = self.store
        hint = context.get(address_of(view)) if context else None
        if hint is not None and hint[0] == view.nbytes:
            key = hint[1]
        elif view.nbytes >= HASH_IN_THREAD_BYTES:
            key = await asyncio.to_thread(content_key, view)
            self.hashed_bytes += view.nbytes
        else:
            key = content_key(view)
            self.hashed_bytes += view.nbytes
        entry = store.lookup(key)
        if entry is not None:
            held.append((entry.block, entry.generation))
            await entry.ready.wait()  # another request may still be copying it in
        else:
            made = store.insert(key, view.nbytes)
            if made is None:  # only pinned entries left: the frame travels in the message
                return None
            entry, dst = made
            held.append((entry.block, entry.generation))
            try:
                await copy_frame(dst, view)
            except BaseException:
                entry.ready.set()  # waiters go on; the discarded entry's handle fails its generation check
                store.discard(key)
                raise
            entry.ready.set()
            self.copied_bytes += view.nbytes
        if self._fault_rewrite:  # the fault: the pinned entry's slot handed to another frame
            np.frombuffer(store.view(entry), dtype=np.uint8)[:] = 0x3C
        return store.handle(entry).to_list()

    def released(self, entries: Sequence[Sequence[Any]]) -> None:
        for segment, block, generation in entries:
            if segment == self.store.name:
                self.store.unpin(int(block), int(generation))

    def unsent(self, held: Sequence[Any]) -> None:
        for block, generation in held:
            self.store.unpin(block, generation)

    def counts(self) -> dict[str, int]:
        return dict(self.store.counts)

    def forget(self) -> None:
        self.store.clear()

    def close(self) -> None:
        self.store.close()


class ShmStoreTransport(Transport):
    name = "shm-store"
    add_kind = ADD_SHM
    variants = ("store-miss",)
    summary = "through a content-addressed store of --mm-store-bytes, a frame it holds is named, not copied"

    sender_class = StoreSender
    receiver_class = ShmReceiver

    def remove_stale(self) -> list[str]:
        return remove_stale_segments()
