"""End to end: `bench load` ramps its rate against wirebench's own server (`bench serve`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.loadgen.ramp import EXPONENTIAL, Ramp

from serve_process import bench_load


@pytest.mark.slow
def test_bench_load_ramps_the_offered_rate_and_reports_ttft_and_codec_per_bucket(tmp_path: Path) -> None:
    ramp = ["--ramp-up-strategy", "exponential", "--ramp-up-start-rps", "4", "--ramp-up-end-rps", "64"]
    done = bench_load([*ramp, "--num-prompts", "20", "--sonnet-output-len", "4"], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    title = next(i for i, line in enumerate(lines) if "TTFT and codec by offered rate" in line)
    header, *rows = lines[title + 1 : title + 7]
    assert all(len(line) <= 100 for line in (header, *rows))
    assert "TTFT p50 ms" in header and "codec µs" in header  # the server's timelines gave each request's codec µs
    assert [row.split()[0] for row in rows] == ["4–6.96", "6.96–12.1", "12.1–21.1", "21.1–36.8", "36.8–64"]
    assert sum(int(row.split()[1]) for row in rows) == 20
    assert all(float(row.split()[-2]) > 0 for row in rows if int(row.split()[1]))  # codec µs measured

    (path,) = tmp_path.glob("*.json")
    doc = json.loads(path.read_text())
    records = doc["records"]
    assert [r["offered_rps"] for r in records] == pytest.approx(Ramp(EXPONENTIAL, 4.0, 64.0).rates(20))
    assert records[0]["offered_rps"] == 4.0 and records[-1]["offered_rps"] == pytest.approx(64.0)
    sends = [r["planned_send"] for r in records]
    assert sends == sorted(sends) and sends[0] == 0.0
    flags = doc["metadata"]["flags"]
    assert (flags["ramp_up_strategy"], flags["ramp_up_start_rps"], flags["ramp_up_end_rps"]) == (EXPONENTIAL, 4, 64)
