"""The transports: how a request's big frames reach the engine, one module per transport.

base       what a transport is (Transport, its sender and receiver halves) and the helpers they share
registry   names to transports: the built-ins and any registered by entry point (wirebench.transports)
policy     the engine link's rules, checked before any server starts (codec x transport, pickle, auth)
zmq        every frame through the ZeroMQ socket
shm        big frames through a shared-memory arena the frontend owns
torch_shm  big frames through torch shared storages, one per frame
shm_store  big frames through a content-addressed store in shared memory; a frame held is not copied
cuda_ipc   big frames through CUDA memory
"""

from harness.transports.base import (
    TAKEN,
    FrameReceiver,
    FrameSender,
    Peer,
    RefusedSender,
    SenderSettings,
    Transport,
    TransportError,
)
from harness.transports.registry import ENTRY_POINT_GROUP, UnknownTransportError, get_transport, transport_names

__all__ = [
    "ENTRY_POINT_GROUP",
    "TAKEN",
    "FrameReceiver",
    "FrameSender",
    "Peer",
    "RefusedSender",
    "SenderSettings",
    "Transport",
    "TransportError",
    "UnknownTransportError",
    "get_transport",
    "transport_names",
]
