"""``bench run --server sglang``: each arm served by a real SGLang in one of its own IPC modes, every hop
between its three processes timed by wirebench's start-up hook (``harness.sglang_hook``).

An arm's codec names SGLang's own serializer between its processes: ``pickle`` (SGLang's default,
``send_pyobj``) or ``msgspec`` (its msgpack of ``msgspec.Struct`` messages, ``SGLANG_USE_PICKLE_IPC=0``).
wirebench's codecs are not swapped in at SGLang's hops: its messages are SGLang's own types, which no
wirebench codec knows. Each arm's SGLang writes its timings to a folder of its own
(``WIREBENCH_SGLANG_SPANS``), which the load reads back as the run's codec figures and IPC budget
(``harness.loadgen.sglang_spans``). SGLang runs from a venv of its own (``scripts/setup.sh
--with-sglang-cpu`` makes ``.venv-sglang``), on a model folder made offline with the run's tokenizer
unless ``--sglang-model`` names one. docs/sglang.md has the whole story.
"""

from __future__ import annotations

import os
import shlex
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from harness import sglang_hook
from harness.experiment.vllm_server import check_python, make_model
from harness.settings.declare import setting

MODELS = sglang_hook.VENV / "wirebench-models"
SPANS_ENV = "WIREBENCH_SGLANG_SPANS"  # harness.sglang_hook.startup reads it
MODE_ENV = "SGLANG_USE_PICKLE_IPC"
# An arm's codec → SGLANG_USE_PICKLE_IPC, the switch SGLang's io_struct reads once at import.
MODES = {"pickle": "1", "msgspec": "0"}
# On the CPU (docs/sglang.md): SGLang's CPU engine, torch's own attention (SGLang's other backends need
# CUDA kernels), a KV pool of tens of MB instead of a share of the host's memory. --sleep-on-idle: an idle
# scheduler otherwise polls its sockets in a loop at a whole core, which on a few cores takes one from
# every other server kept up for the run and from the client; with it the scheduler waits in zmq's poll,
# woken by the first message, as measured here (idle 100% → ~7% of a core).
CPU_ARGS = ("--device", "cpu", "--attention-backend", "torch_native", "--max-total-tokens", "8192", "--sleep-on-idle")
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1"}
# What bench run sets itself: given in --sglang-args or an arm's flags they would override it.
OWN_FLAGS = ("--model-path", "--served-model-name", "--port", "--host", "--context-length")
# What a round leaves behind that would make the next one's identical prompts cheaper: the radix cache.
FLUSH_PATH = "/flush_cache"
# SGLang's load-snapshot files (/dev/shm/sglang_loads_*.shm): its processes, stopped by a signal, leave
# them; ours are removed after the server stops (``remove_leftovers``).
SHM_DIR = Path("/dev/shm")
SHM_PATTERN = "sglang_loads_*"


