"""Every committed baseline still loads at the schema version the project writes now.

The layout moved the code that reads these files; the files did not change, so each is read
back through the reader its kind has (``harness.analysis.documents.SCHEMAS``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.analysis import instruction_counts as ic
from harness.analysis.documents import SCHEMAS
from harness.analysis.sweep_plots import draw_e2e, draw_micro
from harness.analysis.sweep_stats import all_crossings
from harness.analysis.verdicts import compare, load_any_compare

BASELINES = Path(__file__).resolve().parents[1] / "results" / "baselines"
# Measurements of helper scripts (client capacity, packed micro, the transport client): no schema of ours.
SCRIPT_OUTPUTS = {
    "client_capacity.json",
    "sglang-nested-pickles.json",
    "sglang-nested-pickles-batch.json",
    "sglang-output-parts.json",
    "long-context-by-length.json",
    "multi-turn-by-turn.json",
    "sglang-hook-overhead.json",
    "copy-after-idle.json",
    "gemm-h200.json",
    "loop-cpu.json",
    "big-bodies.json",
    "big-bodies-no-pause.json",
    "logprob-streams.json",
    "overlap-sim.json",
    "step-profile-batch.json",
    "step-profile-overlap.json",
    "seed-10245-client.json",
    "seed-10245-27rounds-client.json",
    "seed-10245-38rounds-client.json",
    "seed-10245-requests-58rounds-client.json",
    "seed-10245-outputs-36rounds-client.json",
    "seed-10245-v1-30rounds-client.json",
    "seed-10245-api-server-client.json",
    "gc-pauses.json",
    "seed-10245-api-server-ab-client.json",
    "seed-10245-vllm-client.json",
    "hostile-costs.json",
    "packed-micro.json",
    "tekken-cpu.json",
    "tekken-ids.json",
    "transport-client.json",
    "vllm-parts.json",
    "vllm-timing-check.json",
    "vllm-plugin-overhead.json",
    "vllm-inside-micro.json",
    "sequential-calibration.json",
    "block-handover.json",
}


def _documents() -> list[Path]:
    return sorted(p for p in BASELINES.glob("*.json") if p.name not in SCRIPT_OUTPUTS)


@pytest.mark.parametrize("path", _documents(), ids=lambda p: p.name)
def test_a_committed_baseline_loads_at_the_current_schema(path: Path) -> None:
    doc = json.loads(path.read_text())
    if isinstance(doc, list):  # a micro document: one object per cell
        assert {cell["schema_version"] for cell in doc} == {SCHEMAS["micro"]}
        return
    assert doc["schema_version"] == SCHEMAS[doc["kind"]]
    if doc["kind"] == "compare":
        arms = load_any_compare(path)
        measured = [a for a in arms if a.measured]
        assert measured, path.name
        if len(measured) >= 2:  # re-judged from the figures the file embeds
            assert compare(measured).cells
    elif doc["kind"] == "gate-jobs":  # the gate's measured rates: the counts add up to the jobs listed
        codes = [j["exit_code"] for j in doc["per_job"]]
        assert doc["jobs"] == len(codes) == sum(doc["exit_codes"].values())
        assert {str(c): codes.count(c) for c in set(codes)} == doc["exit_codes"]
    elif doc["kind"] == "instructions":  # the gate's baseline for counts: against itself, a pass
        assert ic.judge(doc, ic.check_document(doc, path.name)).exit_code == ic.EXIT_PASS
    else:
        assert [c["text"] for c in all_crossings(doc)] == [c["text"] for c in doc["crossings"]]
        assert draw_micro(doc) is not None or draw_e2e(doc) is not None
