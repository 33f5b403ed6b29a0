"""The shm-store transport: its index (content keys, LRU eviction of unpinned entries, fallback when all
are pinned) and its sender's messages."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from harness.transports.shm import ADD_SHM, SHM_DIR
from harness.transports.shm_store import Entry, MmStore, StoreSender, content_key
from harness.wire import zmq_link

FRAME = 20_000  # three fit a 64 KB store (each block has a header and is aligned)


@pytest.fixture
def store():
    s = MmStore(64_000)
    yield s
    s.close()
    assert not (SHM_DIR / s.name).exists()


def frame(seed: int) -> memoryview:
    return memoryview(np.random.default_rng(seed).integers(0, 255, FRAME, dtype=np.uint8).tobytes())


def put(store: MmStore, seed: int) -> tuple[bytes, Entry]:
    key = content_key(frame(seed))
    made = store.insert(key, FRAME)
    assert made is not None
    entry, dst = made
    dst[:] = frame(seed)
    entry.ready.set()
    return key, entry


def test_equal_bytes_hit_and_other_bytes_miss(store):
    assert content_key(frame(1)) == content_key(memoryview(bytes(frame(1))))
    key, entry = put(store, 1)
    assert store.lookup(key) is entry and store.lookup(content_key(frame(2))) is None
    assert store.counts == {"hit": 1, "miss": 1, "eviction": 0, "fallback": 0}


def test_a_full_store_evicts_the_least_recently_used_unpinned_entry(store):
    entries = [put(store, i) for i in range(3)]
    for _, entry in entries:
        store.unpin(entry.block, entry.generation)
    assert store.lookup(entries[0][0]) is not None  # 0 is now the most recently used (and pinned)
    put(store, 3)
    assert store.counts["eviction"] == 1
    assert store.lookup(entries[1][0]) is None  # 1 was the least recently used
    assert store.lookup(entries[0][0]) is not None and store.lookup(entries[2][0]) is not None


def test_when_every_entry_is_pinned_a_frame_falls_back_to_the_message(store):
    for i in range(3):
        put(store, i)  # pinned: a request in flight points at each
    assert store.insert(content_key(frame(9)), FRAME) is None
    assert store.counts["fallback"] == 1 and store.counts["eviction"] == 0


def test_the_sender_names_a_held_frame_and_sends_what_does_not_fit(store):
    sender = StoreSender(store, threshold=1024)

    async def send(seed: int) -> list:
        message, _ = await sender.message("r", [b"body", frame(seed)])
        return message

    first = asyncio.run(send(1))
    assert first[0][0] == ADD_SHM and first[-1] == b""
    again = asyncio.run(send(1))
    assert again[1] == first[1] and sender.copied_bytes == FRAME  # the same entry, copied once
    asyncio.run(send(2))
    asyncio.run(send(3))  # three pinned entries fill the store
    full = asyncio.run(send(4))
    assert full[0][0] == zmq_link.ADD and bytes(full[-1]) == bytes(frame(4))  # the fallback: in the message
    assert store.counts == {"hit": 1, "miss": 4, "eviction": 0, "fallback": 1}


def test_a_pixel_tensor_is_keyed_by_the_image_paths_hash_not_hashed_again(store):
    import torch

    from harness.micro import payloads
    from harness.wire.messages import EngineCoreRequest

    def request(seed: int, mm_hash: str) -> EngineCoreRequest:
        req = payloads.text_request()
        req.mm_inputs = [{"pixel_values": torch.from_numpy(np.frombuffer(frame(seed), dtype=np.uint8).copy())}]
        req.mm_hashes = [mm_hash]
        return req

    sender = StoreSender(store, threshold=1024)

    async def send(req: EngineCoreRequest) -> list:
        message, _ = await sender.message("r", [b"body", req.mm_inputs[0]["pixel_values"].numpy()], req)
        return message

    first = asyncio.run(send(request(1, "aa")))
    again = asyncio.run(send(request(1, "aa")))  # a new tensor of the same picture: a hit by its hash
    other = asyncio.run(send(request(2, "bb")))
    assert again[1] == first[1] and other[1] != first[1]
    assert sender.hashed_bytes == 0 and store.counts["hit"] == 1 and store.counts["miss"] == 2
