"""``zmq``: every frame through the ZeroMQ socket, big ones included (vLLM's direct_rpc).

ZeroMQ copies a big frame on its way (into its I/O thread's buffers, and out of them on the far
side); there is nothing to hold or to free, so this transport has no sender or receiver of its own.
"""

from __future__ import annotations

from harness.transports.base import Transport


class ZmqTransport(Transport):
    name = "zmq"
    summary = "every frame through the socket (vLLM's direct_rpc)"
