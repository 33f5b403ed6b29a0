"""Start and stop a real `bench serve` process for end-to-end tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

READY_LINE = re.compile(r"wirebench serving codec=(\S+) on (http://\S+)")


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc, no psutil needed)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def ipc_dirs() -> set[str]:
    import tempfile

    return {p.name for p in Path(tempfile.gettempdir()).glob("wirebench-*")}


@dataclass
class ServeProcess:
    proc: subprocess.Popen
    base_url: str
    output: list[str] = field(default_factory=list)

    @property
    def child_pids(self) -> list[int]:
        return child_pids(self.proc.pid)

    @property
    def engine_pid(self) -> int:
        """The spawned engine (other children, e.g. multiprocessing's resource tracker, aside)."""
        (pid,) = [p for p in self.child_pids if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
        return pid

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def start_serve(*flags: str, timeout: float = 90.0) -> ServeProcess:
    """Run `bench serve --port 0 FLAGS` and wait for its ready line."""
    cmd = [sys.executable, "-m", "harness.cli", "serve", "--port", "0", *flags]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    found: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            match = READY_LINE.search(line)
            if match and not found:
                found.append(match.group(2))

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not found:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError("bench serve did not become ready:\n" + "".join(lines))
        time.sleep(0.05)
    return ServeProcess(proc, found[0], lines)
