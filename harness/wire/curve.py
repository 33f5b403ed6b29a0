"""An authenticated engine link over tcp: ZeroMQ's CURVE security, and only our frontend's key gets in.

CURVE (ZeroMQ RFC 26) gives every connection a handshake and encryption; the
ZAP authenticator (``zmq.auth``) then decides which client keys may connect.
The engine's sockets are CURVE servers that accept exactly one client key,
the frontend's, so an unauthenticated local process can neither send the
engine a frame (a SHUTDOWN, a pickle) nor connect a second PULL socket to
read its outputs: the handshake fails before any message is delivered.

Key material:

- a spawned engine over tcp (``bench serve --socket tcp``): fresh keys in
  memory, handed to the engine process with its addresses;
- a split deployment: ``bench serve --engine-only`` creates (or reuses, so a
  restarted engine keeps its identity and a waiting frontend reconnects) a
  folder ``--curve-dir`` (mode 0700) holding ``engine.key_secret`` and
  ``frontend.key_secret`` (mode 0600, ZeroMQ's certificate format);
  ``--frontend-only --curve-dir`` reads the same folder (copy it to the
  frontend's host). Whoever can read that folder can talk to the engine, so a
  folder or secret file of another owner, or open to group or others, is refused
  (``KeyFolderError``), never chmod-ed into trust: a planted folder of known keys
  would let its planter in.

Over ipc sockets (the default) none of this is needed: they live in a
private 0700 directory, so only this user can connect to them.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

ENGINE, FRONTEND = "engine", "frontend"


@dataclass(frozen=True)
class CurveKeys:
    """Z85 keys; a side holds the secrets it needs (the engine its own, the frontend its own)."""

    engine_public: bytes
    frontend_public: bytes
    engine_secret: bytes | None = None
    frontend_secret: bytes | None = None


def ephemeral() -> CurveKeys:
    engine_public, engine_secret = zmq.curve_keypair()
    frontend_public, frontend_secret = zmq.curve_keypair()
    return CurveKeys(engine_public, frontend_public, engine_secret, frontend_secret)


def default_dir(port: int) -> Path:
    return Path.home() / ".wirebench" / "curve" / f"engine-{port}"


class KeyFolderError(PermissionError):
    """A key folder (or key file) this user cannot trust: another owner, or readable by others."""


def check_private(path: Path) -> None:
    """Refuse a key folder or file that is not this user's alone: someone who could write it could have
    planted keys they know (and, with a pickle codec, run code as this user)."""
    st = path.lstat()
    if path.is_symlink():
        raise KeyFolderError(f"{path} is a symbolic link: key folders and files must be real and private")
    if st.st_uid != os.getuid():
        raise KeyFolderError(f"{path} belongs to uid {st.st_uid}, not to this user ({os.getuid()}): refusing its keys")
    if st.st_mode & 0o077:
        raise KeyFolderError(
            f"{path} has mode {st.st_mode & 0o777:o}: group or others may read or change it; "
            f"make it 0{0o700 if path.is_dir() else 0o600:o} (chmod) or remove it, then start again"
        )


def create_or_load(folder: Path) -> CurveKeys:
    """The engine side: the folder's keys, created owner-only when it has none. An existing folder is
    used only when it is this user's and private (``check_private``), never chmod-ed into trust."""
    with contextlib.suppress(FileExistsError):
        folder.mkdir(parents=True, mode=0o700)
    check_private(folder)
    if not (folder / f"{ENGINE}.key_secret").exists() or not (folder / f"{FRONTEND}.key_secret").exists():
        for name in (ENGINE, FRONTEND):
            public_file, secret_file = zmq.auth.create_certificates(str(folder), name)
            os.chmod(secret_file, 0o600)
    return load(folder)


def load(folder: Path, wait_s: float = 10.0) -> CurveKeys:
    """Both key pairs from a private folder ``create_or_load`` wrote; FileNotFoundError naming it
    otherwise, KeyFolderError when the folder or a secret file is not this user's alone.

    Waits up to ``wait_s`` for the files: an engine and its frontend started together race.
    """
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not (folder / f"{FRONTEND}.key_secret").exists():
        time.sleep(0.1)
    if folder.exists():
        check_private(folder)
        for name in (ENGINE, FRONTEND):
            if (folder / f"{name}.key_secret").exists():
                check_private(folder / f"{name}.key_secret")
    try:
        engine_public, engine_secret = zmq.auth.load_certificate(str(folder / f"{ENGINE}.key_secret"))
        frontend_public, frontend_secret = zmq.auth.load_certificate(str(folder / f"{FRONTEND}.key_secret"))
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(
            f"no engine keys in {folder} ({exc}): start `bench serve --engine-only` first, or pass the "
            "--curve-dir it created"
        ) from None
    return CurveKeys(engine_public, frontend_public, engine_secret, frontend_secret)


def for_frontend(keys: CurveKeys) -> CurveKeys:
    return CurveKeys(keys.engine_public, keys.frontend_public, None, keys.frontend_secret)


def for_engine(keys: CurveKeys) -> CurveKeys:
    return CurveKeys(keys.engine_public, keys.frontend_public, keys.engine_secret, None)


def secure_server(sock: zmq.Socket, keys: CurveKeys) -> None:
    """The engine's socket: a CURVE server (set before bind)."""
    assert keys.engine_secret is not None, "the engine needs its secret key"
    sock.curve_secretkey = keys.engine_secret
    sock.curve_publickey = keys.engine_public
    sock.curve_server = True


def secure_client(sock: zmq.Socket, keys: CurveKeys) -> None:
    """The frontend's socket: a CURVE client that knows the engine's public key (set before connect)."""
    assert keys.frontend_secret is not None, "the frontend needs its secret key"
    sock.curve_secretkey = keys.frontend_secret
    sock.curve_publickey = keys.frontend_public
    sock.curve_serverkey = keys.engine_public


class _OnlyOurFrontend:
    def __init__(self, key: bytes) -> None:
        self.key = key

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.key


def start_authenticator(ctx: zmq.Context, keys: CurveKeys) -> ThreadAuthenticator:
    """ZAP for the engine's context: a CURVE client is let in only with the frontend's public key."""
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve_callback(domain="*", credentials_provider=_OnlyOurFrontend(keys.frontend_public))
    return auth
