"""Progress while a workload is built, before any clock starts.

A build can take a while: a random-mm workload's images take seconds per ten of them on a small
machine, and long random prompts are drawn and counted by the tokenizer a batch at a time. Inside
``building``, each long step draws a tqdm bar on stderr when stderr is a terminal (as the load's own
bar does, ``harness.loadgen.progress``); elsewhere one line says what is being built, once the build
has taken more than a moment, so logs stay clean and a slow start is not mistaken for a hang.
Outside ``building`` (tests, scripts) the bars are off.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TextIO

from tqdm import tqdm

# A build (or a step of it) shorter than this shows nothing.
MOMENT_S = 1.0

# Where the bars of the build under way go; None: no bars.
_bars_to: ContextVar[TextIO | None] = ContextVar("workload_bars_to", default=None)


@contextmanager
def building(num_prompts: int, dataset: str, stream: TextIO | None = None, after_s: float = MOMENT_S) -> Iterator[None]:
    """While the block runs, its steps' bars on ``stream`` (stderr) if it is a terminal, else one line
    naming the workload if the block is still running after ``after_s``."""
    out = stream if stream is not None else sys.stderr
    on_terminal = bool(getattr(out, "isatty", lambda: False)())
    token = _bars_to.set(out if on_terminal else None)
    note = None
    if not on_terminal:
        line = f"building the workload: {num_prompts} prompts ({dataset}) ..."
        note = threading.Timer(after_s, lambda: print(line, file=out, flush=True))
        note.daemon = True
        note.start()
    try:
        yield
    finally:
        _bars_to.reset(token)
        if note is not None:
            note.cancel()


def bar(total: int, what: str, unit: str) -> tqdm:
    """A bar for one step of the build (``update(n)`` as it goes; a context manager), drawn only inside
    ``building`` on a terminal and only once the step has taken more than a moment."""
    out = _bars_to.get()
    return tqdm(
        total=total,
        desc=what,
        unit=unit,
        file=out,
        disable=out is None,
        delay=MOMENT_S,
        leave=False,  # the bar goes once the step is done: the run's own lines follow
        dynamic_ncols=True,
    )
