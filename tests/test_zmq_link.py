"""Transport units: addresses, envelopes, the pickle-over-tcp guard."""

import os
import stat
from pathlib import Path

import pytest

from harness.transports import policy
from harness.transports.policy import LinkSettings, check_shm, check_transport_safety, insecure_warnings
from harness.wire import curve, zmq_link
from harness.wire.zmq_link import EngineAddresses


def test_private_ipc_dir_is_owner_only_and_removed():
    addrs = EngineAddresses.private_ipc()
    try:
        mode = stat.S_IMODE(os.stat(addrs.ipc_dir).st_mode)
        assert mode == 0o700
        assert addrs.input.startswith(f"ipc://{addrs.ipc_dir}/")
    finally:
        addrs.cleanup()
    assert not os.path.exists(addrs.ipc_dir)


@pytest.mark.parametrize(
    "address,expected",
    [
        ("ipc:///tmp/x/input", True),
        ("tcp://127.0.0.1:5570", True),
        ("tcp://localhost:5570", True),
        ("tcp://[::1]:5570", True),
        ("tcp://0.0.0.0:5570", False),
        ("tcp://10.1.2.3:5570", False),
        ("tcp://engine.example:5570", False),
    ],
)
def test_is_loopback(address, expected):
    assert zmq_link.is_loopback(address) is expected


def _args(codec, allow=False, no_auth=False, remote_ok=False, output_codec=None):
    return LinkSettings(
        codec=codec,
        output_codec=output_codec,
        allow_insecure_pickle=allow,
        no_auth=no_auth,
        allow_remote_no_auth=remote_ok,
    )


def test_no_auth_is_loud_and_refused_off_loopback_without_a_second_flag():
    remote, local = EngineAddresses.tcp("10.1.2.3", 6000), EngineAddresses.tcp("127.0.0.1", 6000)
    said = check_transport_safety(_args("msgspec", no_auth=True), remote)
    assert said is not None and "refusing --no-auth on non-loopback tcp://10.1.2.3" in said
    assert check_transport_safety(_args("msgspec", no_auth=True, remote_ok=True), remote) is None
    assert check_transport_safety(_args("msgspec", no_auth=True), local) is None
    warnings = insecure_warnings(_args("msgspec", no_auth=True), local)
    assert len(warnings) == 1 and "unauthenticated and unencrypted" in warnings[0]
    warnings = insecure_warnings(_args("pickle", allow=True, no_auth=True), local)
    assert any("run code as this user" in w for w in warnings)
    assert insecure_warnings(_args("pickle"), EngineAddresses.tcp("127.0.0.1", 6000, curve.ephemeral())) == []


def test_pickle_over_tcp_needs_authentication_and_loopback_or_the_flag():
    keys = curve.ephemeral()
    remote = EngineAddresses.tcp("0.0.0.0", 6000, keys)
    assert "refusing codec 'pickle'" in check_transport_safety(_args("pickle"), remote)
    assert check_transport_safety(_args("pickle-oob"), remote) is not None
    assert check_transport_safety(_args("pickle", allow=True), remote) is None
    assert check_transport_safety(_args("msgspec-oob"), remote) is None
    # Outputs in pickle: the frontend unpickles what the engine sends, the same risk the other way.
    assert "refusing codec 'pickle'" in check_transport_safety(_args("msgspec", output_codec="pickle"), remote)
    assert check_transport_safety(_args("pickle", output_codec="msgspec"), remote) is not None
    # Loopback: fine when CURVE-authenticated, refused when any local process could connect.
    assert check_transport_safety(_args("pickle"), EngineAddresses.tcp("127.0.0.1", 6000, keys)) is None
    unauthenticated = check_transport_safety(_args("pickle"), EngineAddresses.tcp("127.0.0.1", 6000))
    assert unauthenticated is not None and "unauthenticated" in unauthenticated
    ipc = EngineAddresses.private_ipc()
    try:
        assert check_transport_safety(_args("pickle"), ipc) is None
    finally:
        ipc.cleanup()


def test_tcp_output_port_follows_input():
    addrs = EngineAddresses.tcp("::1", 6000)
    assert addrs.input == "tcp://[::1]:6000" and addrs.output == "tcp://[::1]:6001"


