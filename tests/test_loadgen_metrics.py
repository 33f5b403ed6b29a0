"""The metrics pure function on hand-made records: exact expected numbers."""

from __future__ import annotations

import math
import statistics

import pytest

from harness.loadgen.client import RequestRecord
from harness.loadgen.metrics import (
    chunk_itls,
    compute_metrics,
    parse_goodput,
    parse_percentile_metrics,
    parse_percentiles,
    percentile_key,
    token_itls,
)


def _rec(
    index: int,
    *,
    ttft: float,
    times: list[float],
    tokens: list[int],
    prompt_len: int,
    output_tokens: int | None = None,
    planned: float = 0.0,
    sent: float = 0.0,
) -> RequestRecord:
    return RequestRecord(
        index=index,
        prompt_len=prompt_len,
        expected_output_len=sum(tokens),
        planned_send=planned,
        dispatched=planned,
        actual_send=sent,
        ttft=ttft,
        latency=times[-1],
        chunk_times=times,
        chunk_tokens=tokens,
        output_tokens=sum(tokens) if output_tokens is None else output_tokens,
        success=True,
    )


@pytest.fixture
def records() -> list[RequestRecord]:
    a = _rec(0, ttft=0.1, times=[0.1, 0.2, 0.3, 0.5], tokens=[1, 1, 1, 1], prompt_len=10, planned=0.0, sent=0.001)
    # Two tokens per chunk.
    b = _rec(1, ttft=0.2, times=[0.2, 0.4, 0.6], tokens=[2, 2, 2], prompt_len=20, planned=0.5, sent=0.503)
    failed = RequestRecord(
        2, prompt_len=30, expected_output_len=4, planned_send=1.0, dispatched=1.0, actual_send=1.002, error="HTTP 500"
    )
    one_token = _rec(3, ttft=0.05, times=[0.05], tokens=[1], prompt_len=5, planned=1.5, sent=1.506)
    return [a, b, failed, one_token]


def test_counts_and_throughputs(records: list[RequestRecord]) -> None:
    m = compute_metrics(records, duration_s=2.0)
    assert (m.completed, m.failed) == (3, 1)
    assert m.total_input == 35  # failed requests do not count
    assert m.total_output == 11
    assert m.output_lens == [4, 6, 0, 1]
    assert m.request_throughput == pytest.approx(1.5)
    assert m.output_throughput == pytest.approx(5.5)
    assert m.total_token_throughput == pytest.approx(23.0)
    assert m.request_goodput is None


def test_ttft_e2el_tpot(records: list[RequestRecord]) -> None:
    m = compute_metrics(records, 2.0, percentiles=(50, 99))
    assert m.ttft.count == 3
    assert m.ttft.mean == pytest.approx((100 + 200 + 50) / 3)
    assert m.ttft.median == pytest.approx(100)
    assert m.ttft.std == pytest.approx(statistics.pstdev([100, 200, 50]))
    assert m.ttft.percentiles[99.0] == pytest.approx(198.0)  # linear interpolation
    assert m.ttft.percentiles[50.0] == pytest.approx(100.0)
    assert m.e2el.mean == pytest.approx((500 + 600 + 50) / 3)
    # TPOT = (latency - ttft) / (tokens - 1), only for requests with > 1 token.
    assert m.tpot.count == 2
    assert m.tpot.mean == pytest.approx(((500 - 100) / 3 + (600 - 200) / 5) / 2)


def test_itl_per_token_splits_a_k_token_chunk_into_k_samples(records: list[RequestRecord]) -> None:
    m = compute_metrics(records, 2.0)
    per_token = [100, 100, 200] + [100, 100, 100, 100]
    assert m.itl.count == len(per_token)
    assert m.itl.mean == pytest.approx(sum(per_token) / len(per_token))
    per_chunk = [100, 100, 200] + [200, 200]
    assert m.chunk_itl.count == len(per_chunk)
    assert m.chunk_itl.mean == pytest.approx(sum(per_chunk) / len(per_chunk))


def test_token_itls_definition() -> None:
    # First chunk of 3 tokens: no gap before it, its extra tokens are not samples.
    assert token_itls([0.1, 0.4, 0.5], [3, 3, 1]) == pytest.approx([0.1, 0.1, 0.1, 0.1])
    # A chunk with text but no token does not move the reference point.
    assert token_itls([0.1, 0.15, 0.3], [1, 0, 1]) == pytest.approx([0.2])
    assert chunk_itls([0.1, 0.15, 0.3]) == pytest.approx([0.05, 0.15])
    assert token_itls([], []) == []


def test_goodput(records: list[RequestRecord]) -> None:
    # TTFT <= 150 ms: requests 0 and 3.
    assert compute_metrics(records, 2.0, goodput_slos_ms={"ttft": 150}).request_goodput == pytest.approx(1.0)
    # And TPOT <= 100 ms: request 0 has 133 ms; request 3 (one token) counts TPOT as 0.
    m = compute_metrics(records, 2.0, goodput_slos_ms={"ttft": 150, "tpot": 100})
    assert m.request_goodput == pytest.approx(0.5)
    assert compute_metrics(records, 2.0, goodput_slos_ms={"e2el": 1000}).request_goodput == pytest.approx(1.5)


def test_schedule_lag(records: list[RequestRecord]) -> None:
    lag = compute_metrics(records, 2.0).schedule_lag
    assert lag.count == 4  # the failed request was sent too
    assert lag.mean_ms == pytest.approx((1 + 3 + 2 + 6) / 4)
    assert lag.max_ms == pytest.approx(6)


def test_no_successful_request_gives_nan_not_zero() -> None:
    rec = RequestRecord(0, 1, 1, 0.0, error="boom")
    m = compute_metrics([rec], 1.0)
    assert m.completed == 0 and m.failed == 1
    assert math.isnan(m.ttft.mean) and math.isnan(m.itl.percentiles[99.0])
    assert m.schedule_lag.count == 0


def test_bad_selections_are_rejected(records: list[RequestRecord]) -> None:
    with pytest.raises(ValueError):
        compute_metrics(records, 1.0, selected_metrics=("ttft", "nope"))
    with pytest.raises(ValueError):
        compute_metrics(records, 1.0, percentiles=(101,))
    with pytest.raises(ValueError):
        compute_metrics(records, 1.0, goodput_slos_ms={"itl": 5})


def test_parsers() -> None:
    assert parse_goodput(["ttft:200", "TPOT:50.5"]) == {"ttft": 200.0, "tpot": 50.5}
    for bad in (["ttft"], ["itl:5"], ["ttft:fast"], ["ttft:-1"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)
    assert parse_percentile_metrics("ttft, e2el") == ("ttft", "e2el")
    with pytest.raises(ValueError):
        parse_percentile_metrics("ttft,latency")
    assert parse_percentiles("50,99.9") == (50.0, 99.9)
    with pytest.raises(ValueError):
        parse_percentiles("p99")
    assert percentile_key(99.0) == "99" and percentile_key(99.9) == "99.9"