@dataclass(frozen=True)
class SglangServer:
    """How bench run starts a real SGLang for each arm."""

    python: str = setting(
        str(sglang_hook.PYTHON),
        flag="--sglang-python",
        metavar="PATH",
        help="the Python of a venv with SGLang and wirebench (pip install -e . --no-deps, and the hook's .pth "
        "line: docs/sglang.md) installed: your own SGLang on a GPU host, or .venv-sglang from scripts/setup.sh "
        "--with-sglang-cpu (default)",
    )
    model: str | None = setting(
        None,
        flag="--sglang-model",
        metavar="PATH|ID",
        help="the model SGLang serves (default: a tiny Llama-shaped model with random weights made offline for "
        "the run's tokenizer)",
        comparable=True,
    )
    device: str = setting(
        "cpu",
        flag="--sglang-device",
        choices=("cpu", "gpu"),
        help=f"cpu adds SGLang's CPU settings ({' '.join(f'{k}={v}' for k, v in CPU_ENV.items())} "
        f"{' '.join(CPU_ARGS)}); gpu adds none (default %(default)s)",
        comparable=True,
    )
    args: str = setting(
        "",
        flag="--sglang-args",
        metavar="FLAGS",
        help="SGLang server flags for every arm, after the device's (one arm's: --arm-flags LABEL=FLAGS)",
        comparable=True,
    )
    env: str = setting(
        "",
        flag="--sglang-env",
        metavar="K=V ...",
        help="environment variables for every arm's SGLang (one arm's: --arm-flags 'LABEL=NAME=value ...')",
        comparable=True,
    )

    def check(self) -> None:
        """Refuse a missing SGLang, or bad --sglang-env words, before any server starts."""
        check_python(self.python, "--server sglang", "--with-sglang-cpu", "SGLang")
        for pair in shlex.split(self.env):
            if "=" not in pair:
                raise ValueError(f"--sglang-env: expected K=V words, got {pair!r}")
            if pair.split("=", 1)[0] == MODE_ENV:
                raise ValueError(f"--sglang-env: {MODE_ENV} is each arm's codec (pickle or msgspec)")
        check_flags(shlex.split(self.args), "--sglang-args")

    def model_path(self, tokenizer: str | None) -> str:
        """--sglang-model, or the made tiny model of the run's tokenizer (made here the first time)."""
        return self.model or make_model(self.python, MODELS, "tiny", tokenizer, "--server sglang")

    def command(
        self, model: str, served_model: str, max_model_len: int, arm_flags: tuple[str, ...], python: str | None = None
    ) -> str:
        """The server command of one arm, ``{port}`` for ServerProcess to fill in; ``python``: the arm's own
        SGLang (``--arm NAME='--python PATH'``), else --sglang-python."""
        words = [python or self.python, "-m", "sglang.launch_server", "--model-path", model]
        words += ["--served-model-name", served_model, "--port", "{port}", "--host", "127.0.0.1"]
        words += ["--context-length", str(max_model_len)]
        words += [*(CPU_ARGS if self.device == "cpu" else ()), *shlex.split(self.args), *arm_flags]
        return shlex.join(words)

    def environment(self, codec: str, spans: str, arm_env: dict[str, str] | None = None) -> dict[str, str]:
        """The arm's environment: its IPC mode, the hook's timings to ``spans``; ``arm_env`` is the arm's own
        (leading ``K=V`` words of its --arm-flags), over --sglang-env's."""
        given = dict(pair.split("=", 1) for pair in shlex.split(self.env))
        device = CPU_ENV if self.device == "cpu" else {}
        return {**device, **given, **(arm_env or {}), MODE_ENV: MODES[codec], SPANS_ENV: spans}


def check_flags(words: list[str], whose: str) -> None:
    """Refuse SGLang flags that bench run sets itself (the model, its name, the port, the context)."""
    taken = [w.split("=", 1)[0] for w in words if w.split("=", 1)[0] in OWN_FLAGS]
    if taken:
        raise ValueError(f"{whose}: {', '.join(taken)}: bench run sets it (--max-model-len, --served-model-name)")


def check_arm_env(env: dict[str, str], label: str) -> None:
    """Refuse an arm's environment that sets the IPC mode its codec names."""
    if MODE_ENV in env:
        raise ValueError(f"--arm-flags {label}: {MODE_ENV} is the arm's codec (pickle or msgspec), not a variable")


def flush_cache(base_url: str, wait_s: float = 10.0) -> str | None:
    """Empty a kept SGLang's radix cache between rounds; None, or why not (the round then runs on it warm).
    SGLang answers 200 once flushed, 400 when it could not (requests still running past ``wait_s``)."""
    request = urllib.request.Request(f"{base_url}{FLUSH_PATH}?timeout={wait_s:g}", data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=wait_s + 30):
            return None
    except OSError as exc:
        return f"POST {FLUSH_PATH}: {exc}"


def shm_files() -> set[Path]:
    """SGLang's load-snapshot files in /dev/shm now."""
    return set(SHM_DIR.glob(SHM_PATTERN)) if SHM_DIR.is_dir() else set()


def left_behind(before: set[Path]) -> list[Path]:
    """The load-snapshot files that appeared since ``before`` and no live process maps or holds open: a
    stopped server's (another SGLang running meanwhile keeps its own, which it holds)."""
    new = shm_files() - before
    held = _held_paths() if new else set()
    return [path for path in sorted(new) if str(path) not in held]


def remove_leftovers(before: set[Path]) -> list[Path]:
    """Removes what :func:`left_behind` names; returns those removed."""
    removed = []
    for path in left_behind(before):
        try:
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


def _held_paths() -> set[str]:
    """Every /dev/shm path some live process maps or has open (the ones we may read)."""
    held: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for line in (proc / "maps").read_text().splitlines():
                path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
                if path.startswith(str(SHM_DIR)):
                    held.add(path)
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith(str(SHM_DIR)):
                    held.add(target)
        except OSError:
            continue
    return held
