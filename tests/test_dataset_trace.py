"""``trace``: Mooncake lines to prompts of the right length, shared hash ids to shared prefixes, timestamps
to send times (sped up), and errors naming the file and the line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.cli import build_parser
from harness.experiment.flags import experiment_from_args
from harness.loadgen.arrivals import planned_offsets
from harness.tokenizers.tokenizer import TextTokenizer, load_tokenizer
from harness.workloads.files import SAMPLES_DIR, DatasetFileError
from harness.workloads.trace import TraceOptions, read_trace, sample_trace_requests


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return load_tokenizer()


def line(ts: float, n_in: int, n_out: int, ids: list[int]) -> dict[str, Any]:
    return {"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


def write(tmp_path: Path, *lines: Any) -> Path:
    file = tmp_path / "trace.jsonl"
    file.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return file


LINES = [
    line(0, 1100, 30, [0, 1, 2]),
    line(500, 700, 10, [0, 3]),  # shares block 0 with the first
    line(500, 1536, 20, [0, 1, 4]),  # shares blocks 0 and 1
    line(2000, 300, 5, [5]),
]


def test_lengths_prefixes_and_arrivals(tok: TextTokenizer, tmp_path: Path) -> None:
    file = write(tmp_path, *LINES)
    requests = sample_trace_requests(tok, 4, TraceOptions(trace_speedup=2.0), dataset_path=file)
    assert [r.prompt_len for r in requests] == [1100, 700, 1536, 300]
    assert [r.expected_output_len for r in requests] == [30, 10, 20, 5]
    assert [r.arrival_s for r in requests] == [0.0, 0.25, 0.25, 1.0]  # ms / 1000 / speed-up

    ids = [tok.encode(r.prompt) for r in requests]
    assert ids[0][:512] == ids[1][:512] == ids[2][:512]  # block 0
    assert ids[0][:1024] == ids[2][:1024]  # blocks 0 and 1
    assert ids[0][512:520] != ids[1][512:520] and ids[0][:8] != ids[3][:8]  # different ids, different text
    # The same seed, the same prompts; another seed, other text for the same ids.
    assert requests == sample_trace_requests(tok, 4, TraceOptions(trace_speedup=2.0), dataset_path=file)
    assert sample_trace_requests(tok, 1, dataset_path=file, seed=1)[0].prompt != requests[0].prompt


def test_the_runner_sends_at_the_trace_times_and_rate_mode_leaves_them_out(tok: TextTokenizer, tmp_path: Path) -> None:
    file = write(tmp_path, *LINES)
    requests = sample_trace_requests(tok, 4, dataset_path=file)
    assert planned_offsets(requests, request_rate=3.0) == [0.0, 0.5, 0.5, 2.0]
    by_rate = sample_trace_requests(tok, 4, TraceOptions(trace_arrivals="rate"), dataset_path=file)
    assert all(r.arrival_s is None for r in by_rate)
    assert planned_offsets(by_rate) == [0.0] * 4  # --request-rate inf
    assert [r.prompt for r in by_rate] == [r.prompt for r in requests]


def test_a_short_trace_is_replayed_and_lines_are_put_in_time_order(tok: TextTokenizer, tmp_path: Path) -> None:
    file = write(tmp_path, line(1000, 10, 4, [7]), line(0, 20, 4, [8]))
    assert [x.timestamp_ms for x in read_trace(file)] == [0.0, 1000.0]
    requests = sample_trace_requests(tok, 5, dataset_path=file)
    # Period: the span plus one mean interval (1 s + 1 s).
    assert [r.arrival_s for r in requests] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert [r.prompt_len for r in requests] == [20, 10, 20, 10, 20]
    # More tokens than the hash ids cover: the rest comes from the request's own blocks.
    [long] = sample_trace_requests(
        tok, 1, TraceOptions(trace_block_size=8), dataset_path=write(tmp_path, line(0, 20, 1, [1]))
    )
    assert long.prompt_len == 20


def test_the_shipped_sample_and_the_flags() -> None:
    argv = ["run", "--dataset-name", "trace", "--trace-speedup", "4", "--num-prompts", "100"]
    parser, _ = build_parser(argv)
    exp = experiment_from_args(parser.parse_args(argv))
    assert exp.workload.options == TraceOptions(trace_speedup=4.0)
    recorded = exp.record()
    assert (recorded["dataset_name"], recorded["trace_speedup"], recorded["trace_block_size"]) == ("trace", 4.0, 512)
    lines = read_trace(SAMPLES_DIR / "trace-sample.jsonl")
    assert len(lines) == 100 and lines[0].timestamp_ms == 0
    firsts = [x.hash_ids[0] for x in lines]
    assert max(firsts.count(i) for i in set(firsts)) > 10  # the sample has shared prefixes to hit


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([line(0, 5, 1, [1]), '{"timestamp": 1, "input_length": 5'], "trace.jsonl, line 2: bad JSON"),
        ([line(0, 5, 1, [1]), {"timestamp": 1, "output_length": 3}], "line 2: missing field 'input_length'"),
        ([line(-1, 5, 1, [1])], "line 1: field 'timestamp' must be a finite number >= 0"),
        (['{"timestamp": NaN, "input_length": 5, "output_length": 1}'], "line 1: field 'timestamp' must be a finite"),
        (['{"timestamp": Infinity, "input_length": 5, "output_length": 1}'], "line 1: field 'timestamp' must be a fin"),
        ([line(0, 5, 1, [1]), line(1e300, 5, 1, [1])], r"line 2: timestamp 1e\+300 ms is .* h after the trace's first"),
        ([line(5, 5, 1, [1]), line(1e7 + 5, 5, 1, [1])], None),  # 2.8 h: within a day, allowed (and announced)
        ([line(0, 0, 1, [1])], "line 1: field 'input_length' must be from 1 to 1048576 tokens, got 0"),
        ([line(0, 100_000_000, 5, [1])], "line 1: field 'input_length' must be from 1 to 1048576 tokens"),
        ([line(0, 5, 10**12, [1])], "line 1: field 'output_length' must be from 1 to 1048576 tokens"),
        ([{**line(0, 5, 1, []), "hash_ids": ["a"]}], "line 1: field 'hash_ids' must be a list of integers"),
        ([{"timestamp": "0", "input_length": 5, "output_length": 1}], "line 1: field 'timestamp' must be int or float"),
    ],
)
def test_a_bad_line_is_named(tok: TextTokenizer, tmp_path: Path, lines: list[Any], message: str | None) -> None:
    if message is None:
        sample_trace_requests(tok, 1, dataset_path=write(tmp_path, *lines))
        return
    with pytest.raises(DatasetFileError, match=message):
        sample_trace_requests(tok, 1, dataset_path=write(tmp_path, *lines))


@pytest.mark.slow
def test_bench_run_replays_the_sample_trace_with_two_codecs(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "harness.cli", "run", "--result-dir", str(tmp_path), "--no-progress"]
    cmd += ["--dataset-name", "trace", "--trace-speedup", "10", "--codec", "msgspec,pickle"]
    cmd += ["--num-prompts", "20", "--repeat", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (summary_file,) = tmp_path.glob("compare-*.json")
    summary = json.loads(summary_file.read_text())
    assert {r["codec"] for r in summary["runs"]} == {"msgspec", "pickle"}
    assert all(r["status"] == "ok" for r in summary["runs"])
    result = json.loads((tmp_path / summary["runs"][0]["result_file"]).read_text())
    assert result["completed"] == 20
    assert result["metadata"]["flags"]["dataset_name"] == "trace" and result["metadata"]["own_send_times"] is True
    assert "[probe]" not in done.stdout and summary["metadata"]["request_rate"]["dataset_arrivals"]  # no rate to find
    lines = read_trace(SAMPLES_DIR / "trace-sample.jsonl")[:20]
    assert result["input_lens"] == [x.input_length for x in lines]
