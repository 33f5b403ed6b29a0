"""wirebench's start-up hook inside SGLang's own venv (``.venv-sglang``, scripts/setup_sglang_cpu.sh).

SGLang has no plugin entry point, so that venv carries a ``.pth`` line importing :mod:`.startup` at every
interpreter start; it reaches SGLang's three processes (the HTTP server with its TokenizerManager, the
Scheduler, the DetokenizerManager). There it stands in, loudly and only where proven unused, for what
SGLang's CPU path imports but the CPU lacks (the CUDA-only ``sgl_kernel``, the C operators of a CUDA
torchvision); with ``WIREBENCH_SGLANG_SPANS=DIR`` each process also times ``io_struct.sock_send`` /
``sock_recv`` (and the async forms) per message.

Importing this package does nothing; the hook keeps interpreter start cheap (no torch, no SGLang imported).
docs/sglang.md says how it is installed and why each stand-in is safe.

Its modules, each with its job: docs/architecture.md (Packages, bottom-up).
"""

from pathlib import Path

# Where scripts/setup_sglang_cpu.sh makes SGLang's venv, whose Python bench run and bench micro start.
VENV = Path(__file__).resolve().parents[2] / ".venv-sglang"
PYTHON = VENV / "bin" / "python"
