"""The transports: how a request's big frames reach the engine, one module per transport.

Its modules, each with its job: docs/architecture.md (Packages, bottom-up).
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
