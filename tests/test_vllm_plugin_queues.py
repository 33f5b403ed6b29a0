"""The plugin's timing of vLLM's engine queues: the wrapped EngineCoreProc methods write "ra" and "oq"
records beside the codec's, and a run's IPC budget joins them into the two queue spans wirebench's own
server has (engine input queue, output queue before encode), summed into the IPC total."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.loadgen.ipc import report_lines
from harness.loadgen.vllm_spans import PluginSpans, ipc_budget
from harness.processes.jsonl_records import read_rows
from harness.vllm_plugin.queues import hook_engine_queues
from harness.vllm_plugin.records import Recorder, Recorders


@dataclass
class Request:  # vLLM's Request, as add_request gets it: the plugin reads its id
    request_id: str


@dataclass
class Outputs:  # vLLM's EngineCoreOutputs: the plugin reads its stamp
    timestamp: float
    outputs: list[Any] = field(default_factory=list)


class Engine:
    """The shape of vLLM's EngineCoreProc that the hooks wrap."""

    def __init__(self) -> None:
        self.scheduled: list[str] = []
        self.next_step: Any = ({}, False)

    def add_request(self, request: Request, request_wave: int = 0) -> None:
        if not request.request_id:
            raise ValueError("request_id must be a string")
        self.scheduled.append(request.request_id)

    def step(self) -> Any:
        return self.next_step

    def step_with_batch_queue(self) -> Any:
        return self.next_step


def _hooked(tmp_path: Path, folder: str | None = "spans") -> tuple[type[Engine], Recorders]:
    """Fresh engine classes (hooks are class-wide), their records in tmp_path/folder."""
    base = type("Engine", (Engine,), {})
    recorders = Recorders(str(tmp_path / folder) if folder else None, {"codec": "vllm", "clock": "c"})
    hook_engine_queues(base, lambda: recorders.get("engine"))
    return base, recorders


def _written(recorders: Recorders) -> list[list[Any]]:
    rec = recorders.get("engine")
    assert rec is not None
    rec.flush()
    rows, _ = read_rows(rec.path)
    return rows[1:]


def test_a_request_added_and_each_batch_a_step_returns_are_recorded_on_one_clock(tmp_path: Path) -> None:
    engine_class, recorders = _hooked(tmp_path)
    engine = engine_class()
    engine.add_request(Request("cmpl-a-0-x"), 0)
    engine.next_step = ({0: Outputs(1.5), 1: Outputs(1.6)}, True)
    returned = engine.step()
    assert returned is engine.next_step and engine.scheduled == ["cmpl-a-0-x"]  # vLLM's work unchanged
    engine.next_step = (None, False)  # a batch queue's step that returned nothing yet
    assert engine.step_with_batch_queue() == (None, False)
    rows = _written(recorders)
    assert [r[:2] for r in rows] == [["ra", "cmpl-a-0-x"], ["oq", 1.5], ["oq", 1.6]]
    added, queued = rows[0][2], rows[1][2]
    assert 0 < added <= queued == rows[2][2]  # ns of CLOCK_MONOTONIC, one time for a step's batches


def test_a_subclass_that_calls_the_hooked_method_is_timed_and_a_refused_request_is_not(tmp_path: Path) -> None:
    engine_class, recorders = _hooked(tmp_path)

    def add_request(self: Engine, request: Request, request_wave: int = 0) -> None:
        engine_class.add_request(self, request, request_wave)  # super()'s, the hooked one

    # As vLLM's DPEngineCoreProc: its own add_request, which calls the hooked one.
    parallel = type("Parallel", (engine_class,), {"add_request": add_request})
    parallel().add_request(Request("cmpl-b-0-y"))
    with pytest.raises(ValueError):
        engine_class().add_request(Request(""))  # vLLM's own refusal goes through, unrecorded
    assert [r[:2] for r in _written(recorders)] == [["ra", "cmpl-b-0-y"]]


def test_a_step_shaped_otherwise_is_passed_on_untimed_and_records_off_cost_no_file(tmp_path: Path) -> None:
    engine_class, recorders = _hooked(tmp_path)
    engine = engine_class()
    for odd in (None, [Outputs(2.0)], ([Outputs(2.0)], True), ()):
        engine.next_step = odd
        assert engine.step() is odd
    assert _written(recorders) == []
    quiet_class, quiet = _hooked(tmp_path, folder=None)  # the codec swapped, nothing timed
    quiet_engine = quiet_class()
    quiet_engine.add_request(Request("cmpl-c-0-z"))
    assert quiet.get("engine") is None and quiet_engine.scheduled == ["cmpl-c-0-z"]


def test_a_record_that_cannot_be_written_is_said_once_and_the_rest_still_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rec = Recorder(str(tmp_path), "engine", {})
    rec.add(("oq", object(), 5))  # no stamp: a message laid out otherwise
    rec.add(("ra", Request("cmpl-d-0-w"), 6))
    rec.flush()
    rows, _ = read_rows(rec.path)
    assert rows[1:] == [["ra", "cmpl-d-0-w", 6]]
    assert "cannot write a 'oq' record: AttributeError" in capsys.readouterr().err


