"""The shm transport: its arena (allocation, reuse after release, generations, views that release
themselves), and bench micro's delivery over it and its variants."""

from __future__ import annotations

import gc
import os
import stat
import subprocess
import sys
import time
from typing import Any

import pytest
import torch

from harness.micro import delivery
from harness.micro.payloads import PAYLOADS
from harness.transports import base, shm
from harness.transports.shm import HEADER, Arena, Handle, Mappings, ShmError


@pytest.fixture
def arena():
    a = Arena(1 << 20)
    yield a
    a.close()


def test_the_segment_is_owner_only_and_gone_after_close():
    a = Arena(4096)
    path = shm.SHM_DIR / a.name
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and a.name.startswith(f"wirebench-{os.getpid()}-")
    a.close()
    assert not path.exists()


def test_blocks_are_reused_and_free_space_merges(arena):
    blocks = [arena.alloc(200_000)[:2] for _ in range(5)]
    with pytest.raises(ShmError, match="arena is full"):
        arena.alloc(200_000)
    for block, gen in blocks[1:4]:  # free three neighbours in the middle
        arena.free(block, gen)
    big, gen, view = arena.alloc(3 * 200_000)  # fits only if the three merged
    assert big == blocks[1][0] and view.nbytes == 600_000
    arena.free(blocks[1][0], blocks[1][1])  # a stale (block, generation) pair changes nothing
    assert arena.used_bytes >= 600_000


def test_a_full_arena_waits_for_a_release(arena):
    import threading

    block, gen, _ = arena.alloc(700_000)
    threading.Timer(0.2, arena.free, (block, gen)).start()
    assert arena.alloc(700_000, timeout_s=5)[2].nbytes == 700_000
    with pytest.raises(ShmError, match="do not fit"):
        arena.alloc(2 << 20)


