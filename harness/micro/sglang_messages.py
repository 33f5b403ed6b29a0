"""SGLang's own messages timed through its two IPC modes; run with SGLang's Python, not wirebench's.

``bench micro`` starts this module with ``.venv-sglang/bin/python`` (or ``--sglang-python``), as the
``harness.micro.sglang_cells`` side in wirebench's venv asks, and reads one JSON line per cell from its
stdout. It builds, from the same seeded payloads the other rows time (``harness.micro.payloads``),
the message SGLang itself sends for each, shaped field by field like those a running SGLang 0.5.23
sent on this project's sonnet workload (captured from its sockets):

- ``text-550``: the ``TokenizedGenerateReqInput`` the tokenizer process sends the scheduler: the
  prompt string, its 550 ids as the ``array('q')`` SGLang keeps, the sampling parameters mapped to
  SGLang's (normalized, as the tokenizer does) and the request's ``APIServerReqTimeStats``;
- ``outputs-64`` / ``outputs-256`` / ``outputs-64-logprobs5``: the ``BatchTokenIDOutput`` the scheduler
  sends the detokenizer after one decode step: per request its id, new token (``decode_ids`` and
  ``output_ids``), offsets, counts and flags, a ``SchedulerReqTimeStats`` each, and with logprobs the
  sampled token's and the top-5's.

The two modes, as ``io_struct.sock_send`` / ``sock_recv`` run them:

- ``sglang-pickle`` (``SGLANG_USE_PICKLE_IPC=1``): encode ``pickle.dumps(msg, HIGHEST_PROTOCOL)``, decode
  ``pickle.loads``;
- ``sglang-msgspec`` (``=0``): encode = the time stats pickled into a ``PickleWrapper`` (as the sender
  does just before ``sock_send``) + ``msgpack_encode``; decode = ``msgpack_decode`` + the time stats
  unpickled, as the receiver does. The nested pickle counts in the message's time, as the hook counts
  it in a real run.

Timing is ``harness.micro.timing.time_calls``, the loop of every other cell. A cell is checked first:
the decoded message must equal the one encoded (time stats compared by type and count: their pickled
state is not their whole state).
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from array import array
from collections.abc import Callable
from typing import Any

MODES = ("sglang-pickle", "sglang-msgspec")
# The payloads SGLang has a message for; the others' cells say why not (``harness.micro.sglang_cells``).
REQUESTS = ("text-550",)
OUTPUT_BATCHES = ("outputs-64", "outputs-256", "outputs-64-logprobs5")


class _ByteTokens:
    """What ``SamplingParams.normalize`` asks of a tokenizer: a stop string's length in tokens, to set
    ``stop_str_max_len`` (one int on the wire). Its UTF-8 bytes stand in: no tokenizer is loaded here."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode())


