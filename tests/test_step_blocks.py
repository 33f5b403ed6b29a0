"""The codec + wire of each output step, judged per block under --until-resolved: output batches placed
in blocks by time (harness.loadgen.ipc), kept in the run document, read back as block values
(harness.analysis.blocks) and judged in the codec family (harness.analysis.verdicts)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.analysis.blocks import block_values
from harness.analysis.runs import RunEntry
from harness.analysis.verdicts import Arm, compare
from harness.loadgen.client import RequestRecord
from harness.loadgen.ipc import STEP_BLOCK_FIGURE, block_windows, step_block_means
from harness.loadgen.vllm_spans import ipc_budget

STEP = STEP_BLOCK_FIGURE


# --- placing output batches in blocks by time ---------------------------------------------------------------


def test_a_batch_belongs_to_the_block_whose_window_holds_its_encode_start():
    windows = [(100, 200), (300, 400), (500, 600), None]
    steps = [
        (100, 10.0),  # a window's first instant is inside it
        (150, 20.0),
        (200, 30.0),  # and so is its last
        (250, 1000.0),  # between two windows (a warmup, the other arm's turn): no block's
        (350, 40.0),
        (50, 1000.0),  # before every window
        (700, 1000.0),  # after every window
        (380, math.nan),  # a batch missing a span counts for none
    ]
    means = step_block_means(steps, windows)
    assert means[:2] == pytest.approx([20.0, 40.0])
    assert math.isnan(means[2])  # a block whose window holds no batch has no figure
    assert math.isnan(means[3])  # nor a block that sent nothing


def _record(index: int, send_ns: int, latency_s: float, chunks: list[float] | None = None) -> RequestRecord:
    rec = RequestRecord(index, 4, 2, 0.0, send_ns=send_ns, latency=latency_s, chunk_times=chunks or [])
    rec.success = math.isfinite(latency_s)
    return rec


def test_a_blocks_window_runs_from_its_first_send_to_its_last_end():
    records = [
        _record(0, 1_000, 0.000_5),  # ends at 501_000
        _record(1, 2_000, 0.000_2),  # ends at 202_000
        _record(2, 900_000, math.nan, chunks=[0.000_1, 0.000_3]),  # failed after its last chunk: ends at 1_200_000
        _record(3, 800_000, 0.000_05),
        RequestRecord(4, 4, 2, 0.0),  # never sent
    ]
    windows = block_windows([records[:2], records[2:4], records[4:]])
    assert windows == [(1_000, 501_000), (800_000, 1_200_000), None]


def test_the_batches_of_a_real_vllm_run_are_placed_by_their_plugin_rows():
    """The plugin's output encode ("oe") and decode ("od") rows, joined by batch stamp: encode + wire +
    decode is the decode's end less the encode's start."""
    rows: dict[str, list[list[Any]]] = {
        "rq": [],
        "rd": [],
        "oe": [
            ["oe", 1.5, 30_000, 31_000, None, 50, 1, []],
            ["oe", 2.5, 40_000, 42_000, None, 70, 1, []],
            ["oe", 3.5, 90_000, 91_000, None, 70, 1, []],  # between the windows
            ["oe", 4.5, 120_000, 121_000, None, 70, 1, []],  # never decoded: no step
        ],
        "od": [["od", 1.5, 33_000, 34_000, None, 50, 1], ["od", 2.5, 45_000, 47_000, None, 70, 1]],
    }
    result = ipc_budget(rows, [], windows=[(29_000, 50_000), (100_000, 130_000)])
    assert result.blocks[STEP][0] == pytest.approx((4.0 + 7.0) / 2)
    assert math.isnan(result.blocks[STEP][1])
    assert "blocks" in result.to_dict()
    assert not ipc_budget(rows, []).blocks  # a run not in blocks keeps none


# --- read back and judged ------------------------------------------------------------------------------------


def _doc(step_blocks: list[float | None] | None, ttfts: list[float | None], block_size: int = 2) -> dict:
    records = [
        {"index": i, "ttft": t, "success": t is not None, "codec_us": 50.0, "codec_wire_us": 100.0}
        for i, t in enumerate(ttfts)
    ]
    doc: dict[str, Any] = {"records": records, "metadata": {"flags": {"block_size": block_size}}, "ipc": {}}
    if step_blocks is not None:
        doc["ipc"]["blocks"] = {STEP: step_blocks}
    return doc


def test_block_values_read_the_kept_step_figure_and_void_a_block_with_a_failed_request():
    blocks = block_values(_doc([5.0, 6.0, 7.0], [0.01, 0.01, 0.01, None, 0.01]))
    assert blocks is not None
    assert blocks[STEP][0] == 5.0 and math.isnan(blocks[STEP][1]) and blocks[STEP][2] == 7.0
    # A round cut short kept fewer blocks than its records count: the rest have none.
    short = block_values(_doc([5.0], [0.01] * 6))
    assert short is not None and short[STEP][0] == 5.0 and math.isnan(short[STEP][2])
    old = block_values(_doc(None, [0.01] * 4))  # a file written before the step figure was kept
    assert old is not None and STEP not in old and "mean_ttft_ms" in old


def _arm(label: str, step_us: float, keep_steps: bool = True, rounds: int = 6) -> Arm:
    rng = np.random.default_rng(len(label))
    runs = []
    for r in range(rounds):
        steps = list(step_us * np.exp(0.02 * rng.standard_normal(5)))
        ttfts = list(0.02 * np.exp(0.03 * rng.standard_normal(10)))
        blocks = block_values(_doc(steps if keep_steps else None, ttfts))
        figures = {
            "mean_ttft_ms": float(np.mean(ttfts) * 1000),
            "first_token_path_us": 50.0,
            "first_token_codec_wire_us": 100.0,
            STEP: float(np.mean(steps)),
            "request_rate": 10.0,
        }
        runs.append(RunEntry(label, r, "ok", "", None, None, figures, blocks, until_resolved=1.0))
    return Arm(label, runs)


def test_a_sequential_comparison_judges_the_step_figure_in_the_codec_family():
    comparison = compare([_arm("a", 30.0), _arm("bb", 60.0)])
    assert comparison.sequential
    cell = comparison.cell("bb", STEP)
    assert cell is not None and cell.role == "codec"
    assert cell.verdict.sequential and cell.verdict.verdict == "slower"  # twice the µs in every block
    assert cell.verdict.block_pairs == 6 * 5


def test_runs_without_kept_step_blocks_leave_the_step_figure_not_judged_and_say_why():
    comparison = compare([_arm("a", 30.0, keep_steps=False), _arm("bb", 60.0)])
    cell = comparison.cell("bb", STEP)
    assert cell is not None and cell.verdict.verdict == "not judged"
    assert "no block values in the runs of a" in cell.verdict.text
    assert "written before" in cell.verdict.text
    first = comparison.cell("bb", "first_token_codec_wire_us")  # the per-request figures are judged as before
    assert first is not None and first.verdict.verdict != "not judged"


# --- end to end: wirebench's own server --------------------------------------------------------------------


@pytest.mark.slow
def test_until_resolved_judges_the_step_figure_from_block_pairs(tmp_path: Path):
    cmd = [sys.executable, "-m", "harness.cli", "run", "--result-dir", str(tmp_path), "--no-progress"]
    cmd += ["--codec", "msgspec,pickle", "--until-resolved", "0.6", "--executor", "sim"]
    cmd += ["--num-prompts", "12", "--block-size", "3", "--request-rate", "40", "--sonnet-output-len", "8"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (path,) = tmp_path.glob("compare-*.json")
    summary = json.loads(path.read_text())
    for run in summary["runs"]:
        steps = run["blocks"][STEP]  # 12 prompts in blocks of 3, the arms taking turns
        assert len(steps) == 4 and all(v is not None and v > 0 for v in steps), steps
        doc = json.loads((tmp_path / run["result_file"]).read_text())
        assert doc["ipc"]["blocks"][STEP] == steps
        assert all(r["send_ns"] > 0 for r in doc["records"])
    verdict = summary["comparison"]["verdicts"]["pickle"][STEP]
    assert verdict["role"] == "codec" and verdict["verdict"] != "not judged", verdict
    assert verdict["block_pairs"] == 4 * summary["metadata"]["until_resolved"]["rounds"]
