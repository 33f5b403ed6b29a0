"""The codecs on vLLM's own messages in a loop, to set beside what the plugin measured inside vLLM.

Run with the vLLM venv's Python:

    .venv-vllm/bin/python scripts/studies/vllm_inside/micro_same_messages.py \\
        --out results/baselines/vllm-inside-micro.json

The messages are shaped as the seed workload's inside vLLM were (results/baselines/real-vllm-seed.json):
a request of 550 prompt tokens with the sampling parameters vLLM's completions endpoint builds, about
1.8 KB with vLLM's msgpack; an output batch of one request's one token (at 4 req/s a step carries
one or two) with the scheduler's stats the API server logs, about 0.7 KB. Each codec's encode and
decode is timed two ways, the garbage collector off: hot, in a loop (the median of the rounds'
per-call means, wall and thread CPU), as ``bench micro`` times; and cold, one call at a time after
16 MB of other memory was written, which evicts the caches as a server's other work does between
two messages (the median call's thread CPU).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path
from typing import Any

CODECS = ("vllm", "pickle", "pickle-oob", "msgspec")


def messages() -> tuple[Any, Any]:
    from vllm import SamplingParams
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
    from vllm.v1.metrics.stats import PrefixCacheStats, SchedulerStats

    params = SamplingParams(max_tokens=150, temperature=0.0, ignore_eos=True, seed=None)
    request = EngineCoreRequest(
        request_id="cmpl-8f5419f50c448ce5-0-80281fad",
        prompt_token_ids=list(range(1000, 1550)),
        mm_features=None,
        sampling_params=params,
        pooling_params=None,
        arrival_time=time.time(),
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
        external_req_id="cmpl-8f5419f50c448ce5-0",
    )
    # The API server logs stats, so each step's outputs carry the scheduler's (most of their bytes).
    stats = SchedulerStats(num_running_reqs=1, kv_cache_usage=0.01, prefix_cache_stats=PrefixCacheStats())
    outputs = EngineCoreOutputs(
        outputs=[EngineCoreOutput(request_id=request.request_id, new_token_ids=[1234])], scheduler_stats=stats
    )
    return request, outputs


def coders(name: str) -> tuple[Any, Any]:
    """(encode(msg) -> frames, decode(frames, type) -> msg) of a codec."""
    if name == "vllm":
        from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

        encoder, decoders = MsgpackEncoder(), {}

        def decode(frames: Any, t: type) -> Any:
            if t not in decoders:
                decoders[t] = MsgpackDecoder(t)
            return decoders[t].decode(frames)

        return encoder.encode, decode
    from wirecodecs import get_codec

    codec = get_codec(name)
    return codec.encode, codec.decode


def timed(fn: Any, calls: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - wall) / calls / 1000, (time.thread_time_ns() - cpu) / calls / 1000


COLD_BUFFER = 16 << 20  # bytes written between two cold calls: past this machine's last-level cache share
COLD_CALLS = 300


def cold_cpu_us(fn: Any) -> float:
    """The median thread CPU of one call made after the caches were flushed by other writes."""
    import numpy as np

    other = np.ones(COLD_BUFFER, dtype=np.uint8)
    times = []
    for _ in range(COLD_CALLS):
        other += 1
        start = time.thread_time_ns()
        fn()
        times.append(time.thread_time_ns() - start)
    return statistics.median(times) / 1000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    request, outputs = messages()
    cells = []
    gc.disable()
    for name in CODECS:
        encode, decode = coders(name)
        for what, msg in (("request", request), ("output", outputs)):
            frames = encode(msg)
            size = sum(memoryview(f).nbytes for f in frames)
            enc = [timed(lambda: encode(msg), args.calls) for _ in range(args.rounds)]  # noqa: B023
            dec = [timed(lambda: decode(frames, type(msg)), args.calls) for _ in range(args.rounds)]  # noqa: B023
            cell = {
                "codec": name,
                "message": what,
                "bytes": size,
                "encode_us": round(statistics.median(w for w, _ in enc), 2),
                "encode_cpu_us": round(statistics.median(c for _, c in enc), 2),
                "decode_us": round(statistics.median(w for w, _ in dec), 2),
                "decode_cpu_us": round(statistics.median(c for _, c in dec), 2),
                "cold_encode_cpu_us": round(cold_cpu_us(lambda: encode(msg)), 2),  # noqa: B023
                "cold_decode_cpu_us": round(cold_cpu_us(lambda: decode(frames, type(msg))), 2),  # noqa: B023
            }
            cells.append(cell)
            print(
                f"{name:10s} {what:7s} {size:5d} B hot: encode {cell['encode_us']:6.2f} decode {cell['decode_us']:6.2f}"
                f"  cold CPU: encode {cell['cold_encode_cpu_us']:6.2f} decode {cell['cold_decode_cpu_us']:6.2f} us"
            )
            gc.collect()
    gc.enable()
    if args.out:
        import vllm

        doc = {"kind": "vllm-inside-micro", "vllm": vllm.__version__, "date": time.strftime("%Y-%m-%d"), "cells": cells}
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
