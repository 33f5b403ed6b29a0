"""Transport units: addresses, envelopes, the pickle-over-tcp guard."""

import argparse
import os
import stat

import pytest

from harness.commands.serve import check_transport_safety
from harness.wire import curve, transport
from harness.wire.transport import EngineAddresses


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
    assert transport.is_loopback(address) is expected


def _args(codec, allow=False):
    return argparse.Namespace(codec=codec, allow_insecure_pickle=allow)


def test_pickle_over_tcp_needs_authentication_and_loopback_or_the_flag():
    keys = curve.ephemeral()
    remote = EngineAddresses.tcp("0.0.0.0", 6000, keys)
    assert "refusing codec 'pickle'" in check_transport_safety(_args("pickle"), remote)
    assert check_transport_safety(_args("pickle-oob"), remote) is not None
    assert check_transport_safety(_args("pickle", allow=True), remote) is None
    assert check_transport_safety(_args("msgspec-oob"), remote) is None
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
    assert transport.open_envelope(transport.envelope(transport.ADD, "cmpl-é1")) == (transport.ADD, "cmpl-é1")
    assert transport.open_envelope(transport.envelope(transport.ABORT)) == (transport.ABORT, None)
    with pytest.raises(ValueError):
        transport.open_envelope(b"")