# --- the join ----------------------------------------------------------------------------------------------


def _rows_with_queues() -> dict[str, list[list[Any]]]:
    """Two requests of the run, as tests/test_vllm_server.py's, with the engine's queue records."""
    return {
        "rq": [
            ["rq", "cmpl-a-0", "cmpl-a-0-x", 1_000, 3_000, None, 100, 1],
            ["rq", "cmpl-b-0", "cmpl-b-0-y", 10_000, 14_000, None, 300, 1],
        ],
        "rd": [
            ["rd", "cmpl-a-0", "cmpl-a-0-x", 5_000, 8_000, None, 100, 1],
            ["rd", "cmpl-b-0", "cmpl-b-0-y", 15_000, 17_000, None, 300, 1],
        ],
        "ra": [["ra", "cmpl-a-0-x", 12_000], ["ra", "cmpl-b-0-y", 19_000]],
        "oe": [
            ["oe", 1.5, 30_000, 31_000, None, 50, 1, ["cmpl-a-0-x"]],
            ["oe", 2.5, 40_000, 42_000, None, 70, 1, ["cmpl-a-0-x", "cmpl-b-0-y"]],
        ],
        "oq": [["oq", 1.5, 26_000], ["oq", 2.5, 37_000]],
        "od": [["od", 1.5, 33_000, 34_000, None, 50, 1], ["od", 2.5, 45_000, 47_000, None, 70, 1]],
    }


def test_the_queues_join_by_request_id_and_batch_stamp_and_the_total_sums_all_eight_spans() -> None:
    result = ipc_budget(_rows_with_queues(), ["cmpl-a", "cmpl-b"])
    spans = result.spans
    # decode end → added: 8000→12000 (4 µs), 17000→19000 (2 µs)
    assert spans["request.queue"].count == 2 and spans["request.queue"].mean_us == pytest.approx(3.0)
    # the first-token batch's queued → encode start: a: 26000→30000 (4 µs), b: batch 2.5, 37000→40000 (3 µs)
    assert spans["output.queue"].count == 2 and spans["output.queue"].mean_us == pytest.approx(3.5)
    a_ipc = (2 + 2 + 3 + 1 + 2 + 1) + 4 + 4
    b_ipc = (4 + 1 + 2 + 2 + 3 + 2) + 2 + 3
    assert spans["ipc"].mean_us == pytest.approx((a_ipc + b_ipc) / 2)
    # The per-request codec + wire figure stays the codec's and the wire's alone.
    assert result.codec_wire_us["cmpl-a"] == pytest.approx(2 + 2 + 3 + 1 + 2 + 1)
    lines = report_lines(result, mean_ttft_ms=1.0, width=80)
    for label in ("Engine input queue", "Output queue before encode"):
        (row,) = [line for line in lines if line.startswith(label)]
        assert row.split()[-1] != "-" and " / " in row, row
    assert any(line.startswith("IPC (codec, wire, queues) % of TTFT:") for line in lines), lines


def test_a_request_whose_queue_point_is_missing_has_no_total_as_on_wirebenchs_server() -> None:
    rows = _rows_with_queues()
    rows["ra"] = [["ra", "cmpl-a-0-x", 12_000], ["ra", "cmpl-a-0-x", 99_000]]  # b never added; a twice
    spans = ipc_budget(rows, ["cmpl-a", "cmpl-b"]).spans
    assert spans["request.queue"].count == 1 and spans["request.queue"].mean_us == pytest.approx(4.0)  # the first
    assert spans["ipc"].count == 1  # b's total would leave out a span: NaN, not a smaller sum


def test_records_without_the_queues_leave_them_out_of_the_total() -> None:
    """A plugin that did not time the queues: the two spans are NaN and the total is codec + wire."""
    rows = _rows_with_queues()
    rows["ra"], rows["oq"] = [], []
    spans = ipc_budget(rows, ["cmpl-a", "cmpl-b"]).spans
    assert math.isnan(spans["request.queue"].mean_us) and math.isnan(spans["output.queue"].mean_us)
    assert spans["ipc"].count == 2


def test_a_servers_folder_is_read_with_its_queue_records(tmp_path: Path) -> None:
    """The files as the two processes write them (meta line first); only rows after the cursor count."""
    rows = _rows_with_queues()
    meta = {"codec": "vllm", "clock": "boot-1"}
    files = {"api": ("rq", "od"), "engine": ("rd", "ra", "oe", "oq")}
    for role, kinds in files.items():
        lines = [["meta", {"role": role, "pid": 1, **meta}], *(row for kind in kinds for row in rows[kind])]
        (tmp_path / f"{role}-1.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    figures, result = PluginSpans(tmp_path).figures({}, ["cmpl-a", "cmpl-b"])
    assert figures is not None and result.requests == 2
    assert result.spans["request.queue"].mean_us == pytest.approx(3.0)
    assert result.spans["output.queue"].mean_us == pytest.approx(3.5)
