"""Sizes checked at start against what this machine reports, so none is found too big only when it fills.

A shared-memory segment is a sparse file under ``/dev/shm``: created at any size, it fails only when a
write finds no page left (SIGBUS), and every page it holds is memory too. A process's own allocations
(an engine's weights and KV cache on the CPU) fail the same way, as an out-of-memory kill. So each such
size (a ``SizeAsk``) is compared, before anything is allocated, with what the machine has room for
(``MachineRoom``): ``/dev/shm``'s free space for shared memory, and for any memory the kernel's
``MemAvailable`` and, where the process runs in a cgroup with a ``memory.max``, what that limit leaves.
A size beyond the tightest of them is refused in one line that names the flag, the size, the limit and
the most that fits.

The transports' sizes: which ``SenderSettings`` field a transport makes shared memory of at start, and
the flag that sets it (``SHARED_SIZES``; a test keeps it equal to what each sender creates).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from harness.transports.base import SenderSettings

SHM_DIR = Path("/dev/shm")
MEMINFO = Path("/proc/meminfo")
CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")

MIB = 1 << 20
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


@dataclass(frozen=True)
class TransportSize:
    """The size a transport's sender allocates in /dev/shm: its SenderSettings field, flag and unit."""

    field: str
    flag: str
    unit: int = 1  # bytes per unit of the flag's value


SHARED_SIZES: dict[str, TransportSize] = {
    "shm": TransportSize("arena_bytes", "--shm-size", MIB),  # the arena (harness.transports.shm)
    "shm-store": TransportSize("store_bytes", "--mm-store-bytes"),  # the store's arena (shm_store)
}


@dataclass(frozen=True)
class Room:
    """One limit the machine reports: what it is, as a refusal says it, and its bytes."""

    what: str
    nbytes: int


@dataclass(frozen=True)
class MachineRoom:
    """What the machine has room for now; a limit it does not report is absent."""

    shm_free: Room | None
    memory: tuple[Room, ...]  # MemAvailable, then what each cgroup's memory.max leaves

    def rooms(self, shared: bool) -> list[Room]:
        """Shared memory takes /dev/shm's space and memory both; a process's own takes memory."""
        return [*([self.shm_free] if shared and self.shm_free else []), *self.memory]


@dataclass(frozen=True)
class SizeAsk:
    """A size a setting makes into memory at start: ``value`` units of ``unit`` bytes, beside ``fixed``
    bytes that come with it (an engine's weights beside its KV cache)."""

    flag: str
    value: int
    unit: int = 1
    shared: bool = True  # under /dev/shm; False: the process's own memory
    fixed: int = 0
    what: str = ""  # said after the bytes: what they hold beyond the flag's own (" with the weights")
    fixed_advice: str = "free some memory first"  # when ``fixed`` alone leaves no room for one unit

    @property
    def nbytes(self) -> int:
        return self.fixed + self.value * self.unit


def human(nbytes: int) -> str:
    """``nbytes`` in binary units with one decimal: 1.0 TiB, 23.5 GiB."""
    size = float(nbytes)
    for unit in _UNITS:
        if abs(size) < 1024 or unit == _UNITS[-1]:
            return f"{size:.1f} {unit}" if unit != "B" else f"{nbytes} B"
        size /= 1024
    raise AssertionError("unreachable")


def shared_memory_asks(transport: str, settings: SenderSettings) -> list[SizeAsk]:
    """The shared memory ``transport``'s sender allocates at start, by ``settings`` (none for most)."""
    size = SHARED_SIZES.get(transport)
    if size is None:
        return []
    return [SizeAsk(size.flag, getattr(settings, size.field) // size.unit, size.unit, shared=True)]


def refusal(ask: SizeAsk, machine: MachineRoom) -> str | None:
    """Why ``ask`` cannot be had on ``machine`` (one line), or None when it fits every limit it reports."""
    if ask.value < 1:
        return f"{ask.flag} must be at least 1, got {ask.value}"
    rooms = machine.rooms(ask.shared)
    if not rooms:
        return None
    tightest = min(rooms, key=lambda room: room.nbytes)
    if ask.nbytes <= tightest.nbytes:
        return None
    most = max(tightest.nbytes - ask.fixed, 0) // ask.unit
    advice = f"choose at most {ask.flag} {most}" if most >= 1 else ask.fixed_advice
    return (
        f"{ask.flag} {ask.value} ({human(ask.nbytes)}{ask.what}) is more than {tightest.what} "
        f"({human(tightest.nbytes)}); {advice}"
    )


def first_refusal(asks: list[SizeAsk], machine: MachineRoom | None = None) -> str | None:
    """The first of ``asks`` the machine (by default, as read now) has no room for, or None."""
    if not asks:
        return None
    machine = machine or read_machine()
    return next((line for ask in asks if (line := refusal(ask, machine))), None)


# -- reading the machine -------------------------------------------------------------------------


def read_machine(
    shm_dir: Path = SHM_DIR, meminfo: Path = MEMINFO, cgroup_root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP
) -> MachineRoom:
    """What this machine reports now (paths are parameters so a test can stand in for them)."""
    available = mem_available(meminfo)
    memory = [Room(f"{meminfo}'s MemAvailable", available)] if available is not None else []
    memory += cgroup_rooms(cgroup_root, self_cgroup)
    return MachineRoom(shm_free(shm_dir), tuple(memory))


def shm_free(shm_dir: Path) -> Room | None:
    """The bytes an unprivileged process may still write under ``shm_dir`` (None: no such file system)."""
    try:
        st = os.statvfs(shm_dir)
    except OSError:
        return None
    return Room(f"{shm_dir} has free", st.f_bavail * st.f_frsize)


def mem_available(meminfo: Path) -> int | None:
    """The kernel's estimate of memory a new allocation can get without swapping (``MemAvailable``)."""
    try:
        lines = meminfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, rest = line.partition(":")
        if name == "MemAvailable":
            words = rest.split()
            return int(words[0]) * (1024 if words[1:] == ["kB"] else 1)
    return None


def cgroup_rooms(cgroup_root: Path, self_cgroup: Path) -> list[Room]:
    """What the ``memory.max`` of this process's cgroup v2, and of each above it, leaves free."""
    rooms = []
    for folder in _cgroup_folders(cgroup_root, self_cgroup):
        limit = _read_int(folder / "memory.max")  # "max" (no limit) reads as None
        used = _read_int(folder / "memory.current")
        if limit is None or used is None:
            continue
        # The cgroup's page cache that is not in use comes back when it is needed.
        reclaimable = _memory_stat(folder / "memory.stat").get("inactive_file", 0)
        free = max(limit - used + reclaimable, 0)
        rooms.append(Room(f"the cgroup's memory.max of {human(limit)} leaves", free))
    return rooms


def _cgroup_folders(cgroup_root: Path, self_cgroup: Path) -> list[Path]:
    """This process's cgroup v2 folder and its parents up to the root (only the root when it is not found)."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    path = next((line[3:] for line in lines if line.startswith("0::")), "/")
    folder = cgroup_root / path.strip("/")
    if not folder.is_dir():  # a cgroup namespace's path that this mount does not show
        folder = cgroup_root
    folders = [folder]
    while folder != cgroup_root and cgroup_root in folder.parents:
        folder = folder.parent
        folders.append(folder)
    return folders


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _memory_stat(path: Path) -> dict[str, int]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[name] = int(value)
    return out
