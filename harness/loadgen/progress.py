"""A one-line progress bar on stderr, redrawn in place; no dependency."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``done/total (failed) elapsed`` redrawn at most every ``interval_s``.

    Disabled unless ``enabled`` is True, or None and the stream is a TTY.
    """

    def __init__(
        self,
        total: int,
        *,
        enabled: bool | None = None,
        stream: TextIO | None = None,
        label: str = "requests",
        interval_s: float = 0.1,
        width: int = 30,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = enabled
        self.total = total
        self.label = label
        self.interval_s = interval_s
        self.width = width
        self.completed = 0
        self.failed = 0
        self._start = time.perf_counter()
        self._last_draw = -float("inf")

    def update(self, success: bool) -> None:
        if success:
            self.completed += 1
        else:
            self.failed += 1
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last_draw >= self.interval_s or self.completed + self.failed >= self.total:
            self._draw(now)

    def line(self, now: float | None = None) -> str:
        now = time.perf_counter() if now is None else now
        done = self.completed + self.failed
        filled = int(self.width * done / self.total) if self.total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        failed = f" {self.failed} failed" if self.failed else ""
        return f"[{bar}] {done}/{self.total} {self.label}{failed} {now - self._start:6.1f}s"

    def _draw(self, now: float) -> None:
        self._last_draw = now
        self.stream.write("\r" + self.line(now))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.perf_counter())
            self.stream.write("\n")
            self.stream.flush()
