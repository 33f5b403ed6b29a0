"""The engine process on its own: bad frames never kill it; it follows its parent.

The engine runs as a real spawned process bound on loopback tcp; the test
plays the frontend with raw ZeroMQ sockets.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import zmq

from harness.wire import zmq_link
from harness.wire.messages import EngineCoreOutputs, EngineCoreRequest, FinishReason, SamplingParams
from wirecodecs import get_codec

from serve_process import pid_alive, sim_engine


@pytest.fixture
def engine():
    with sim_engine() as running:
        yield running


def next_outputs(pull: zmq.Socket) -> EngineCoreOutputs:
    codec = get_codec("msgspec")
    while True:
        frames = pull.recv_multipart()
        kind, _ = zmq_link.open_envelope(frames[0])
        if kind == zmq_link.OUTPUTS:
            return codec.decode(frames[1:], EngineCoreOutputs)


def request(rid: str, max_tokens: int = 3) -> EngineCoreRequest:
    return EngineCoreRequest(
        request_id=rid,
        prompt=None,
        prompt_token_ids=[5, 6, 7],
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        eos_token_id=1,
        arrival_time=time.time(),
    )


def test_bad_frames_never_kill_the_engine(engine):
    proc, push, pull = engine
    codec = get_codec("msgspec")
    # Garbage of every shape: empty envelope, unknown kind, undecodable bodies,
    # another codec's frames, an invalid request.
    push.send_multipart([b""])
    push.send_multipart([b"\x7f", b"junk"])
    push.send_multipart([zmq_link.envelope(zmq_link.ABORT), b"\xc1\xc1"])
    push.send_multipart([zmq_link.envelope(zmq_link.ADD, "bad-1"), b"\x00garbage"])
    push.send_multipart([zmq_link.envelope(zmq_link.ADD, "bad-2"), *get_codec("pickle").encode(request("bad-2"))])
    push.send_multipart([zmq_link.envelope(zmq_link.ADD, "bad-3"), *codec.encode(request("bad-3", max_tokens=0))])
    push.send_multipart([zmq_link.envelope(zmq_link.ADD, "good"), *codec.encode(request("good"))])

    errors: dict[str, str] = {}
    good_tokens: list[int] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (len(errors) == 3 and len(good_tokens) == 3):
        for out in next_outputs(pull).outputs:
            if out.finish_reason == FinishReason.REJECTED:
                errors[out.request_id] = out.error or ""
            elif out.request_id == "good":
                good_tokens += out.new_token_ids
    assert set(errors) == {"bad-1", "bad-2", "bad-3"}
    assert "could not be decoded" in errors["bad-1"] and "could not be decoded" in errors["bad-2"]
    assert len(good_tokens) == 3
    assert proc.is_alive()


@pytest.mark.slow  # a parent process, its engine, and the wait for the engine to notice
def test_engine_stops_when_its_frontend_dies(tmp_path):
    # A parent process that spawns an engine and is then SIGKILLed: the
    # orphaned engine must notice and exit by itself.
    script = tmp_path / "parent.py"
    script.write_text(
        "import multiprocessing, sys, time\n"
        "from harness.engine.config import EngineConfig\n"
        "from harness.engine.process import run_engine\n"
        "from harness.wire.zmq_link import EngineAddresses\n"
        "if __name__ == '__main__':\n"
        "    addrs = EngineAddresses.private_ipc()\n"
        "    cfg = EngineConfig(codec='msgspec', executor='sim')\n"
        "    p = multiprocessing.get_context('spawn').Process(target=run_engine, args=(cfg, addrs, 'CRITICAL', True))\n"
        "    p.start()\n"
        "    print(p.pid, flush=True)\n"
        "    time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    engine_pid = int(parent.stdout.readline())
    time.sleep(3)  # let the engine start up
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while pid_alive(engine_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(engine_pid)
