"""What wirebench's SGLang hook costs a message when it times SGLang's own serializer.

Run with SGLang's venv (scripts/setup.sh --with-sglang-cpu):

    .venv-sglang/bin/python scripts/studies/sglang_hook_overhead/overhead.py \
        --out results/baselines/sglang-hook-overhead.json

Per call, in each IPC mode: SGLang's own ``io_struct.sock_send`` / ``sock_recv`` on a ZeroMQ inproc
PUSH/PULL pair, then the hook's timed replacements (``harness.sglang_hook.spans.Spans``, records to a
folder), in alternating rounds with the garbage collector off; and in msgpack mode its
``wrap_as_pickle`` plain and timed. The message: in pickle mode a tokenized request of 550 prompt ids;
in msgpack mode SGLang's ``FlushCacheReqInput`` (a request built outside the TokenizerManager does
not round-trip its msgpack decoder; the hook's work does not depend on the message). The overhead is
the per-call time of the hook's function minus SGLang's in each round; its median and interquartile
range over the rounds.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any


def request(io: Any) -> Any:
    """A tokenized request as the TokenizerManager sends it: 550 prompt ids, greedy sampling."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    return io.TokenizedGenerateReqInput(
        rid="0123456789abcdef0123456789abcdef",
        input_text="",
        input_ids=list(range(550)),
        input_embeds=None,
        mm_inputs=None,
        token_type_ids=None,
        sampling_params=SamplingParams(max_new_tokens=150, temperature=0.0),
        return_logprob=False,
        logprob_start_len=-1,
        top_logprobs_num=0,
        token_ids_logprob=None,
        stream=True,
    )


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls / 1000.0


def compare(name: str, plain: Callable[[], Any], timed: Callable[[], Any], rounds: int, calls: int) -> dict[str, Any]:
    """SGLang's per-call µs and the hook's extra, alternating which goes first; median and IQR."""
    diffs, plains = [], []
    for r in range(rounds):
        order = (plain, timed) if r % 2 == 0 else (timed, plain)
        a, b = per_call_us(order[0], calls), per_call_us(order[1], calls)
        base, hooked = (a, b) if r % 2 == 0 else (b, a)
        diffs.append(hooked - base)
        plains.append(base)
    q1, _, q3 = statistics.quantiles(diffs, n=4)
    row = {
        "sglang_us": round(statistics.median(plains), 3),
        "overhead_us_median": round(statistics.median(diffs), 3),
        "overhead_us_q1": round(q1, 3),
        "overhead_us_q3": round(q3, 3),
    }
    print(
        f"{name:28} SGLang {row['sglang_us']:7.2f} µs   hook +{row['overhead_us_median']:.2f} µs "
        f"[{row['overhead_us_q1']:.2f}, {row['overhead_us_q3']:.2f}]",
        flush=True,
    )
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()

    import zmq
    from sglang.srt.managers import io_struct as io

    from harness.sglang_hook.records import WRAP
    from harness.sglang_hook.spans import Spans

    plain_send, plain_recv, plain_wrap = io.sock_send, io.sock_recv, io.wrap_as_pickle
    folder = tempfile.TemporaryDirectory(prefix="wirebench-sglang-overhead-")  # the records, removed at the end
    spans = Spans(io, folder.name)
    timed_wrap = spans.nested(WRAP, plain_wrap)
    context: Any = zmq.Context()
    push, pull = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    push.setsockopt(zmq.SNDHWM, 0)
    pull.setsockopt(zmq.RCVHWM, 0)
    push.bind("inproc://overhead")
    pull.connect("inproc://overhead")
    messages = {"pickle": request(io), "msgpack": io.FlushCacheReqInput()}
    stats = {"time": 1.0, "queued": 2.0}  # a stand-in for a request's time stats

    results: dict[str, Any] = {"rounds": args.rounds, "calls": args.calls}
    gc.disable()
    for mode, use_pickle in (("pickle", True), ("msgpack", False)):
        io._USE_PICKLE_IPC = use_pickle  # what SGLang's own functions and the hook's read at each call
        message = messages[mode]
        results[f"{mode} message"] = type(message).__name__
        for _ in range(args.calls):  # warm both paths, and leave messages to receive
            plain_send(push, message)
        results[f"{mode} send"] = compare(
            f"{mode} send",
            partial(plain_send, push, message),
            partial(spans.sock_send, push, message),
            args.rounds,
            args.calls,
        )
        while pull.poll(0):  # what the sends left, received plain: the receive rounds get their own
            plain_recv(pull)
        for _ in range(args.rounds * args.calls * 2):
            plain_send(push, message)
        results[f"{mode} recv"] = compare(
            f"{mode} recv", lambda: plain_recv(pull), lambda: spans.sock_recv(pull), args.rounds, args.calls
        )
        if not use_pickle:
            results["msgpack wrap"] = compare(
                "msgpack wrap (nested pickle)",
                lambda: plain_wrap(stats),
                lambda: timed_wrap(stats),
                args.rounds,
                args.calls,
            )
    gc.enable()
    push.close(0)
    pull.close(0)
    context.term()
    if spans.recorder is not None:
        spans.recorder.flush()  # what is left written now, so nothing writes into the folder once it is gone
    folder.cleanup()
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