def test_envelope_round_trip():
    assert zmq_link.open_envelope(zmq_link.envelope(zmq_link.ADD, "cmpl-é1")) == (zmq_link.ADD, "cmpl-é1")
    assert zmq_link.open_envelope(zmq_link.envelope(zmq_link.ABORT)) == (zmq_link.ABORT, None)
    with pytest.raises(ValueError):
        zmq_link.open_envelope(b"")


# --- CURVE key folders: only this user's private ones are trusted (not another local user's) -------


def test_key_folders_are_created_private_and_reused(tmp_path: Path) -> None:
    folder = tmp_path / "keys"
    keys = curve.create_or_load(folder)
    assert folder.stat().st_mode & 0o777 == 0o700
    assert (folder / "engine.key_secret").stat().st_mode & 0o077 == 0
    assert curve.create_or_load(folder) == keys == curve.load(folder)  # a restarted engine keeps its identity


@pytest.mark.parametrize("mode", [0o755, 0o770, 0o701])
def test_a_key_folder_open_to_others_is_refused_not_chmodded(tmp_path: Path, mode: int) -> None:
    folder = tmp_path / "planted"
    curve.create_or_load(folder)
    folder.chmod(mode)
    with pytest.raises(curve.KeyFolderError, match="group or others"):
        curve.create_or_load(folder)
    with pytest.raises(curve.KeyFolderError):
        curve.load(folder)
    assert folder.stat().st_mode & 0o777 == mode  # left as found


def test_a_readable_secret_or_a_symlinked_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "keys"
    curve.create_or_load(folder)
    (folder / "frontend.key_secret").chmod(0o644)
    with pytest.raises(curve.KeyFolderError, match="frontend.key_secret"):
        curve.load(folder)
    link = tmp_path / "link"
    link.symlink_to(folder)
    with pytest.raises(curve.KeyFolderError, match="symbolic link"):
        curve.create_or_load(link)


def _links() -> tuple[EngineAddresses, EngineAddresses, EngineAddresses]:
    """Authenticated loopback tcp, authenticated tcp to another host, and unauthenticated loopback tcp."""
    keys = curve.ephemeral()
    return (
        EngineAddresses.tcp("127.0.0.1", 6000, keys),
        EngineAddresses.tcp("10.1.2.3", 6000, keys),
        EngineAddresses.tcp("127.0.0.1", 6000),
    )


@pytest.mark.parametrize("name", ["shm", "torch-shm", "shm-store"])
def test_out_of_band_transports_need_a_spawned_engine_on_this_host_over_an_authenticated_link(name):
    local, remote, open_tcp = _links()
    assert check_shm(LinkSettings("msgspec-oob", transport=name), local) is None
    assert f"--transport {name} needs a codec with out-of-band" in check_shm(
        LinkSettings("msgspec", transport=name), local
    )
    assert "another host" in check_shm(LinkSettings("msgspec-oob", transport=name), remote)
    # The engine could not tell its frontend from another local process: refused, and no flag lifts it.
    for allow in (False, True):
        link = LinkSettings("msgspec-oob", transport=name, no_auth=True, allow_insecure_pickle=allow)
        assert "unauthenticated tcp" in check_shm(link, open_tcp)
    for split in (
        LinkSettings("msgspec-oob", transport=name, engine_only=True),
        LinkSettings("msgspec-oob", transport=name, frontend_only=True),
    ):
        assert "spawns" in (check_shm(split, local) or "")
    assert check_shm(LinkSettings("msgspec"), remote) is None


def test_cuda_ipc_is_refused_without_a_cuda_device(monkeypatch):
    from harness.experiment.arms import parse_arms

    monkeypatch.setattr(policy, "_cuda_available", lambda: False)
    (arm,) = parse_arms("msgspec-oob", "cuda-ipc")
    assert arm.unsupported() == "--transport cuda-ipc needs a CUDA device; this machine has none"
    monkeypatch.setattr(policy, "_cuda_available", lambda: True)
    assert arm.unsupported() is None
    open_tcp, ipc = EngineAddresses.tcp("127.0.0.1", 6000), EngineAddresses.private_ipc()
    try:
        assert "unauthenticated tcp" in (check_shm(LinkSettings("msgspec-oob", transport="cuda-ipc"), open_tcp) or "")
        assert check_shm(LinkSettings("msgspec-oob", transport="cuda-ipc"), ipc) is None
    finally:
        ipc.cleanup()
