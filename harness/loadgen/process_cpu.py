"""CPU time of the processes one run involves: the client (this process and its load workers),
the server's frontend and its engine. A client or frontend that used about a whole core may
have limited the run, whatever its latency figures say (the engine, busy whenever any request
runs, is reported but not judged so).

The server's processes are read from ``/proc/PID/stat`` (utime + stime of all their threads, in
clock ticks of 10 ms: a run of a few seconds reads to ~1%; Linux only, elsewhere they read 0);
the client's from ``os.times()``, its ended load workers included (Ray's remote workers are not).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A client or frontend using this share of one core or more ran out of CPU: its own work, not the
# engine, may have set the pace (a Python process runs its own code on one core, whatever its
# threads). The engine is not judged so: it steps whenever any request runs, so under load it is
# busy all the time by design, as a GPU is (on the CPU executor its forward passes are the work).
SATURATED_CORES = 0.9
JUDGED = ("client", "frontend", "detokenizer")
# A real SGLang's DetokenizerManager (its title, as the process sets it): a role of its own, between the
# engine and the frontend, and as able as they are to run out of its one core.
DETOKENIZER_TITLE = b"sglang::detokenizer"
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def _stat_fields(pid: int) -> list[str] | None:
    try:
        # The name (field 2) may hold spaces and parentheses: split after its closing one.
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far (0 when it is gone)."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) * _TICK_S if fields else 0.0


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat_fields(int(stat.parent.name))
        if fields:
            parents[int(stat.parent.name)] = int(fields[1])
    found: list[int] = []
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found += sorted(frontier)
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def server_roles(server_pid: int) -> dict[str, list[int]]:
    """{"frontend": [the server process], "engine": every process below it}: bench serve's spawned
    engine, a real vLLM's EngineCore and its workers, a real SGLang's scheduler, any other server
    command's children; a real SGLang's detokenizer as "detokenizer". multiprocessing's helper (its
    resource tracker) counts as none."""
    below = [p for p in descendants(server_pid) if b"resource_tracker" not in _cmdline(p)]
    detokenizer = [p for p in below if _cmdline(p).startswith(DETOKENIZER_TITLE)]
    roles = {"frontend": [server_pid], "engine": [p for p in below if p not in detokenizer]}
    return roles | ({"detokenizer": detokenizer} if detokenizer else {})


def resident_bytes(pids: list[int]) -> int:
    """Resident memory of these processes together, now (VmRSS; a process gone counts 0)."""
    total = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total


def client_seconds() -> float:
    """CPU seconds of this process and of its children that have ended and been waited for: load
    workers (``--workers``) end within the run; a server is waited for only when it stops, after."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@dataclass(frozen=True)
class Snapshot:
    at: float  # time.monotonic()
    seconds: dict[str, float]  # role -> CPU seconds of its processes so far


def snapshot(servers: dict[str, list[int]]) -> Snapshot:
    """The client's CPU seconds and each server role's (``server_roles``), now."""
    seconds = {"client": client_seconds()}
    seconds |= {role: sum(cpu_seconds(p) for p in pids) for role, pids in servers.items()}
    return Snapshot(time.monotonic(), seconds)


def usage(
    before: Snapshot, after: Snapshot, requests: int, output_tokens: int, client_share: tuple[int, int] | None = None
) -> dict[str, Any]:
    """Per role between two snapshots: CPU seconds, cores (CPU s / wall s), ms per request and per
    output token; and the busier of client and frontend, "saturated" when it used SATURATED_CORES
    of a core or more.
    ``client_share``: (requests, output tokens) the client served in the same time, when it served
    other servers too (arms in blocks); by default those of this server."""
    wall = after.at - before.at
    roles: dict[str, Any] = {}
    for role, cpu_after in after.seconds.items():
        cpu = max(0.0, cpu_after - before.seconds.get(role, 0.0))
        n, tokens = client_share if role == "client" and client_share is not None else (requests, output_tokens)
        roles[role] = {
            "cpu_s": round(cpu, 3),
            "cores": round(cpu / wall, 3) if wall > 0 else None,
            "ms_per_request": round(1000 * cpu / n, 3) if n else None,
            "us_per_output_token": round(1e6 * cpu / tokens, 1) if tokens else None,
        }
    judged = [r for r in roles if r in JUDGED]
    busiest = max(judged, key=lambda r: roles[r]["cores"] or 0.0) if judged else None
    saturated = busiest is not None and (roles[busiest]["cores"] or 0.0) >= SATURATED_CORES
    return {"wall_s": round(wall, 3), "roles": roles, "busiest": busiest, "saturated": saturated}


def format_lines(cpu: dict[str, Any] | None) -> list[str]:
    """The report's lines for one run's process CPU ([] when not measured)."""
    if not cpu:
        return []
    lines = [f"{'Process CPU':-^50}"]
    for role, r in cpu["roles"].items():
        cores = "n/a" if r["cores"] is None else f"{r['cores']:.2f}"
        per_req = "n/a" if r["ms_per_request"] is None else f"{r['ms_per_request']:.2f}"
        per_tok = "n/a" if r["us_per_output_token"] is None else f"{r['us_per_output_token']:.0f}"
        lines.append(f"{role + ':':<10} {cores} cores, {per_req} ms CPU/request, {per_tok} µs CPU/output token")
    if cpu["saturated"]:
        lines.append(
            f"Out of CPU: the {cpu['busiest']} (≥ {SATURATED_CORES:g} of a core): its own work may have set "
            "this run's pace"
        )
    return lines
