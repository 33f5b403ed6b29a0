"""Transport names to classes: the built-ins plus any registered by entry point.

A package adds a transport by declaring, in its pyproject.toml::

    [project.entry-points."wirebench.transports"]
    my-transport = "my_package.my_module:MyTransport"

The class subclasses ``harness.transports.Transport``: it sets ``name`` (the entry point's name),
declares the facts where it differs from the defaults (``add_kind``, ``needs_cuda``, ``variants``,
``summary``) and names or defines the parts it has (``sender_class``, ``receiver_class``,
``remove_leftovers``, ``remove_stale``). It is then a choice of ``bench serve --transport``, ``bench
run --transport`` and ``bench micro --transport`` like a built-in. A registered class that is not a
Transport, names itself otherwise, takes an envelope kind outside ``zmq_link.OUT_OF_BAND_ADDS`` or
declares an unknown variant is refused with an error naming its entry point.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from functools import cache

from harness.transports.base import VARIANTS, Transport
from harness.wire import zmq_link
from wirecodecs.registry import UnknownNameError, error_text, registered_targets

ENTRY_POINT_GROUP = "wirebench.transports"
log = logging.getLogger(__name__)

_BUILTIN: dict[str, str] = {
    "zmq": "harness.transports.zmq:ZmqTransport",
    "shm": "harness.transports.shm:ShmTransport",
    "torch-shm": "harness.transports.torch_shm:TorchShmTransport",
    "shm-store": "harness.transports.shm_store:ShmStoreTransport",
    "cuda-ipc": "harness.transports.cuda_ipc:CudaIpcTransport",
}


class UnknownTransportError(UnknownNameError):
    pass


@cache
def _registered() -> dict[str, str]:
    return registered_targets(ENTRY_POINT_GROUP, _BUILTIN)


def transport_names() -> tuple[str, ...]:
    """Every name ``get_transport`` accepts, built-ins first."""
    return tuple(_registered())


@cache
def get_transport(name: str) -> Transport:
    """The transport registered as ``name`` (UnknownTransportError when there is none, or it is unusable)."""
    target = _registered().get(name)
    if target is None:
        raise UnknownTransportError(f"unknown transport {name!r}; choose from {', '.join(transport_names())}")
    builtin = name in _BUILTIN
    where = f"the built-in {target!r}" if builtin else f"entry point '{name} = {target}' ({ENTRY_POINT_GROUP!r})"
    module_name, _, attr = target.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # whatever a plugin raises, SystemExit included, is that plugin's error alone
        why = error_text(exc)
        raise UnknownTransportError(
            f"transport {name!r} is registered as {where} but cannot be loaded: {why}"
        ) from None
    problem = _problem(name, found)
    if problem:
        raise UnknownTransportError(f"transport {name!r} is registered as {where}, which {problem}")
    return found()


def _problem(name: str, cls: object) -> str:
    """Why a registered object cannot serve as transport ``name`` (empty when it can)."""
    if not (isinstance(cls, type) and issubclass(cls, Transport)):
        return f"is {cls!r}, not a harness.transports.Transport subclass"
    if getattr(cls, "name", None) != name:
        return f"names itself {getattr(cls, 'name', None)!r}"
    if cls.add_kind != zmq_link.ADD and cls.add_kind not in zmq_link.OUT_OF_BAND_ADDS:
        return f"takes envelope kind {cls.add_kind:#x}, outside the out-of-band ADD kinds {zmq_link.OUT_OF_BAND_ADDS}"
    if cls.sender_class is not None and cls.sender_class.add_kind != cls.add_kind:
        return (
            f"declares kind {cls.add_kind:#x} but its sender_class builds ADDs of kind {cls.sender_class.add_kind:#x}"
        )
    if (cls.receiver_class is None) == (cls.add_kind != zmq_link.ADD):
        return "needs a receiver_class exactly when its add_kind is an out-of-band one"
    if cls.sender_class is None and cls.receiver_class is not None:
        return "has a receiver_class but no sender_class"
    unknown = set(cls.variants) - set(VARIANTS)
    if unknown:
        return f"declares unknown variants {sorted(unknown)} (known: {sorted(VARIANTS)})"
    return ""


def loaded_transports() -> list[Transport]:
    """Every registered transport that loads (a broken plugin is named when it is chosen, not here)."""
    out = []
    for name in transport_names():
        try:
            out.append(get_transport(name))
        except UnknownTransportError:
            continue
    return out


def remove_leftovers(pid: int) -> list[str]:
    """What process ``pid``, known to be gone, left behind under any transport, removed."""
    return _remove_with_each(lambda t: t.remove_leftovers(pid), f"what process {pid} left")


def remove_stale() -> list[str]:
    """What any gone process of this user left behind under any transport, removed."""
    return _remove_with_each(lambda t: t.remove_stale(), "what gone processes left")


def _remove_with_each(remove: Callable[[Transport], list[str]], what: str) -> list[str]:
    """``remove`` run with every transport; one whose cleanup fails is logged and the others still run."""
    removed = []
    for transport in loaded_transports():
        try:
            removed += remove(transport)
        except Exception:
            log.exception("transport %s could not remove %s", transport.name, what)
    return removed


def transport_help() -> str:
    """--transport's help: each transport's summary, then what all but zmq need."""
    lines = "; ".join(f"{t.name}: {t.summary}" for t in loaded_transports())
    return f"{lines}. All but zmq need a codec with out-of-band frames and both processes on this host"
