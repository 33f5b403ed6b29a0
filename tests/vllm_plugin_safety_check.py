"""Run by tests/test_vllm_plugin_safety.py with vLLM's venv's Python: the plugin holds vLLM's own rule on
unpickling peer data.

    .venv-vllm/bin/python tests/vllm_plugin_safety_check.py FOLDER

Exits 0 and prints "checked" when every assertion held.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
from pathlib import Path


class Payload:
    """What a hostile peer sends: unpickling it creates a file (instead of running a shell)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (open, (self.marker, "w"))


def main(folder: str) -> int:
    import vllm.v1.engine.core as core
    import vllm.v1.engine.core_client as core_client
    import zmq
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.serial_utils import MsgpackDecoder

    from harness.vllm_plugin.coders import install

    marker = Path(folder) / "ran"
    hostile = pickle.dumps(Payload(str(marker)))
    # Without vLLM's opt-in a codec that unpickles is refused, in one line, and vLLM keeps its own decoder.
    os.environ.pop("VLLM_ALLOW_INSECURE_SERIALIZATION", None)
    try:
        install("pickle", folder)
    except SystemExit as exc:
        line = str(exc.code)
        assert line.startswith("wirebench plugin: refusing codec 'pickle' inside vLLM") and "\n" not in line, line
        assert "VLLM_ALLOW_INSECURE_SERIALIZATION=1" in line, line
    else:
        raise AssertionError("the plugin installed pickle without vLLM's opt-in")
    assert core.MsgpackDecoder is MsgpackDecoder and core_client.MsgpackDecoder is MsgpackDecoder
    with contextlib.suppress(Exception):  # vLLM's decoder refuses bytes that are not its msgpack
        core.MsgpackDecoder(EngineCoreRequest).decode(hostile)
    assert not marker.exists(), "a peer's pickle ran in the engine's decoder"
    # With the opt-in, as bench run gives it: installed, and every engine-link socket held to ipc.
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    install("pickle", folder, ipc_only=True)
    assert core.MsgpackDecoder is not MsgpackDecoder
    ctx: zmq.Context = zmq.Context()
    for module in (core, core_client):
        try:
            module.make_zmq_socket(ctx, "tcp://127.0.0.1:0", zmq.PULL)
        except RuntimeError as exc:
            assert "refusing engine link tcp://127.0.0.1:0 with codec 'pickle'" in str(exc), exc
        else:
            raise AssertionError(f"{module.__name__} opened a tcp engine link for pickle")
        module.make_zmq_socket(ctx, f"ipc://{folder}/link-{module.__name__}", zmq.PULL, linger=0).close()
    ctx.term()
    print("checked")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
