"""Shared test fixtures: kept minimal on purpose."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import zmq


def pytest_configure(config: pytest.Config) -> None:
    # Decoded tensors are documented read-only views on received frames;
    # torch warns (once per process) when it wraps such a buffer. rawbuf
    # silences it at import, but pytest resets filters around each test.
    config.addinivalue_line("filterwarnings", "ignore:The given buffer is not writable:UserWarning")


@pytest.fixture
def zmq_pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """A connected (sender, receiver) PAIR over inproc, on a private context."""
    ctx: zmq.Context = zmq.Context()
    address = f"inproc://wirebench-test-{uuid.uuid4().hex}"
    receiver = ctx.socket(zmq.PAIR)
    sender = ctx.socket(zmq.PAIR)
    for sock in (receiver, sender):
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 5000)  # a lost message fails the test, never hangs it
        sock.setsockopt(zmq.SNDTIMEO, 5000)
    receiver.bind(address)
    sender.connect(address)
    try:
        yield sender, receiver
    finally:
        sender.close()
        receiver.close()
        ctx.term()
