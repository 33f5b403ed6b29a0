"""The rule for wirebench's hooks inside real servers (the vLLM plugin, and any later one): a codec that
unpickles what its peer sends runs there only with that server's own opt-in, and ``bench run`` gives the
opt-in only to an arm whose engine link is a local ipc socket.

Unpickling runs code the sender chooses. A real server guards its own pickle path with a switch of its own
(vLLM: ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``; its decoder refuses pickled data without it), and it may
listen on tcp (vLLM does when data parallelism spans hosts), where any host that reaches the port is a
peer. A hook that swapped in pickle without that switch would reopen the hole the server closed.
"""

from __future__ import annotations

from dataclasses import dataclass

from wirecodecs import unpickles_peer_data

# Engine-link addresses that stay on this host: a unix socket in a private folder, or inside one process.
LOCAL_SCHEMES = ("ipc://", "inproc://")


@dataclass(frozen=True)
class OptIn:
    """A real server's own switch that lets its engine link unpickle peer data."""

    server: str
    variable: str

    def given(self, environment: dict[str, str]) -> bool:
        """Whether ``environment`` turns the switch on (the server reads it as an integer, non-zero on)."""
        try:
            return int(environment.get(self.variable, "0").strip() or "0") != 0
        except ValueError:
            return False

    @property
    def assignment(self) -> str:
        return f"{self.variable}=1"


VLLM_OPT_IN = OptIn("vLLM", "VLLM_ALLOW_INSECURE_SERIALIZATION")


def hook_refusal(codec: str, opted_in: bool, opt_in: OptIn) -> str | None:
    """Why a hook inside ``opt_in.server`` must not install ``codec`` (one line), or None when it may."""
    if opted_in or not unpickles_peer_data(codec):
        return None
    return (
        f"refusing codec {codec!r} inside {opt_in.server}: it unpickles what the peer sends, which runs code "
        f"the peer chooses, and {opt_in.server} allows that only with {opt_in.assignment} (bench run sets it "
        "for such an arm only while its engine link is a local ipc socket)"
    )


def is_local_link(address: str) -> bool:
    """Whether an engine-link address stays on this host by construction (not tcp, even on loopback)."""
    return address.startswith(LOCAL_SCHEMES)


def link_refusal(codec: str, address: str) -> str | None:
    """Why a hook allowed ``codec`` for a local ipc link only must not open ``address`` (or None)."""
    if is_local_link(address):
        return None
    return (
        f"refusing engine link {address} with codec {codec!r}: it unpickles what arrives, and was allowed for a "
        "local ipc link only"
    )
