"""wirebench inside the real vLLM: a ``vllm.general_plugins`` entry point that swaps the serializer of
vLLM's engine link for a wirebench codec and times it in both processes.

vLLM loads its general plugins in the API-server process and in the EngineCore process before either
builds its serializers, and both build them by module-level name: ``vllm.v1.engine.core_client`` (the
request encoder, the outputs decoder) and ``vllm.v1.engine.core`` (the input thread's decoders, the
output thread's encoder). ``register`` rebinds those names to timed wrappers (``harness.vllm_plugin.coders``)
and, with the timings on, wraps the EngineCore process's methods that take a request off its input queue
and hand output batches to its output queue (``harness.vllm_plugin.queues``).

Off unless ``WIREBENCH_VLLM_CODEC`` names a codec, so a server without it is plain vLLM:

- ``WIREBENCH_VLLM_CODEC``: the codec of ``EngineCoreRequest`` and ``EngineCoreOutputs`` (``pickle``,
  ``pickle-oob``, ``msgspec``, ...); ``vllm`` keeps vLLM's own msgpack serializer and only times it.
  Every other message (aborts, utility calls) stays vLLM's.
- ``WIREBENCH_VLLM_SPANS``: the folder each process writes its timings to, one JSON Lines file a
  process (``harness.vllm_plugin.records`` says what is in it); unset: the codec is swapped, nothing is
  timed.
- ``WIREBENCH_VLLM_CPU_TIME``: ``1`` records each timed call's thread CPU time as well as its wall
  time (two more clock reads a message, ~0.8 µs here); by default only wall time.
- ``WIREBENCH_VLLM_IPC_ONLY``: ``1`` refuses any engine-link socket that is not a local ipc one (``bench
  run`` sets it with the opt-in below, so the opt-in it gives cannot reach a tcp link).

A codec that unpickles what its peer sends (``pickle``, ``pickle-oob``) is refused, one line at the
server's start, unless vLLM's own opt-in ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` is set: vLLM's decoder
refuses pickled data without it, and the plugin must not reopen that hole (``harness.wire.hook_policy``).

``bench run`` names itself in ``WIREBENCH_PARENT_PID`` (``harness.processes.parent_watch``): the API
server it started then ends when it does, even when it is killed outright, and vLLM's own clean stop ends
the engine.

A vLLM whose modules do not have the names the plugin rebinds and reads (``harness.vllm_plugin.layout``)
is refused the same way, in one line naming what is missing and the vLLM version.

Nothing here imports vLLM until ``register`` runs inside vLLM.

Its modules, each with its job: docs/architecture.md (Packages, bottom-up).
"""

from __future__ import annotations

import os

ENV_CODEC = "WIREBENCH_VLLM_CODEC"
ENV_SPANS = "WIREBENCH_VLLM_SPANS"
ENV_CPU_TIME = "WIREBENCH_VLLM_CPU_TIME"
ENV_IPC_ONLY = "WIREBENCH_VLLM_IPC_ONLY"
# The codec name that keeps vLLM's own serializer inside the server (only timed): it needs no wirebench
# codec of that name, nor vLLM in the venv that drives the run.
OWN_CODEC = "vllm"


def register() -> None:
    """The entry point vLLM calls in each of its processes (more than once: idempotent)."""
    from harness.processes.parent_watch import die_with_parent

    # The first process to load the plugin is the API server bench run started; the variable is popped
    # there, before vLLM spawns its engine, so only that process watches bench run.
    die_with_parent("wirebench plugin")
    codec = os.environ.get(ENV_CODEC, "").strip()
    if not codec:
        return
    from harness.vllm_plugin.coders import install

    install(
        codec,
        os.environ.get(ENV_SPANS) or None,
        cpu_time=os.environ.get(ENV_CPU_TIME, "") == "1",
        ipc_only=os.environ.get(ENV_IPC_ONLY, "") == "1",
    )
