"""Request timelines: joining the two processes' halves in any order, the budget, the trace events."""

from __future__ import annotations

import math
from dataclasses import asdict

import pytest

from harness.frontend.timeline import Timelines
from harness.loadgen.ipc import budget_figures, report_lines
from harness.wire.spans import BatchPoints, EnginePoints, FrontPoints, RequestTimeline, budget, trace_events


def points(rid_offset: int = 0) -> tuple[FrontPoints, EnginePoints, dict]:
    """A request along a path whose every step takes 1 µs (ns timestamps 1000, 2000, ...)."""
    t = [1000 * (i + 1) + rid_offset for i in range(14)]
    front = FrontPoints(
        http_received=t[0],
        prepared=t[1],
        encode_start=t[2],
        encode_end=t[3],
        encode_cpu=900,
        sent=t[3] + 10,
        first_output_received=t[11],
        first_output_decoded=t[12],
        first_output_decode_cpu=800,
        first_output_seq=7,
        first_sse_written=t[13],
    )
    engine = EnginePoints(
        received=t[4],
        decode_end=t[5],
        decode_cpu=700,
        added=t[6],
        first_scheduled=t[7],
        first_sampled=t[8],
        first_output_seq=7,
    )
    batch = {
        "seq": 7,
        "step_index": 3,
        "outputs": 1,
        "encode_start": t[9],
        "encode_end": t[10],
        "encode_cpu": 600,
        "sent": t[10] + 5,
        "bytes": 123,
    }
    return front, engine, batch


def test_a_timeline_joins_whatever_order_its_halves_arrive() -> None:
    for order in ("front first", "engine first"):
        tl = Timelines()
        front, engine, batch = points()
        tl.track("r1", front)
        if order == "engine first":
            tl.batch_received(7, front.first_output_received, front.first_output_decoded, 800)
            tl.engine_spans({"requests": {"r1": asdict(engine)}, "batches": [batch], "steps": []})
            tl.front_finished("r1")
        else:
            tl.front_finished("r1")
            tl.batch_received(7, front.first_output_received, front.first_output_decoded, 800)
            tl.engine_spans({"requests": {"r1": asdict(engine)}, "batches": [batch], "steps": [{"start": 1, "end": 2}]})
        (joined,) = list(tl.requests)
        assert joined.ordered(), order
        spans = joined.spans_us()
        assert spans["request.wire"] == 1.0 and spans["output.wire"] == 1.0 and spans["request.queue"] == 1.0
        assert spans["ipc"] == pytest.approx(8.0)  # eight 1 µs spans on the IPC path
        assert spans["request.encode_cpu"] == 0.9
        assert len(list(tl.batches)) == 1


def test_requests_that_never_wrote_a_chunk_are_not_timelines_and_nothing_piles_up() -> None:
    tl = Timelines()
    front, engine, batch = points()
    front.first_sse_written = 0  # ended with an error before its first chunk
    tl.track("r1", front)
    tl.front_finished("r1")
    tl.batch_received(7, 1, 2, 3)
    tl.engine_spans({"requests": {"r1": asdict(engine)}, "batches": [batch]})
    assert not list(tl.requests)
    assert not tl._front and not tl._engine and not tl._front_done


def test_a_disabled_collector_says_why_and_records_nothing() -> None:
    tl = Timelines()
    tl.disable("the engine runs on another host")
    front, engine, _ = points()
    tl.track("r1", front)
    tl.engine_spans({"requests": {"r1": asdict(engine)}})
    snap = tl.snapshot()
    assert snap["available"] is False and "another host" in snap["unavailable"] and snap["requests"] == []


def test_the_snapshot_cursor_returns_only_what_is_new() -> None:
    tl = Timelines()
    for i, rid in enumerate(("a", "b")):
        front, engine, batch = points(i * 100_000)
        front.first_output_seq = engine.first_output_seq = batch["seq"] = i
        tl.track(rid, front)
        tl.front_finished(rid)
        tl.batch_received(i, front.first_output_received, front.first_output_decoded, 1)
        tl.engine_spans({"requests": {rid: asdict(engine)}, "batches": [batch]})
    first = tl.snapshot()
    assert [t["request_id"] for t in first["requests"]] == ["a", "b"]
    later = tl.snapshot(since_request=1, since_batch=1)
    assert [t["request_id"] for t in later["requests"]] == ["b"] and len(later["batches"]) == 1
    assert first["cursor"]["request"] == 2


def test_budget_and_report_lines() -> None:
    front, engine, batch = points()
    t = RequestTimeline("r1", front, engine, BatchPoints(**batch, received=front.first_output_received))
    result = budget([t.to_dict()] * 3, {"samples": 10, "p50": 0.1, "p99": 0.5, "max": 0.9})
    assert result.spans["request.wire"].p50_us == 1.0 and result.requests == 3
    assert result.share_of_ttft(mean_ttft_ms=0.016) == pytest.approx(8.0 / 16.0)
    text = "\n".join(report_lines(result, mean_ttft_ms=0.016))
    assert "Request wire, send -> receive" in text and "IPC (codec, wire, queues) % of TTFT:" in text
    figures = budget_figures(result.to_dict())
    assert figures["ipc_request_wire_p50_us"] == 1.0 and math.isnan(figures["ipc_step_wire_p50_us"])


def test_trace_events_have_one_track_per_thread_and_complete_slices() -> None:
    front, engine, batch = points()
    b = BatchPoints(**batch, received=front.first_output_received, decoded=front.first_output_decoded)
    doc = trace_events([RequestTimeline("r1", front, engine, b)], [b], [{"index": 1, "start": 5, "end": 9}], 10, 20)
    events = doc["traceEvents"]
    threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"}
    assert threads == {(10, 1), (20, 1), (20, 2), (20, 3)}
    assert all({"name", "ts", "dur", "pid", "tid"} <= set(e) for e in events if e["ph"] == "X")
