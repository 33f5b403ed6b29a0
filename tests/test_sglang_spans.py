"""harness/loadgen/sglang_spans without SGLang: the hook's files of three processes, written here, become
the run's codec figures and IPC budget, each message paired with its receipt by request ids and order."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.experiment.arms import parse_arms, parse_codecs
from harness.loadgen.ipc import STEP_BLOCK_FIGURE
from harness.loadgen.sglang_spans import SglangSpans

US = 1000  # ns


def _write(folder: Path, role: str, rows: list[list[Any]], ipc: str = "pickle") -> Path:
    meta = ["meta", {"role": role, "pid": 1, "clock": "CLOCK_MONOTONIC", "ipc": ipc}]
    path = folder / f"{role}-1.jsonl"
    with open(path, "a") as f:
        for row in ([meta] if not path.exists() or not path.stat().st_size else []) + rows:
            f.write(json.dumps(row) + "\n")
    return path


def _one_request(folder: Path, rid: str, t0: int) -> None:
    """Request ``rid`` sent at t0 (µs), through all three hops, with one output step of it alone."""
    t = lambda us: (t0 + us) * US  # noqa: E731 - times of this request, in ns
    _write(folder, "tokenizer", [["send", "TokenizedGenerateReqInput", rid, t(0), t(10), t(12), 2000]])
    _write(folder, "scheduler", [["recv", "TokenizedGenerateReqInput", rid, t(400), t(410), t(430), 2000]])
    _write(folder, "scheduler", [["send", "BatchTokenIDOutput", [rid], t(900), t(905), t(906), 300]])
    _write(folder, "detokenizer", [["recv", "BatchTokenIDOutput", [rid], t(0), t(915), t(925), 300]])
    _write(folder, "detokenizer", [["send", "BatchStrOutput", [rid], t(965), t(968), t(969), 100]])
    _write(folder, "tokenizer", [["recv", "BatchStrOutput", [rid], t(0), t(990), t(996), 100]])


def test_a_request_through_three_hops_has_each_span_and_the_codec_figures(tmp_path: Path) -> None:
    spans = SglangSpans(tmp_path)
    for role in ("tokenizer", "scheduler", "detokenizer"):
        _write(tmp_path, role, [])
    _one_request(tmp_path, "warm", 0)  # before the cursor: not the run's
    cursor = spans.cursor()
    _one_request(tmp_path, "r1", 10_000)
    _one_request(tmp_path, "r2", 20_000)

    figures, budget = spans.figures(cursor, ["r1", "r2"])
    assert figures is not None and figures.codec == "pickle"
    assert figures.request.messages == 2 and figures.request.encode_us == pytest.approx(10.0)
    assert figures.request.decode_us == pytest.approx(20.0)
    # Per step, both output hops: encode 5 + 3 µs, decode 10 + 6 µs, bytes 300 + 100.
    assert figures.output.messages == 2 and figures.output.encode_us == pytest.approx(8.0)
    assert figures.output.decode_us == pytest.approx(16.0) and figures.output.bytes_per_message == 400
    assert figures.first_token_path_us == pytest.approx(10 + 20 + 8 + 16)

    p50 = {name: s.p50_us for name, s in budget.spans.items()}
    assert budget.requests == 2
    assert p50["request.encode"] == pytest.approx(10) and p50["request.decode"] == pytest.approx(20)
    assert p50["request.queue"] == pytest.approx(400)  # sent → the scheduler took it between its steps
    assert budget.spans["request.wire"].count == 0 and budget.spans["output.queue"].count == 0
    assert (p50["output.encode"], p50["output.wire"], p50["output.decode"]) == pytest.approx((5, 10, 10))
    assert (p50["detok.encode"], p50["detok.wire"], p50["detok.decode"]) == pytest.approx((3, 22, 6))
    assert p50["detok.work"] == pytest.approx(40)  # the detokenizer's own, not IPC
    assert p50["ipc"] == pytest.approx(10 + 400 + 20 + 5 + 10 + 10 + 3 + 22 + 6)
    assert budget.codec_wire_us["r1"] == pytest.approx(10 + 20 + 5 + 10 + 10 + 3 + 22 + 6)  # no in-queue
    assert budget.codec_us["r2"] == pytest.approx(10 + 20 + 5 + 10 + 3 + 6)
    assert p50["step.encode"] == pytest.approx(8) and p50["step.wire"] == pytest.approx(32)


def test_messages_with_the_same_request_ids_pair_in_order(tmp_path: Path) -> None:
    spans = SglangSpans(tmp_path)
    _write(tmp_path, "tokenizer", [])
    _write(
        tmp_path, "scheduler", [["send", "BatchTokenIDOutput", ["a"], s * US, (s + 1) * US, 0, 10] for s in (1, 100)]
    )
    _write(
        tmp_path, "detokenizer", [["recv", "BatchTokenIDOutput", ["a"], 0, r * US, (r + 1) * US, 10] for r in (6, 150)]
    )
    _write(tmp_path, "detokenizer", [["send", "BatchStrOutput", ["a"], s * US, (s + 1) * US, 0, 5] for s in (11, 160)])
    _write(tmp_path, "tokenizer", [["recv", "BatchStrOutput", ["a"], 0, r * US, (r + 1) * US, 5] for r in (13, 170)])
    _, budget = spans.figures({}, [], windows=[(1, 50 * US), (90 * US, 200 * US), None])
    # Step 1: wires 4 + 1 µs; step 2: 49 + 9 µs (the k-th sent is the k-th received, not the nearest).
    assert budget.spans["step.wire"].p50_us == pytest.approx((5 + 58) / 2)
    blocks = budget.blocks[STEP_BLOCK_FIGURE]
    assert blocks[0] == pytest.approx(1 + 4 + 1 + 1 + 1 + 1) and blocks[1] == pytest.approx(1 + 49 + 1 + 1 + 9 + 1)
    assert math.isnan(blocks[2])  # a block that sent nothing


def test_a_process_without_timings_makes_the_budget_unavailable(tmp_path: Path) -> None:
    _write(tmp_path, "tokenizer", [])
    _write(tmp_path, "scheduler", [])
    figures, budget = SglangSpans(tmp_path).figures({}, ["r"])
    assert figures is None and "detokenizer" in budget.unavailable and "hook" in budget.unavailable


def test_msgpack_mode_is_the_msgspec_codec(tmp_path: Path) -> None:
    for role in ("tokenizer", "scheduler", "detokenizer"):
        _write(tmp_path, role, [], ipc="msgpack")
    _one_request(tmp_path, "r", 0)
    figures, _ = SglangSpans(tmp_path).figures({}, ["r"])
    assert figures is not None and figures.codec == "msgspec"


def test_sglang_arms_are_its_own_ipc_modes_and_nothing_else() -> None:
    assert [a.codec for a in parse_codecs("all", "sglang")] == ["pickle", "msgspec"]
    assert [a.label for a in parse_codecs("pickle,pickle", "sglang")] == ["pickle", "pickle#2"]
    for bad in ("vllm", "msgspec-oob", "pickle+request-delay=500us"):
        with pytest.raises(ValueError, match="SGLang's own IPC modes, pickle or msgspec"):
            parse_codecs(bad, "sglang")
    (arm,) = parse_arms("msgspec", "shm", "sglang")
    assert "--transport zmq" in (replace(arm, server="sglang").unsupported() or "")  # a real SGLang's: refused


def test_nested_pickles_count_in_their_messages_encode_and_decode(tmp_path: Path) -> None:
    """msgpack mode: a wrap belongs to the process's next send; unwraps go to the receives in order (the
    scheduler takes r1 and r2, then unwraps each), a second unwrap of one message to its latest."""
    t = lambda us: us * US  # noqa: E731
    for role in ("detokenizer",):
        _write(tmp_path, role, [], ipc="msgpack")
    _write(tmp_path, "tokenizer", [["wrap", "TimeStats", None, t(1), t(1), t(4), 0]], ipc="msgpack")
    _write(tmp_path, "tokenizer", [["send", "TokenizedGenerateReqInput", "r1", t(5), t(10), t(11), 900]])
    _write(tmp_path, "tokenizer", [["wrap", "TimeStats", None, t(12), t(12), t(14), 0]])
    _write(tmp_path, "tokenizer", [["send", "TokenizedGenerateReqInput", "r2", t(15), t(20), t(21), 900]])
    _write(tmp_path, "scheduler", [["recv", "TokenizedGenerateReqInput", "r1", t(30), t(31), t(33), 900]], "msgpack")
    _write(tmp_path, "scheduler", [["recv", "TokenizedGenerateReqInput", "r2", t(34), t(35), t(37), 900]])
    _write(tmp_path, "scheduler", [["unwrap", "TimeStats", None, t(40), t(40), t(47), 0]])
    _write(tmp_path, "scheduler", [["unwrap", "TimeStats", None, t(48), t(48), t(51), 0]])
    _write(tmp_path, "scheduler", [["unwrap", "dict", None, t(52), t(52), t(53), 0]])
    figures, budget = SglangSpans(tmp_path).figures({}, ["r1", "r2"])
    assert figures is not None
    assert figures.request.encode_us == pytest.approx(((5 + 3) + (5 + 2)) / 2)
    assert figures.request.decode_us == pytest.approx(((2 + 7) + (2 + 3 + 1)) / 2)
    assert budget.spans["request.decode"].count == 2


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--sglang-args", "--port 8000"], "--sglang-args: --port: bench run sets it"),
        (["--arm-flags", "pickle=SGLANG_USE_PICKLE_IPC=0"], "SGLANG_USE_PICKLE_IPC is the arm's codec"),
        (["--sglang-env", "SGLANG_USE_PICKLE_IPC=0"], "SGLANG_USE_PICKLE_IPC is each arm's codec"),
        (["--transport", "shm"], "a real SGLang moves its messages its own way"),
    ],
)
def test_what_bench_run_sets_itself_is_refused_before_any_server_starts(flags: list[str], said: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--server", "sglang", "--codec", "pickle,msgspec"]
        + ["--sglang-python", sys.executable, *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and said in done.stderr, done.stderr[-1000:]
    assert "Traceback" not in done.stderr
