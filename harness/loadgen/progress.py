"""The progress line on stderr while a load runs, drawn by tqdm.

tqdm (what vLLM's benchmark uses) gives the bar, the count, the elapsed time and
the achieved rate; we add the failures and the client's schedule lag (how late
the latest requests left against the plan: a client falling behind shows here
before it shows in the report). Off unless ``enabled``, or None and the stream is
a TTY, so logs and CI output stay clean.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import TextIO

from tqdm import tqdm

# Schedule lag shown: the mean over this many latest requests.
LAG_WINDOW = 50


class Progress:
    def __init__(
        self,
        total: int,
        *,
        enabled: bool | None = None,
        stream: TextIO | None = None,
        label: str = "requests",
        interval_s: float = 0.1,
    ) -> None:
        stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = bool(getattr(stream, "isatty", lambda: False)())
        self.enabled = enabled
        self.completed = 0
        self.failed = 0
        self._lags_ms: deque[float] = deque(maxlen=LAG_WINDOW)
        self._bar = tqdm(
            total=total,
            desc=label,
            unit="req",
            file=stream,
            disable=not enabled,
            mininterval=interval_s,
            dynamic_ncols=True,
        )

    def update(self, success: bool, lag_ms: float | None = None) -> None:
        """One request finished; ``lag_ms``: how late it was sent against its planned time."""
        if success:
            self.completed += 1
        else:
            self.failed += 1
        if not self.enabled:
            return
        if lag_ms is not None:
            self._lags_ms.append(lag_ms)
        postfix = f"{self.failed} failed"
        if self._lags_ms:
            postfix += f", lag {sum(self._lags_ms) / len(self._lags_ms):.1f} ms"
        self._bar.set_postfix_str(postfix, refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()