def sglang_request(req: Any, io: Any, time_stats: Any) -> Any:
    """wirebench's ``EngineCoreRequest`` as SGLang's tokenizer sends it."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    sp = req.sampling_params
    params = SamplingParams(
        max_new_tokens=sp.max_tokens,
        stop=list(sp.stop),
        stop_token_ids=set(sp.stop_token_ids),
        temperature=sp.temperature,
        top_p=sp.top_p,
        top_k=sp.top_k,
        min_p=sp.min_p,
        frequency_penalty=sp.frequency_penalty,
        presence_penalty=sp.presence_penalty,
        repetition_penalty=sp.repetition_penalty,
        min_new_tokens=sp.min_tokens,
        ignore_eos=sp.ignore_eos,
        skip_special_tokens=sp.skip_special_tokens,
        spaces_between_special_tokens=sp.spaces_between_special_tokens,
        logit_bias={str(k): v for k, v in sp.logit_bias.items()},
        sampling_seed=sp.seed,
    )
    params.normalize(_ByteTokens())
    stats = time_stats.APIServerReqTimeStats()
    stats.set_created_time(req.arrival_time)
    return io.TokenizedGenerateReqInput(
        rid=req.request_id,
        input_text=req.prompt,
        input_ids=array("q", req.prompt_token_ids),
        input_embeds=None,
        mm_inputs=None,
        token_type_ids=None,
        sampling_params=params,
        return_logprob=sp.logprobs is not None,
        logprob_start_len=-1,
        top_logprobs_num=sp.logprobs or 0,
        token_ids_logprob=None,
        stream=True,
        time_stats=stats,
    )


def sglang_output_batch(outputs: Any, io: Any, time_stats: Any) -> Any:
    """wirebench's ``EngineCoreOutputs`` (one decode step) as SGLang's scheduler sends it."""
    items = outputs.outputs
    n = len(items)
    logprobs = [o.new_logprobs for o in items]
    with_logprobs = all(lp is not None for lp in logprobs)
    fields: dict[str, Any] = {}
    if with_logprobs:
        # Per request, per new token: the sampled token's logprob and id, then the top-k's.
        fields = {
            "output_token_logprobs_val": [[lp.logprobs[0][0]] for lp in logprobs],
            "output_token_logprobs_idx": [[lp.token_ids[0][0]] for lp in logprobs],
            "output_top_logprobs_val": [[lp.logprobs[0][1:]] for lp in logprobs],
            "output_top_logprobs_idx": [[lp.token_ids[0][1:]] for lp in logprobs],
        }
    return io.BatchTokenIDOutput(
        rids=[o.request_id for o in items],
        http_worker_ipcs=[None] * n,
        finished_reasons=[None] * n,
        decoded_texts=[""] * n,
        decode_ids=[array("q", o.new_token_ids) for o in items],
        read_offsets=[5] * n,
        output_ids=[array("q", o.new_token_ids) for o in items],
        skip_special_tokens=[True] * n,
        spaces_between_special_tokens=[True] * n,
        no_stop_trim=[False] * n,
        prompt_tokens=[550] * n,
        reasoning_tokens=[0] * n,
        completion_tokens=[37] * n,
        cached_tokens=[o.num_cached_tokens for o in items],
        input_token_logprobs_val=None,
        input_token_logprobs_idx=None,
        output_token_logprobs_val=fields.get("output_token_logprobs_val"),
        output_token_logprobs_idx=fields.get("output_token_logprobs_idx"),
        input_top_logprobs_val=None,
        input_top_logprobs_idx=None,
        output_top_logprobs_val=fields.get("output_top_logprobs_val"),
        output_top_logprobs_idx=fields.get("output_top_logprobs_idx"),
        input_token_ids_logprobs_val=None,
        input_token_ids_logprobs_idx=None,
        output_token_ids_logprobs_val=None,
        output_token_ids_logprobs_idx=None,
        output_token_entropy_val=None,
        output_token_sampling_mask=None,
        output_hidden_states=None,
        routed_experts=None,
        indexer_topk=None,
        placeholder_tokens_idx=None,
        placeholder_tokens_val=None,
        retraction_counts=[0] * n,
        cached_tokens_details=[{"device": o.num_cached_tokens, "host": 0} for o in items],
        dp_ranks=[None] * n,
        image_tokens=[0] * n,
        audio_tokens=[0] * n,
        video_tokens=[0] * n,
        spec_verify_ct=[],
        spec_num_correct_drafts=[],
        spec_num_block_accept_tokens=[],
        spec_num_cap_tokens=[],
        spec_correct_drafts_histogram=[],
        spec_cap_lens_histogram=[],
        time_stats=[time_stats.SchedulerReqTimeStats() for _ in items],
    )


def mode_calls(mode: str, io: Any) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    """A mode's encode (message → bytes) and decode (bytes → message), as SGLang's sender and receiver run
    them; the message holds its time stats unwrapped, as SGLang builds it before the send."""
    if mode == "sglang-pickle":
        return (lambda msg: pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)), pickle.loads

    def encode(msg: Any) -> bytes:
        stats = msg.time_stats
        msg.time_stats = io.PickleWrapper(pickle.dumps(stats))
        try:
            return io.msgpack_encode(msg)
        finally:
            msg.time_stats = stats

    def decode(data: bytes) -> Any:
        msg = io.msgpack_decode(data)
        msg.time_stats = pickle.loads(msg.time_stats.data)
        return msg

    return encode, decode


def check_round_trip(sent: Any, got: Any) -> None:
    """Raise unless the decoded message is the one sent (time stats by type and count)."""
    import msgspec

    def stats_shape(stats: Any) -> Any:
        return [type(s) for s in stats] if isinstance(stats, list) else type(stats)

    if type(got) is not type(sent) or stats_shape(got.time_stats) != stats_shape(sent.time_stats):
        raise AssertionError("round trip changed the message's type or its time stats")
    if msgspec.structs.replace(got, time_stats=None) != msgspec.structs.replace(sent, time_stats=None):
        raise AssertionError("round trip changed the message")


def sglang_message(payload: str, io: Any, time_stats: Any) -> Any:
    from harness.micro.payloads import PAYLOADS

    built = PAYLOADS[payload]()
    return sglang_request(built, io, time_stats) if payload in REQUESTS else sglang_output_batch(built, io, time_stats)


def measure_cell(msg: Any, mode: str, io: Any, min_iterations: int, min_time_s: float) -> dict[str, Any]:
    """One message through one mode: checked, then timed; the cell's figures."""
    from harness.micro.timing import time_calls

    encode, decode = mode_calls(mode, io)
    wire = bytes(encode(msg))  # fresh bytes, as a receive buffer holds them; untimed
    check_round_trip(msg, decode(wire))
    return {
        "encode": time_calls(lambda: encode(msg), min_iterations, min_time_s).__dict__,
        "decode": time_calls(lambda: decode(wire), min_iterations, min_time_s).__dict__,
        "status": "ok",
        "wire_bytes": len(wire),
        "frames": 1,
    }


def measure_cells(payloads: list[str], modes: list[str], min_iterations: int, min_time_s: float) -> None:
    """One JSON line per payload x mode on stdout, as each is measured; never raises for one cell."""
    import sglang
    import sglang.srt.managers.io_struct as io
    from sglang.srt.observability import req_time_stats as time_stats

    print(json.dumps({"kind": "versions", "sglang": sglang.__version__, "python": sys.version.split()[0]}))
    for payload in payloads:
        for mode in modes:
            cell: dict[str, Any] = {"kind": "cell", "codec": mode, "payload": payload}
            try:
                cell.update(measure_cell(sglang_message(payload, io, time_stats), mode, io, min_iterations, min_time_s))
            except Exception as exc:  # one broken cell must not stop the others
                cell.update(status="error", reason=f"{type(exc).__name__}: {exc}")
            print(json.dumps(cell), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--payload", required=True, help="comma-separated, of " + ", ".join(REQUESTS + OUTPUT_BATCHES))
    p.add_argument("--codec", default=",".join(MODES), help="comma-separated, of " + ", ".join(MODES))
    p.add_argument("--min-iterations", type=int, required=True)
    p.add_argument("--min-time", type=float, required=True)
    args = p.parse_args()
    payloads, modes = args.payload.split(","), args.codec.split(",")
    unknown = [x for x in payloads if x not in REQUESTS + OUTPUT_BATCHES] + [m for m in modes if m not in MODES]
    if unknown:
        p.error(f"unknown: {', '.join(unknown)}")
    measure_cells(payloads, modes, args.min_iterations, args.min_time)


if __name__ == "__main__":
    main()
