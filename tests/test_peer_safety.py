"""No peer runs code in the engine or makes it map memory: an out-of-band ADD is opened only for the
engine's own transport and only from the frontend that spawned it (the kernel names the sender over
ipc); a cuda-ipc handle is plain data. Each refusal fails its request alone; the engine serves on."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import zmq
from test_e2e_engine import request as engine_request

from harness.engine.config import EngineConfig
from harness.engine.process import EngineProcess
from harness.transports import Peer, RefusedSender, get_transport, shm, torch_shm
from harness.transports.base import check_sender
from harness.transports.cuda_ipc import ADD_CUDA, CudaHandle, CudaIpcError
from harness.wire import curve, zmq_link
from harness.wire.messages import EngineCoreOutputs, FinishReason
from harness.wire.zmq_link import EngineAddresses
from wirecodecs import get_codec

from serve_process import free_port_pair


class Exploit:
    """Unpickled, it creates a marker file: proof that a peer ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _rogue_adds(marker: Path, body: list) -> dict[str, list]:
    """A keyless peer's out-of-band ADDs, each naming something the engine must not open."""
    storage = torch.UntypedStorage._new_shared(4096)  # the rogue's own memory, a real fd
    handle = torch_shm.handle_of(storage, 4096, 1)
    segment = shm.Arena(1 << 16)  # a real segment, the rogue's
    block, gen, _ = segment.alloc(4096)
    shm_handle = shm.Handle(segment.name, block, 4096, gen)
    pickled = pickle.dumps(Exploit(marker)).hex()
    adds: dict[str, tuple[int, list]] = {
        "rogue-cuda-pickle": (ADD_CUDA, [[1, 1, pickled]]),
        "rogue-cuda-row": (ADD_CUDA, [[1, 2, 0, pickled, 1, 0, pickled, 0, None, False, 0, 1]]),
        "rogue-torch": (torch_shm.ADD_TORCH, [[1, *handle.to_list()]]),
        "rogue-shm": (shm.ADD_SHM, [[1, *shm_handle.to_list()]]),
    }
    messages = {}
    for rid, (kind, rows) in adds.items():
        messages[rid] = [zmq_link.envelope(kind, rid), json.dumps(rows).encode(), *body, b""]
    messages["_keep"] = [storage, segment]  # alive until sent
    return messages


