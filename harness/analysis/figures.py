"""The figure catalogue: every figure wirebench tables, judges or plots, in one place.

A figure is a key in a run's figures (``documents.run_figures``), a short label
for tables, its unit, which way is better, and whether verdicts judge it.
Compare, the gate, sweep, the text report and the HTML page all read these
tuples; none keeps a list of its own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """One benchmark figure: its key in the results, a label for tables, and which way is better."""

    key: str
    label: str
    higher_is_better: bool = False
    unit: str = "ms"
    judged: bool = True
    detail: str = ""  # a longer label for plots and the HTML page ("" = the label)

    @property
    def long_label(self) -> str:
        return self.detail or self.label


# Judged latency figures (benchmark_serving's names; ITL is its per-chunk ITL, the
# per-token mean equals TPOT's and is not judged twice).
LATENCY_FIGURES = (
    Figure("mean_ttft_ms", "TTFT mean"),
    Figure("median_ttft_ms", "TTFT p50"),
    Figure("p99_ttft_ms", "TTFT p99"),
    Figure("mean_tpot_ms", "TPOT mean"),
    Figure("median_chunk_itl_ms", "ITL p50"),
    Figure("p99_chunk_itl_ms", "ITL p99"),
    Figure("mean_e2el_ms", "E2EL mean"),
)
# The codec's own µs per message, measured in the server's processes, per direction and operation.
CODEC_FIGURES = (
    Figure("request_encode_us", "req enc µs", unit="µs", detail="request encode (frontend)"),
    Figure("request_decode_us", "req dec µs", unit="µs", detail="request decode (engine)"),
    Figure("output_encode_us", "out enc µs", unit="µs", detail="output encode (engine)"),
    Figure("output_decode_us", "out dec µs", unit="µs", detail="output decode (frontend)"),
)
# The codec and the wire on the paths they lie on (harness.wire.spans.CODEC_WIRE_SPANS): per request on
# its way to its first token, and per output step. Judged in a family of their own (docs/method.md).
CODEC_PATH_FIGURES = (
    # The codec's four calls (request encode/decode, output encode/decode); from the server's counters.
    Figure("first_token_path_us", "codec 1st tok", unit="µs", detail="codec time, first-token path"),
    Figure("first_token_codec_wire_us", "codec+wire 1st tok", unit="µs", detail="codec + wire, first-token path"),
    Figure("step_codec_wire_us", "codec+wire step", unit="µs", detail="codec + wire, each output step"),
)
# Judged only when every run sent at rate inf (at a finite rate the schedule sets them).
THROUGHPUT_FIGURES = (
    Figure("request_throughput", "req/s", higher_is_better=True, unit="req/s"),
    Figure("output_throughput", "out tok/s", higher_is_better=True, unit="tok/s"),
)
# Shown beside the judged figures in bench run's table, never judged.
SHOWN_FIGURES = (
    Figure("codec_share_pct", "codec % TTFT", unit="%", judged=False, detail="codec share of mean TTFT"),
    Figure("p99_tpot_ms", "TPOT p99", judged=False),
    Figure("request_throughput", "req/s", higher_is_better=True, unit="req/s", judged=False),
    Figure("output_throughput", "out tok/s", higher_is_better=True, unit="tok/s", judged=False),
)
# The IPC budget per arm (harness.wire.spans): median over rounds of each run's p50; shown, not judged.
IPC_SPAN_FIGURES = (
    Figure("ipc_request_encode_p50_us", "req enc", unit="µs", judged=False, detail="req encode"),
    Figure("ipc_request_wire_p50_us", "req wire", unit="µs", judged=False),
    Figure("ipc_request_decode_p50_us", "req dec", unit="µs", judged=False, detail="req decode"),
    Figure("ipc_request_queue_p50_us", "in queue", unit="µs", judged=False, detail="engine in-queue"),
    Figure("ipc_output_queue_p50_us", "out queue", unit="µs", judged=False),
    Figure("ipc_output_encode_p50_us", "out enc", unit="µs", judged=False, detail="out encode"),
    Figure("ipc_output_wire_p50_us", "out wire", unit="µs", judged=False),
    Figure("ipc_output_decode_p50_us", "out dec", unit="µs", judged=False, detail="out decode"),
)
# A real SGLang's second output hop (DetokenizerManager → TokenizerManager), and the detokenizer's work
# before it (not IPC): shown where measured (harness.loadgen.sglang_spans).
SGLANG_HOP_FIGURES = (
    Figure("ipc_detok_work_p50_us", "detok work", unit="µs", judged=False, detail="detokenizer work (not IPC)"),
    Figure("ipc_detok_encode_p50_us", "ret enc", unit="µs", judged=False, detail="detok → tokenizer encode"),
    Figure("ipc_detok_wire_p50_us", "ret wire", unit="µs", judged=False, detail="detok → tokenizer wire"),
    Figure("ipc_detok_decode_p50_us", "ret dec", unit="µs", judged=False, detail="detok → tokenizer decode"),
)
IPC_FIGURES = (
    *IPC_SPAN_FIGURES,
    *SGLANG_HOP_FIGURES,
    Figure("ipc_ipc_mean_us", "IPC mean", unit="µs", judged=False, detail="IPC mean: codec + wire + queues"),
    # A codec's adapter (vllm: our message to vLLM's and back), outside IPC; 0 for the others.
    Figure("ipc_request_adapt_p50_us", "req adapt", unit="µs", judged=False, detail="request adapter"),
    Figure("ipc_output_adapt_p50_us", "out adapt", unit="µs", judged=False, detail="output adapter"),
    Figure("ipc_share_pct", "IPC % TTFT", unit="%", judged=False, detail="IPC share of mean TTFT"),
    Figure("loop_lag_p99_ms", "loop lag p99 ms", judged=False),
    # --transport shm-store: the share of frames the store already held (measured, from /metrics).
    Figure("mm_store_hit_pct", "store hit %", unit="%", judged=False, detail="shm-store hit rate"),
)
# bench sweep: the micro part's figures per payload, and the e2e part's per grid point.
MICRO_FIGURES = (
    Figure("codec_us", "codec µs (encode + decode p50)", unit="µs"),
    Figure("delivery_us", "delivery µs (encode → ipc → decode, p50)", unit="µs"),
)
E2E_FIGURES = (
    Figure("median_ttft_ms", "TTFT p50"),
    Figure("p99_ttft_ms", "TTFT p99"),
    Figure("mean_tpot_ms", "TPOT mean"),
)
# The figure calibrate injects costs against and reads detection from.
DETECTION_FIGURE = LATENCY_FIGURES[0]
