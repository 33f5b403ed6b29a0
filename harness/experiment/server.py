"""A server child process: start it, wait until it serves, stop it.

Usually `bench serve` (this Python's, or another checkout's venv: a build arm),
ready at its ready line. Any other server command (``command``, ``{port}``
replaced by a free port) is ready when ``GET /health`` answers 200.
Used by `bench run` (one server per arm and round) and by the end-to-end tests.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import IO

from harness.processes import parent_watch

READY_LINE = re.compile(r"wirebench serving codec=\S+ on (http://\S+)")


def ready_line(codec: str, base_url: str, engine_desc: str) -> str:
    """What `bench serve` prints once it serves; READY_LINE finds the URL in it."""
    return f"wirebench serving codec={codec} on {base_url} (engine: {engine_desc})"


class ServerProcess:
    """`bench serve --port 0 --codec CODEC FLAGS` in its own process group.

    Its own session: Ctrl-C in the terminal reaches only the parent, which
    stops the server itself after saving what it has. Output is kept (and
    optionally appended to a log file) for error messages.
    """

    def __init__(
        self,
        codec: str,
        flags: list[str],
        log_path: str | None = None,
        *,
        python: str | None = None,
        command: str | None = None,
        env: dict[str, str] | None = None,
        cpus: tuple[int, ...] = (),
        after_stop: Callable[[], object] | None = None,
    ) -> None:
        self._port_url: str | None = None
        self._after_stop = after_stop  # what the server leaves behind when stopped, removed (a real SGLang's)
        if command is not None:
            port = free_port()
            cmd = shlex.split(command.replace("{port}", str(port)))
            self._port_url = f"http://127.0.0.1:{port}"
        else:
            cmd = [python or sys.executable, "-m", "harness.cli", "serve", "--codec", codec, "--port", "0", *flags]
        # The server ends itself if this process dies without stopping it (SIGKILL): see parent_watch.
        environment = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1", parent_watch.ENV: str(os.getpid())}
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment, start_new_session=True
        )
        if cpus:  # before it can start its engine: the processes it starts inherit the CPUs
            os.sched_setaffinity(self.proc.pid, cpus)
        self.lines: list[str] = []
        self.base_url: str | None = None
        # Open for the server's lifetime, closed by stop().
        self._log: IO[str] | None = open(log_path, "a") if log_path else None  # noqa: SIM115
        self._ready = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()
        if self._port_url is not None:
            threading.Thread(target=self._poll_health, daemon=True).start()

    def _poll_health(self) -> None:
        """A server of its own: ready when GET /health answers 200 (or gone when the process ends)."""
        url = f"{self._port_url}/health"
        while self.proc.poll() is None and not self._ready.is_set():
            try:
                with urllib.request.urlopen(url, timeout=2) as reply:
                    if reply.status == 200:
                        self.base_url = self._port_url
                        self._ready.set()
                        return
            except OSError:
                pass
            time.sleep(0.2)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if self._log:
                self._log.write(line)
                self._log.flush()
            match = READY_LINE.search(line) if self._port_url is None else None
            if match and self.base_url is None:
                self.base_url = match.group(1)
                self._ready.set()
        self._ready.set()  # the process ended: stop waiting

    def wait_ready(self, timeout: float) -> str:
        """The server's base URL; RuntimeError with its last output if it never got ready."""
        if not self._ready.wait(timeout) or self.base_url is None:
            self.stop()
            tail = "".join(self.lines[-5:]).strip() or f"exit code {self.proc.poll()}"
            raise RuntimeError(f"the server did not become ready: {tail}")
        return self.base_url

    def request_stop(self, sig: int = signal.SIGTERM) -> None:
        """Ask the server to stop without waiting (stop() waits)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal the server and wait; past the timeout kill its whole process group. A second Ctrl-C
        (or SIGTERM) while it stops kills the server at once and goes on up."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
                try:
                    self.proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)  # the engine too, not just the frontend
                    self.proc.wait()
                except KeyboardInterrupt:
                    # The frontend alone: its engine sees its parent gone and removes its shared memory and
                    # ipc folder itself (docs/reliability.md, "Nothing left behind").
                    self.proc.kill()
                    self.proc.wait()
                    raise
        finally:
            self._close_log()
            if self._after_stop is not None:
                after, self._after_stop = self._after_stop, None
                after()
        return self.proc.returncode

    def _close_log(self) -> None:
        if self._log:
            self._log.close()
            self._log = None


def free_port() -> int:
    """A TCP port free on loopback now (the server binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
