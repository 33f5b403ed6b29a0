"""The rules of the engine link, checked before any server starts: which codec may use which transport,
and when a codec that unpickles its peer's data, or an unauthenticated socket, would face a peer that
may not be ours. Each check returns the message to refuse with (never a silent fallback), or None.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.settings.declare import setting
from harness.transports.registry import UnknownTransportError, get_transport, transport_help, transport_names
from harness.wire.zmq_link import EngineAddresses, is_loopback
from wirecodecs import codecs_out_of_band, sends_out_of_band, unpickles_peer_data

_LOCAL = ("ipc://", "inproc://")


@dataclass(frozen=True)
class LinkSettings:
    """What the rules judge: the codecs, the transport and the security switches of one engine link.
    The switches and --transport are ``bench serve`` flags (harness.settings.declare)."""

    codec: str = "pickle"  # of requests (bench serve --codec)
    output_codec: str | None = None  # of outputs; None: ``codec``
    no_auth: bool = setting(
        False,
        flag="--no-auth",
        help="tcp without CURVE authentication and encryption (any local process can then talk to the engine)",
    )
    allow_remote_no_auth: bool = setting(
        False,
        flag="--allow-remote-no-auth",
        help="with --no-auth, allow an engine address that is not loopback (every host that reaches it can "
        "send the engine requests and read its outputs)",
    )
    allow_insecure_pickle: bool = setting(
        False,
        flag="--allow-insecure-pickle",
        help="allow a pickle codec over tcp without authentication, or to another host (unpickling runs "
        "code the peer chooses)",
    )
    transport: str = setting(
        "zmq",
        flag="--transport",
        choices=transport_names(),
        help=transport_help(),
    )
    mm_store_bytes: int = setting(
        256 << 20,
        flag="--mm-store-bytes",
        metavar="BYTES",
        help="shm-store: the store's capacity; a full store evicts the least recently used frames no request "
        "in flight points at, and sends a frame in the message when all are pinned (default %(default)s)",
    )
    engine_only: bool = False  # this process runs only the engine
    frontend_only: bool = False  # this process runs only the frontend, joining an engine started apart


def transport_refusal(codec: str, transport: str) -> str | None:
    """Why ``codec`` cannot use ``transport`` (said before any server starts), or None."""
    try:
        chosen = get_transport(transport)
    except UnknownTransportError as exc:  # a registered plugin that cannot be loaded
        return str(exc)
    if chosen.out_of_band and not sends_out_of_band(codec):
        return (
            f"--transport {transport} needs a codec with out-of-band frames, which sends big buffers as frames of "
            f"their own ({', '.join(codecs_out_of_band())}); {codec!r} puts them in its body"
        )
    if chosen.needs_cuda and not _cuda_available():
        return f"--transport {transport} needs a CUDA device; this machine has none"
    return None


def _cuda_available() -> bool:
    import torch  # only for a transport that needs CUDA: the other checks stay light

    return bool(torch.cuda.is_available())


def check_shm(link: LinkSettings, addresses: EngineAddresses) -> str | None:
    """An error message when a transport other than zmq cannot serve this codec or link.

    The engine maps the memory an out-of-band message names only when it can tell that its own
    frontend sent it (harness.transports.base.check_sender): so these transports need the engine the frontend
    spawns, on this host, over ipc or authenticated tcp. No flag lifts that."""
    refusal = transport_refusal(link.codec, link.transport)
    if refusal:
        return refusal
    if not get_transport(link.transport).out_of_band:
        return None
    if link.engine_only or link.frontend_only:
        return (
            f"--transport {link.transport} needs the engine its frontend spawns (no --engine-only or "
            "--frontend-only): an engine maps shared memory only of the process that started it"
        )
    if not all(a.startswith("ipc://") or is_loopback(a) for a in (addresses.input, addresses.output)):
        return f"--transport {link.transport} needs the engine on this host: {addresses.input} is another host"
    if _tcp(addresses) and not addresses.authenticated:
        return (
            f"--transport {link.transport} over unauthenticated tcp: the engine could not tell its frontend's "
            "handles from any local process's, so it would map none. Drop --no-auth, or use ipc (the default)."
        )
    return None


def _tcp(addresses: EngineAddresses) -> list[str]:
    return [a for a in (addresses.input, addresses.output) if not a.startswith(_LOCAL)]


def check_transport_safety(link: LinkSettings, addresses: EngineAddresses) -> str | None:
    """An error message when a codec that unpickles peer data would face a peer that may not be ours.

    ipc: fine (a private 0700 directory). tcp: only when authenticated (CURVE) and on loopback;
    otherwise only with --allow-insecure-pickle.
    """
    if link.no_auth and not link.allow_remote_no_auth:
        remote = [a for a in _tcp(addresses) if not is_loopback(a)]
        if remote:
            return (
                f"refusing --no-auth on non-loopback {remote[0]}: any host that reaches it could send the engine "
                "requests and read every output. Drop --no-auth (CURVE), bind to loopback, or pass "
                "--allow-remote-no-auth as well."
            )
    codec = unpickling_codec(link)
    if codec is None or link.allow_insecure_pickle:
        return None
    for address in _tcp(addresses):
        if not addresses.authenticated:
            return (
                f"refusing codec {codec!r} over unauthenticated tcp {address}: it unpickles frames, and any "
                "local process could send one that runs its code. Drop --no-auth, use a msgspec codec, or pass "
                "--allow-insecure-pickle."
            )
        if not is_loopback(address):
            return (
                f"refusing codec {codec!r} over non-loopback {address}: it unpickles "
                "frames, which runs code chosen by the peer. Use a msgspec codec, or pass "
                "--allow-insecure-pickle if every host on that network is trusted."
            )
    return None


def unpickling_codec(link: LinkSettings) -> str | None:
    """The codec, of requests or of outputs, that unpickles what its peer sends (None if neither does)."""
    return next((c for c in (link.codec, link.output_codec) if c and unpickles_peer_data(c)), None)


def insecure_warnings(link: LinkSettings, addresses: EngineAddresses) -> list[str]:
    """What an insecure mode allows, said out loud every time it is on."""
    tcp = _tcp(addresses)
    out = []
    codec = unpickling_codec(link)
    if link.no_auth and tcp:
        code = (
            f"run code as this user (codec {codec!r} unpickles what arrives)"
            if codec is not None
            else "not run code (no codec here unpickles)"
        )
        out.append(
            f"--no-auth: the engine's tcp sockets ({', '.join(tcp)}) are unauthenticated and unencrypted; "
            "any process that reaches them can send requests, abort anyone's, read every output and fill the "
            f"engine's queue; it can {code}, and cannot make the engine map memory (out-of-band messages "
            "are refused on such a link)"
        )
    if link.allow_insecure_pickle and tcp and codec is not None:
        out.append(
            f"--allow-insecure-pickle: codec {codec!r} unpickles what arrives on {', '.join(tcp)}; "
            "a peer that can send a frame can run code as this user"
        )
    return out
