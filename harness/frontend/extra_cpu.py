"""A heavier API server, modelled: CPU time the frontend's event loop spends on each output token
on top of its own work (``--frontend-cpu-us-per-token``).

vLLM 0.6.4's V1 detokenized each step's outputs and built each streamed chunk in the API
server's one event loop; ours does less per token. This puts the difference back as plain CPU
work, so a run can ask what such a server's loop does to TTFT and ITL under load.
"""

from __future__ import annotations

import time


def spend_cpu(us: float) -> None:
    """Keep this thread busy until it has used ``us`` microseconds of its own CPU time.

    CPU time, not wall time: like real work it blocks the loop meanwhile and takes longer in
    wall time when the core is shared.
    """
    if us <= 0:
        return
    end = time.thread_time_ns() + int(us * 1000)
    while time.thread_time_ns() < end:
        pass