def test_a_requests_blocks_are_taken_all_at_once_so_requests_never_wait_on_each_other(arena):
    import threading

    # Two "requests" that each need 3 blocks of 200 KB in a 1 MiB arena (5 fit): taken one at a time,
    # each could hold some and wait forever for the rest; all at once, one waits for the other's release.
    got: dict[str, list] = {}

    def request(name: str) -> None:
        blocks = arena.alloc_many([200_000] * 3, timeout_s=5)
        got[name] = blocks
        threading.Timer(0.2, lambda: [arena.free(b, g) for b, g, _ in blocks]).start()

    threads = [threading.Thread(target=request, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(got) == ["a", "b"] and all(len(v) == 3 for v in got.values())
    deadline = time.monotonic() + 5
    while arena.used_bytes and time.monotonic() < deadline:  # the second request's blocks come back too
        time.sleep(0.05)
    # What cannot be had at all fails at once, holding nothing, and says which flag sizes the arena.
    with pytest.raises(ShmError, match="--shm-size"):
        arena.alloc_many([400_000] * 3)
    held, gen, _ = arena.alloc(900_000)
    with pytest.raises(ShmError, match="arena is full: .* held, .*raise --shm-size"):
        arena.alloc_many([100_000, 100_000])
    arena.free(held, gen)
    assert arena.used_bytes < 400_000  # the failed attempts left nothing taken


def test_views_release_their_block_when_the_last_user_is_gone(arena):
    block, gen, data = arena.alloc(4096)
    data[:5] = b"hello"
    released = []
    maps = Mappings(lambda seg, b, g: released.append((seg, b, g)))
    view = maps.view(Handle(arena.name, block, 4096, gen))
    t = torch.frombuffer(view, dtype=torch.uint8)
    del view
    gc.collect()
    assert bytes(t[:5].tolist()) == b"hello" and released == []  # the tensor still views it
    del t
    gc.collect()
    assert released == [(arena.name, block, gen)]


def test_a_reused_block_is_caught_not_read(arena):
    block, gen, _ = arena.alloc(4096)
    arena.free(block, gen)
    arena.alloc(4096)  # the same block again, with the next generation
    maps = Mappings(lambda *a: None)
    with pytest.raises(ShmError, match="reused before it was released"):
        maps.view(Handle(arena.name, block, 4096, gen))
    with pytest.raises(ShmError, match="outside segment"):
        maps.view(Handle(arena.name, (1 << 20) - 8, 4096, gen))
    with pytest.raises(ShmError, match="bad segment"):
        Handle.from_list(["../etc/passwd", 0, 1, 1])


def test_a_tensor_built_in_the_arena_travels_without_a_copy_and_frees_itself_if_never_sent(arena):
    t = arena.tensor((3, 64, 64), torch.float32)
    handle = arena.handle_of(memoryview(t.numpy()).cast("B"))
    assert handle is not None and handle.length == 3 * 64 * 64 * 4
    assert arena.handle_of(memoryview(bytearray(100))) is None  # not arena memory
    unsent = arena.tensor((1024,), torch.uint8)
    used = arena.used_bytes
    del unsent
    gc.collect()
    assert arena.used_bytes == used - shm._round_up(HEADER + 1024)


def test_stale_segments_of_dead_processes_are_removed():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = shm.SHM_DIR / f"wirebench-{dead.pid}-deadbeef"
    path.write_bytes(b"x")
    live = Arena(4096)
    try:
        removed = shm.remove_stale_segments()
        assert path.name in removed and not path.exists() and (shm.SHM_DIR / live.name).exists()
    finally:
        live.close()


@pytest.mark.parametrize("transport_name", ["zmq", "shm", "shm-store"])
def test_a_delivery_that_cannot_start_its_receiver_leaves_nothing_behind(transport_name, monkeypatch):
    """Its socket folder, arena or store are gone when the receiver process cannot start (e.g. from a
    daemonic process, which may not have children)."""
    import glob
    import multiprocessing.context

    def refuse(self):
        raise AssertionError("daemonic processes are not allowed to have children")

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", refuse)
    folders, segments = set(glob.glob("/tmp/wirebench-delivery-*")), set(os.listdir("/dev/shm"))
    with pytest.raises(AssertionError, match="daemonic"):
        delivery.measure("msgspec-oob", transport_name, "tensor-fp16-336", PAYLOADS["tensor-fp16-336"](), iterations=1)
    assert set(glob.glob("/tmp/wirebench-delivery-*")) == folders and set(os.listdir("/dev/shm")) <= segments


@pytest.mark.parametrize(
    ("transport_name", "variant"), [("zmq", ""), ("shm", ""), ("shm", "in-place"), ("shm", "bell")]
)
def test_delivery_is_measured_between_two_processes(transport_name, variant):
    before = set(shm.SHM_DIR.glob(f"{shm.PREFIX}{os.getpid()}-*"))
    payload = PAYLOADS["tensor-fp16-336"]()
    d = delivery.measure("msgspec-oob", transport_name, "tensor-fp16-336", payload, iterations=1, variant=variant)
    # ok also says the receiver's digest of the decoded tensor matched the one sent (checked on warm-up sends)
    assert d.status == "ok" and d.iterations == 1 and d.p50_us > 0, d.reason
    parts = d.parts_p50_us
    assert list(parts) == list(delivery.PARTS) and all(p >= 0 for p in parts.values())
    # One send's parts add up to its delivery (of one send, its p50 and p99 are that send's).
    assert sum(parts.values()) == pytest.approx(d.p50_us) and d.p99_us == d.p50_us
    assert d.first_us > 0
    assert set(shm.SHM_DIR.glob(f"{shm.PREFIX}{os.getpid()}-*")) == before  # its arena is gone
    assert delivery.measure("pickle", "shm", "text-550", PAYLOADS["text-550"](), iterations=2).status == "unsupported"


def test_a_prefaulted_arena_is_resident_and_copies_land_intact():
    a = Arena(4 << 20, prefault=True)
    try:
        assert (shm.SHM_DIR / a.name).stat().st_blocks * 512 >= 4 << 20  # every page backed now
        block, gen, dst = a.alloc(1 << 20)
        src = torch.arange(1 << 18, dtype=torch.float32)
        base.copy_into(dst, memoryview(bytes(src.numpy())))
        maps = Mappings(lambda *_: None)
        got = torch.frombuffer(maps.view(Handle(a.name, block, 1 << 20, gen)), dtype=torch.float32)
        assert torch.equal(got, src)
    finally:
        a.close()


def test_a_handle_the_receiver_cannot_even_parse_fails_its_request_alone() -> None:
    """Whatever a receiver raises (here int() of a list: TypeError) is an error output for that request,
    never a dropped message whose request would wait for its timeout."""
    import json
    from dataclasses import replace

    from harness.engine.config import EngineConfig
    from harness.engine.process import EngineProcess
    from harness.wire import curve, zmq_link
    from harness.wire.messages import FinishReason
    from harness.wire.zmq_link import EngineAddresses

    link = EngineAddresses.tcp("127.0.0.1", 6000, curve.ephemeral())
    link = replace(link, transport="shm", frontend_pid=os.getpid(), frontend_segment=shm.segment_name())
    engine = EngineProcess(EngineConfig(codec="msgspec-oob", executor="sim"), link)
    try:
        row = [1, link.frontend_segment, [0], 1024, 1]
        message: list[Any] = [zmq_link.envelope(shm.ADD_SHM, "r1"), json.dumps([row]).encode(), b"body", b""]
        engine._handle_input(message, time.monotonic_ns())
        (out,) = engine.outputs.get_nowait().outputs
        assert out.request_id == "r1" and out.finish_reason == FinishReason.REJECTED
        assert "request could not be received" in (out.error or "")
    finally:
        engine.ctx.term()
