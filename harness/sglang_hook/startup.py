"""Run at every start of ``.venv-sglang``'s Python, by the ``.pth`` line scripts/setup_sglang_cpu.sh writes.

Puts the CPU stand-ins' import hook in place (inert until SGLang imports ``sgl_kernel`` or torchvision) and,
only with ``WIREBENCH_SGLANG_SPANS=DIR``, the timing of SGLang's inter-process messages. A failure here
is said in one line on stderr and the interpreter goes on: a ``.pth`` line must never stop Python.
"""

from __future__ import annotations

import os
import sys

SPANS_ENV = "WIREBENCH_SGLANG_SPANS"


def main() -> None:
    from harness.processes import parent_watch
    from harness.sglang_hook import cpu_standins

    # The server bench run started (the variable is popped, so SGLang's own processes, which end with it,
    # do not watch): it ends when bench run dies without stopping it.
    parent_watch.die_with_parent("wirebench sglang hook")

    cpu_standins.install()
    folder = os.environ.get(SPANS_ENV)
    if folder:
        from harness.sglang_hook import spans

        spans.install(folder)


try:
    main()
except SystemExit as exc:  # the parent bench run is already gone: end here, without a traceback at start-up
    print(f"wirebench sglang hook: {exc}", file=sys.stderr, flush=True)
    os._exit(1)
except Exception as exc:  # noqa: BLE001 - a start-up hook reports and lets Python start
    print(f"wirebench sglang hook: not installed in this process: {exc!r}", file=sys.stderr, flush=True)
