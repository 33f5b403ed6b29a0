"""Where vLLM's serializer spends its time on our payloads, part by part: why ours is faster where it is.

Each part is one change to vLLM's message or call, timed with ``timeit`` (median
of 7 batches) on the same content as ``bench micro``'s payloads:

- text-550 decode, all of it, and ``SamplingParams.__post_init__`` alone (the
  validation vLLM runs inside its decode);
- SamplingParams bytes keyed by name (vLLM: a map) against ours (an array);
- outputs-64 encode and decode with and without ``SchedulerStats`` (stats
  logging on, vLLM's default, attaches it to every step);
- outputs-64-logprobs5 encode and decode, and the count of ``enc_hook`` calls
  (every small numpy array goes through a Python hook).

    .venv/bin/python scripts/studies/vllm_parts/vllm_parts.py --json results/micro/vllm-parts.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit
from pathlib import Path
from typing import Any

import msgspec
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

from harness.micro import payloads, timing
from wirecodecs import vllm_messages as vm


def us(fn: Any) -> float:
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    return statistics.median(timer.repeat(repeat=7, number=number)) / number * 1e6


def encode_decode(msg: Any) -> dict[str, float]:
    enc, dec = MsgpackEncoder(), MsgpackDecoder(type(msg))
    frames = [bytes(memoryview(f)) for f in enc.encode(msg)]  # type: ignore[arg-type]
    return {"encode_us": us(lambda: enc.encode(msg)), "decode_us": us(lambda: dec.decode(frames))}


def hook_calls(msg: Any) -> int:
    enc = MsgpackEncoder()
    calls = 0
    hook = enc.enc_hook

    def counting(obj: Any) -> Any:
        nonlocal calls
        calls += 1
        return hook(obj)

    enc.encoder = msgspec.msgpack.Encoder(enc_hook=counting)
    enc.encode(msg)
    return calls


def parts() -> dict[str, Any]:
    out: dict[str, Any] = {}
    request = vm.request_to_vllm(payloads.text_request())
    sp = request.sampling_params
    assert sp is not None
    out["text-550"] = {
        **encode_decode(request),
        "sampling_params_post_init_us": us(sp.__post_init__),
        "sampling_params_bytes_vllm": len(msgspec.msgpack.encode(sp)),
        "sampling_params_bytes_ours": len(msgspec.msgpack.encode(payloads.text_request().sampling_params)),
    }
    batch = vm.outputs_to_vllm(payloads.outputs_batch())
    bare = vm.outputs_to_vllm(payloads.outputs_batch())
    bare.scheduler_stats = None
    out["outputs-64"] = {
        "with_scheduler_stats": encode_decode(batch),
        "without_scheduler_stats": encode_decode(bare),
        "scheduler_stats_bytes": len(msgspec.msgpack.encode(batch.scheduler_stats)),
        "output_fields_vllm": len(type(batch.outputs[0]).__struct_fields__),
    }
    lp = vm.outputs_to_vllm(payloads.outputs_batch(logprobs=5))
    out["outputs-64-logprobs5"] = {**encode_decode(lp), "enc_hook_calls": hook_calls(lp)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    with timing.one_torch_thread():
        found = parts()
    print(json.dumps(found, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"kind": "vllm-parts", "parts": found}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
