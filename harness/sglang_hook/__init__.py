"""wirebench's start-up hook inside SGLang's own venv (``.venv-sglang``, scripts/setup_sglang_cpu.sh).

SGLang has no plugin entry point, so that venv carries a ``.pth`` line importing :mod:`.startup` at every
interpreter start; it reaches SGLang's three processes (the HTTP server with its TokenizerManager, the
Scheduler, the DetokenizerManager). Its parts:

- :mod:`.cpu_standins`: what SGLang's CPU path imports but the CPU lacks (the CUDA-only ``sgl_kernel``,
  the C operators of a CUDA torchvision), stood in for loudly and only where proven unused;
- :mod:`.spans`: with ``WIREBENCH_SGLANG_SPANS=DIR``, each process times ``io_struct.sock_send`` /
  ``sock_recv`` (and the async forms) per message, records in :mod:`.records`' format.

Importing this package does nothing; the hook keeps interpreter start cheap (no torch, no SGLang imported).
docs/sglang.md says how it is installed and why each stand-in is safe.
"""
