"""Run by tests/test_vllm_server.py with vLLM's venv's Python: the plugin's coders on vLLM's own messages.

    .venv-vllm/bin/python tests/vllm_plugin_check.py CODEC FOLDER

Exits 0 and prints "checked" when every assertion held.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def main(codec: str, folder: str) -> int:
    import vllm.v1.engine.core as core
    import vllm.v1.engine.core_client as core_client
    from vllm import SamplingParams
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, UtilityOutput

    from harness.processes.jsonl_records import read_rows
    from harness.vllm_plugin.coders import install

    request = EngineCoreRequest(
        request_id="cmpl-abc-0-1a2b3c4d",
        prompt_token_ids=[5, 6, 7],
        mm_features=None,
        sampling_params=SamplingParams(max_tokens=4),
        pooling_params=None,
        arrival_time=time.time(),
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
        external_req_id="cmpl-abc-0",
    )
    outputs = EngineCoreOutputs(outputs=[EngineCoreOutput(request_id=request.request_id, new_token_ids=[9])])
    utility = EngineCoreOutputs(utility_output=UtilityOutput(call_id=1))
    install(codec, folder)
    install(codec, folder)  # vLLM loads its plugins more than once a process
    sent = core_client.MsgpackEncoder().encode(request)
    got = core.MsgpackDecoder(EngineCoreRequest).decode(sent)
    assert got.request_id == request.request_id and got.prompt_token_ids == [5, 6, 7], got
    assert got.sampling_params.max_tokens == 4
    back = core.MsgpackEncoder().encode_into(outputs, bytearray())
    assert core_client.MsgpackDecoder(EngineCoreOutputs).decode(back).outputs[0].new_token_ids == [9]
    # A utility result and an abort are vLLM's own traffic: vLLM's coder whatever the codec, not timed.
    assert core_client.MsgpackDecoder(EngineCoreOutputs).decode(core.MsgpackEncoder().encode(utility)).utility_output
    assert core.MsgpackDecoder().decode(core_client.MsgpackEncoder().encode(["cmpl-abc-0"])) == ["cmpl-abc-0"]
    if codec == "pickle-oob":
        assert bytes(sent[0])[:1] == b"\x80", "a pickle, not msgpack"  # type: ignore[arg-type]
    time.sleep(0.5)  # the recorders' flush
    rows: dict[str, list] = {kind: [] for kind in ("rq", "rd", "oe", "od")}
    for path in Path(folder).glob("*.jsonl"):
        found, _ = read_rows(path)
        assert found[0][0] == "meta" and found[0][1]["codec"] == codec, found[0]
        for row in found[1:]:
            rows[row[0]].append(row)
    assert [len(rows[k]) for k in ("rq", "rd", "oe", "od")] == [1, 1, 1, 1], rows
    assert rows["rq"][0][1:3] == ["cmpl-abc-0", "cmpl-abc-0-1a2b3c4d"]
    assert rows["oe"][0][1] == rows["od"][0][1] == outputs.timestamp  # the batch's join key
    assert rows["oe"][0][7] == [request.request_id]
    assert rows["rq"][0][5] is None and rows["od"][0][4] is None  # thread CPU time only when asked for
    print("checked")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
