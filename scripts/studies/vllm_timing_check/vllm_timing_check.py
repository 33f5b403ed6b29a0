"""An independent timing of vLLM's serializer, to check what `bench micro --codec vllm` reports.

It builds vLLM's own messages by hand with vLLM's constructors (not through
wirebench's adapter, ``wirecodecs.vllm_messages``) from the same content as
``bench micro``'s payloads, times ``MsgpackEncoder.encode`` and
``MsgpackDecoder.decode`` with the standard library's ``timeit`` (a repeat of
batches, the median batch divided by its size: another timer and another loop
than bench micro's single-call ``perf_counter_ns`` samples), and runs
``bench micro`` in the same process between its own rounds, so both see the
same machine. It prints both figures and their ratio per payload and op, and
writes them as JSON with ``--json``.

    .venv/bin/python scripts/studies/vllm_timing_check/vllm_timing_check.py --rounds 3 \\
        --json results/micro/vllm-timing-check.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit
from pathlib import Path
from typing import Any

from vllm.multimodal.inputs import (
    MultiModalFeatureSpec,
    MultiModalFieldConfig,
    MultiModalFieldElem,
    MultiModalKwargsItem,
    PlaceholderRange,
)
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from vllm.v1.metrics.stats import SchedulerStats
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

from harness.micro import payloads, timing

PAYLOADS = ("text-550", "outputs-64", "tensor-fp32-1024")


def vllm_request(ours: Any) -> EngineCoreRequest:
    sp = ours.sampling_params
    params = SamplingParams(
        temperature=sp.temperature,
        top_p=sp.top_p,
        top_k=sp.top_k,
        min_p=sp.min_p,
        presence_penalty=sp.presence_penalty,
        frequency_penalty=sp.frequency_penalty,
        repetition_penalty=sp.repetition_penalty,
        seed=sp.seed,
        stop=list(sp.stop),
        stop_token_ids=list(sp.stop_token_ids),
        include_stop_str_in_output=sp.include_stop_str_in_output,
        max_tokens=sp.max_tokens,
        min_tokens=sp.min_tokens,
        logprobs=sp.logprobs,
        skip_special_tokens=sp.skip_special_tokens,
        logit_bias=dict(sp.logit_bias or {}),
        output_kind=RequestOutputKind.DELTA,
    )
    params._eos_token_id = ours.eos_token_id
    params._all_stop_token_ids = {*sp.stop_token_ids, ours.eos_token_id}
    features = None
    if ours.mm_inputs:
        field = MultiModalFieldConfig.batched("image").field
        item = MultiModalKwargsItem({k: MultiModalFieldElem(data=v, field=field) for k, v in ours.mm_inputs[0].items()})
        place = ours.mm_placeholders[0]
        features = [
            MultiModalFeatureSpec(
                data=item,
                modality="image",
                identifier=ours.mm_hashes[0],
                mm_position=PlaceholderRange(offset=place.offset, length=place.length),
                mm_hash=ours.mm_hashes[0],
            )
        ]
    return EngineCoreRequest(
        request_id=ours.request_id,
        prompt_token_ids=list(ours.prompt_token_ids),
        mm_features=features,
        sampling_params=params,
        pooling_params=None,
        arrival_time=ours.arrival_time,
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
    )


def vllm_outputs(ours: Any) -> EngineCoreOutputs:
    return EngineCoreOutputs(
        outputs=[EngineCoreOutput(request_id=o.request_id, new_token_ids=list(o.new_token_ids)) for o in ours.outputs],
        scheduler_stats=SchedulerStats(step_counter=ours.step_index),
        timestamp=ours.timestamp,
    )


def timeit_us(fn: Any, repeat: int = 7) -> float:
    """The median over ``repeat`` batches of the per-call time, µs (batch size from timeit's autorange)."""
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    return statistics.median(timer.repeat(repeat=repeat, number=number)) / number * 1e6


def independent(payload: str) -> dict[str, float]:
    ours = payloads.PAYLOADS[payload]()
    msg = vllm_outputs(ours) if payload.startswith("outputs") else vllm_request(ours)
    encoder = MsgpackEncoder()
    decoder = MsgpackDecoder(type(msg))
    frames = [bytes(memoryview(f)) for f in encoder.encode(msg)]  # type: ignore[arg-type]
    return {"encode": timeit_us(lambda: encoder.encode(msg)), "decode": timeit_us(lambda: decoder.decode(frames))}


def bench_micro(payload: str) -> dict[str, float]:
    cell = timing.measure_cell("vllm", payload, payloads.PAYLOADS[payload](), 200, 0.5)
    if cell.status != "ok" or cell.encode is None or cell.decode is None:
        raise SystemExit(f"bench micro's vllm cell for {payload}: {cell.status}: {cell.reason}")
    return {"encode": cell.encode.p50_us, "decode": cell.decode.p50_us}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two timings (default %(default)s)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with timing.one_torch_thread():
        for payload in PAYLOADS:
            ind: dict[str, list[float]] = {"encode": [], "decode": []}
            ours: dict[str, list[float]] = {"encode": [], "decode": []}
            for _ in range(args.rounds):  # alternate, so drift on the machine hits both alike
                for op, us in independent(payload).items():
                    ind[op].append(us)
                for op, us in bench_micro(payload).items():
                    ours[op].append(us)
            for op in ("encode", "decode"):
                a, b = statistics.median(ours[op]), statistics.median(ind[op])
                rows.append({"payload": payload, "op": op, "bench_micro_p50_us": a, "timeit_us": b, "ratio": a / b})
    print(f"{'payload':<18}{'op':<8}{'bench micro p50 µs':>20}{'timeit µs':>12}{'ratio':>8}")
    for r in rows:
        print(
            f"{r['payload']:<18}{r['op']:<8}{r['bench_micro_p50_us']:>20.2f}{r['timeit_us']:>12.2f}{r['ratio']:>8.2f}"
        )
    worst = max(abs(r["ratio"] - 1) for r in rows)
    print(f"largest disagreement: {worst * 100:.1f}% (medians over {args.rounds} alternating rounds)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"kind": "vllm-timing-check", "rounds": args.rounds, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
