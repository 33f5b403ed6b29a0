"""A child that must not outlive the command that started it.

`bench run`, `bench sweep` and `bench calibrate` start `bench serve` in its own
session (so Ctrl-C reaches only the parent, which stops the server in order).
If the parent is killed outright (SIGKILL, the OOM killer), nothing stops the
server: it would keep its port, its engine and its shared memory. So the parent
names itself in ``WIREBENCH_PARENT_PID`` and the server asks Linux to send it
SIGTERM when that parent dies (``prctl(PR_SET_PDEATHSIG)``), which runs its
ordinary clean stop. Elsewhere (no prctl) this is a no-op.

And a command's own SIGTERM is turned into a SIGINT, so ``kill PID`` stops it
the way Ctrl-C does, through whichever SIGINT handler is current (asyncio's
cancels the run's task; Python's raises KeyboardInterrupt): servers stopped,
what was measured saved.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

ENV = "WIREBENCH_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent(who: str = "bench serve") -> None:
    """SIGTERM this process when the parent named in ``ENV`` dies; exit now if it already has."""
    named = os.environ.pop(ENV, None)  # popped: the engine process this server spawns watches its own parent
    if not named or not sys.platform.startswith("linux"):
        return
    import ctypes  # here: a start-up hook imports this module in every Python of a server's venv

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != int(named):  # it died before the prctl: no signal will come
        raise SystemExit(f"{who}: the parent process {named} is gone")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    signal.raise_signal(signal.SIGINT)


def terminate_as_interrupt() -> None:
    """SIGTERM takes the command's Ctrl-C path.

    A command a shell without job control started in the background inherits SIGINT ignored, and
    Python then leaves it so: the SIGTERM raised as SIGINT would be lost and ``kill PID`` would not
    stop the run. Python's own SIGINT handler is put back in that case."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
