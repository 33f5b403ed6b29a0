"""The zmq transport: every frame in the message. It has no halves of its own, so an engine serving it
opens no out-of-band ADD, and bench micro's delivery over it is ZeroMQ's own copies."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from harness.engine.config import EngineConfig
from harness.engine.process import EngineProcess
from harness.micro import delivery
from harness.micro.payloads import PAYLOADS
from harness.transports import SenderSettings, get_transport
from harness.transports.shm import ADD_SHM
from harness.wire import zmq_link
from harness.wire.messages import FinishReason
from harness.wire.zmq_link import EngineAddresses


def test_zmq_has_no_halves_and_takes_plain_adds() -> None:
    zmq = get_transport("zmq")
    assert not zmq.out_of_band and zmq.add_kind == zmq_link.ADD and zmq.variants == ()
    assert zmq.sender(SenderSettings()) is None and zmq.remove_stale() == [] and zmq.remove_leftovers(1) == []


def test_an_engine_serving_zmq_refuses_an_out_of_band_add_for_that_request_alone() -> None:
    link = EngineAddresses("ipc:///nonexistent/in", "ipc:///nonexistent/out", frontend_pid=os.getpid())
    engine = EngineProcess(EngineConfig(codec="msgspec-oob", executor="sim"), link)
    try:
        assert engine.receiver is None
        message: list[Any] = [zmq_link.envelope(ADD_SHM, "r1"), json.dumps([[1, "x", 0, 1, 1]]).encode(), b"b", b""]
        engine._handle_input(message, time.monotonic_ns())
        (out,) = engine.outputs.get_nowait().outputs
        assert out.request_id == "r1" and out.finish_reason == FinishReason.REJECTED
        assert "serves --transport zmq" in (out.error or "")
    finally:
        engine.ctx.term()


def test_delivery_over_zmq_copies_in_the_socket_not_the_sender() -> None:
    payload = PAYLOADS["tensor-fp16-336"]()
    d = delivery.measure("msgspec-oob", "zmq", "tensor-fp16-336", payload, iterations=2)
    assert d.status == "ok" and d.transport == "zmq" and d.label == "zmq", d.reason
    refused = delivery.measure("msgspec-oob", "zmq", "tensor-fp16-336", payload, iterations=1, variant="in-place")
    assert refused.status == "unsupported" and "zmq has no variant in-place" in refused.reason