@pytest.mark.slow
def test_a_keyless_peer_runs_nothing_maps_nothing_and_the_engine_serves_on(tmp_path):
    """The case as reported: `--engine-only --socket tcp --no-auth --codec msgspec` on loopback, a plain
    PUSH with no keys sends out-of-band ADDs (a cuda-ipc handle that is a pickle, a torch-shm and an shm
    handle of its own); each fails alone, nothing runs, and a normal request after them completes."""
    port = free_port_pair()
    engine = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "serve", "--engine-only", "--no-auth", "--codec", "msgspec"]
        + ["--executor", "sim", "--engine-port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    codec = get_codec("msgspec")
    marker = tmp_path / "pwned"
    ctx: zmq.Context = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    keep: list = []
    try:
        lines = [engine.stdout.readline()]
        while "listening on" not in lines[-1] and lines[-1]:
            lines.append(engine.stdout.readline())
        assert any("--no-auth" in line and "cannot make the engine map memory" in line for line in lines), lines
        push.connect(f"tcp://127.0.0.1:{port}")
        pull.connect(f"tcp://127.0.0.1:{port + 1}")
        pull.setsockopt(zmq.RCVTIMEO, 20_000)
        body = codec.encode(engine_request("ignored"))
        messages = _rogue_adds(marker, body)
        keep = messages.pop("_keep")
        for message in messages.values():
            push.send_multipart(message)
        push.send_multipart([zmq_link.envelope(zmq_link.ADD, "good"), *codec.encode(engine_request("good"))])
        refused: dict[str, str] = {}
        tokens: list[int] = []
        finished = False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (len(refused) == len(messages) and finished):
            frames = pull.recv_multipart()
            if zmq_link.open_envelope(frames[0])[0] != zmq_link.OUTPUTS:
                continue
            for out in codec.decode(frames[1:], EngineCoreOutputs).outputs:
                if out.request_id == "good":
                    tokens += out.new_token_ids
                    finished = out.finished
                else:
                    assert out.finish_reason == FinishReason.REJECTED, out
                    refused[out.request_id] = out.error or ""
        assert set(refused) == set(messages), refused
        assert all("this engine serves --transport zmq" in why for why in refused.values()), refused
        assert len(tokens) == 3 and finished
        assert engine.poll() is None
        assert not marker.exists(), "a peer's pickle was unpickled"
    finally:
        if keep:
            keep[1].close()  # the rogue's segment
        push.close(linger=0)
        pull.close(linger=0)
        ctx.term()
        engine.send_signal(signal.SIGINT)
        engine.wait(timeout=20)


def _send_from_child(address: str, kind: int) -> None:
    ctx: zmq.Context = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.connect(address)
    sock.send_multipart([zmq_link.envelope(kind, "r"), b"[]"])
    sock.close(linger=2000)
    ctx.term()


def test_over_ipc_the_kernel_names_the_sender_whatever_the_message_says(tmp_path):
    """check_sender on a real unix-socket link: the sender's pid comes from the socket (SO_PEERCRED), so
    a message from any process but the engine's frontend is refused."""
    address = f"ipc://{tmp_path}/input"
    ctx: zmq.Context = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind(address)
    pull.setsockopt(zmq.RCVTIMEO, 20_000)
    try:
        child = multiprocessing.get_context("spawn").Process(
            target=_send_from_child, args=(address, torch_shm.ADD_TORCH)
        )
        child.start()
        envelope = pull.recv_multipart(copy=False)[0]
        child.join(timeout=20)
        assert zmq_link.sender_pid(envelope) == child.pid
        link = EngineAddresses(address, address, transport="torch-shm", frontend_pid=child.pid)
        check_sender(torch_shm.ADD_TORCH, envelope, link, get_transport("torch-shm"))  # its frontend: taken
        with pytest.raises(RefusedSender, match=f"sent by process {child.pid}"):
            check_sender(
                torch_shm.ADD_TORCH, envelope, replace(link, frontend_pid=os.getpid()), get_transport("torch-shm")
            )
        with pytest.raises(RefusedSender, match="serves --transport shm"):
            check_sender(torch_shm.ADD_TORCH, envelope, link, get_transport("shm"))
        with pytest.raises(RefusedSender, match="spawned"):
            check_sender(torch_shm.ADD_TORCH, envelope, replace(link, frontend_pid=None), get_transport("torch-shm"))
    finally:
        pull.close(linger=0)
        ctx.term()


def test_over_tcp_only_an_authenticated_link_vouches_for_the_frontend():
    keys = curve.ephemeral()
    for authenticated, refused in ((keys, False), (None, True)):
        link = EngineAddresses.tcp("127.0.0.1", 6000, authenticated)
        link = replace(link, transport="cuda-ipc", frontend_pid=os.getpid())
        if refused:
            with pytest.raises(RefusedSender, match="unauthenticated tcp"):
                check_sender(ADD_CUDA, b"\x05r", link, get_transport("cuda-ipc"))
        else:
            check_sender(ADD_CUDA, b"\x05r", link, get_transport("cuda-ipc"))


def test_a_torch_shm_handle_into_another_process_is_refused_and_still_reported_taken():
    storage = torch.UntypedStorage._new_shared(4096)
    handle = torch_shm.handle_of(storage, 4096, 7)
    frames = [json.dumps([[1, *handle.to_list()]]).encode(), b"body", b""]
    taken: list = []
    with pytest.raises(torch_shm.TorchShmError, match=f"names process {os.getpid()}"):
        torch_shm.TorchShmReceiver(Peer(os.getpid() + 1, release=taken.append)).open(frames)
    assert taken == [[torch_shm.TAKEN, handle.fd, 7]]  # its sender may drop it: nothing of it was mapped
    body = torch_shm.TorchShmReceiver(Peer(os.getpid())).open(frames)
    assert len(body) == 2 and memoryview(body[1]).nbytes == 4096


def test_an_shm_handle_into_a_segment_the_frontend_did_not_name_fails_its_request_alone():
    """The engine maps only the segment its frontend named at spawn; another (a real segment of ours)
    is refused before it is mapped, as an error output for that request."""
    theirs = shm.Arena(1 << 16)
    try:
        block, gen, _ = theirs.alloc(1024)
        link = EngineAddresses.tcp("127.0.0.1", 6000, curve.ephemeral())
        link = replace(link, transport="shm", frontend_pid=os.getpid(), frontend_segment=shm.segment_name())
        engine = EngineProcess(EngineConfig(codec="msgspec-oob", executor="sim"), link)
        row = [1, *shm.Handle(theirs.name, block, 1024, gen).to_list()]
        message: list[Any] = [zmq_link.envelope(shm.ADD_SHM, "r1"), json.dumps([row]).encode(), b"body", b""]
        engine._handle_input(message, time.monotonic_ns())
        (batch,) = [engine.outputs.get_nowait()]
        (out,) = batch.outputs
        assert out.request_id == "r1" and out.finish_reason == FinishReason.REJECTED
        assert "is not the one this engine's frontend named" in (out.error or "")
        assert isinstance(engine.receiver, shm.ShmReceiver) and engine.receiver.mappings._maps == {}  # nothing mapped
        engine.ctx.term()
    finally:
        theirs.close()


def test_a_cuda_ipc_row_is_plain_data_checked_field_by_field():
    handle = CudaHandle(0, b"\x01\x02", 4096, 0, b"/torch_1_2", 8, None, False, 0, 4096)
    assert CudaHandle.from_row(json.loads(json.dumps(handle.to_row()))) == handle
    bad_rows = [
        [1, 1, pickle.dumps(Exploit(Path("/nonexistent"))).hex()],  # the old pickled form
        [*handle.to_row()[:-1], -1],  # a negative length
        [*handle.to_row()[:7], "yes", *handle.to_row()[8:]],  # a string where a bool goes
        [*handle.to_row()[:1], "zz", *handle.to_row()[2:]],  # not hex
        [True, *handle.to_row()[1:]],  # a bool where an int goes
    ]
    for row in bad_rows:
        with pytest.raises(CudaIpcError):
            CudaHandle.from_row(row)


@pytest.mark.parametrize("transport_name", ["torch-shm", "shm-store", "cuda-ipc"])
def test_an_engine_started_on_its_own_refuses_out_of_band_transports(transport_name):
    """`--engine-only --transport cuda-ipc --no-auth` once started; now every out-of-band transport is
    refused in one line (cuda-ipc first for want of a GPU where there is none)."""
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "serve", "--engine-only", "--no-auth", "--codec", "msgspec-oob"]
        + ["--transport", transport_name, "--executor", "sim", "--engine-port", str(free_port_pair())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "needs the engine its frontend spawns" in last or "needs a CUDA device" in last, last
    assert "Traceback" not in done.stderr
