"""The benchmark gate's workflow (.github/workflows/bench.yml): its steps, run here as a runner would.

The slow test clones this repository, checks the base out into a worktree
beside it exactly as the workflow does (the base is the same commit: an A/A
job), sets both up with their own scripts/setup.sh, and runs the gate with a
quick recipe (WB_GATE_RUN_ARGS / WB_GATE_COUNT_ARGS). Only the `uses:` steps
(checkout, artifact upload) are the runner's own and are stood in for.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "bench.yml"
QUICK_RUN = "--executor sim --num-prompts 40 --block-size 10 --repeat 3 --request-rate 20"
QUICK_COUNT = "--codec msgspec --payload text-550 --calls 20 --layouts 1"  # one layout: 3 callgrind children a build


def steps() -> list[dict[str, Any]]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    return doc["jobs"]["gate"]["steps"]


def test_the_workflow_checks_out_the_base_sets_up_both_and_gates() -> None:
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert "pull_request" in doc[True]  # YAML reads the key `on` as True
    runs = [s["run"] for s in steps() if "run" in s]
    uses = [s["uses"] for s in steps() if "uses" in s]
    assert uses[0].startswith("actions/checkout@") and steps()[0]["with"]["fetch-depth"] == 0
    assert any("git worktree add ../base" in r for r in runs)
    assert any("scripts/setup.sh" in r and "cd ../base" in r for r in runs)
    assert any(r.strip().startswith("scripts/ci_gate.sh ../base") for r in runs)


@pytest.mark.slow  # a clone, two venvs and the gate: 8 min on 2 cores
@pytest.mark.valgrind  # the gate's instruction counts
@pytest.mark.alone  # its A/A latency gate must not judge the other worker's load
@pytest.mark.timeout(1500)
def test_the_workflow_steps_run_here(tmp_path: Path) -> None:
    head = tmp_path / "head"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(head)], check=True, timeout=120)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=head, capture_output=True, text=True, check=True).stdout
    env = {
        **os.environ,
        "BASE_SHA": sha.strip(),
        "WB_GATE_RUN_ARGS": QUICK_RUN,
        "WB_GATE_COUNT_ARGS": QUICK_COUNT,
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
    }
    env.pop("VIRTUAL_ENV", None)
    codes = []
    for step in steps():
        if "run" not in step:
            continue  # actions/checkout: the clone above; upload-artifact: the files stay in tmp_path
        out = subprocess.run(
            ["bash", "-eo", "pipefail", "-c", step["run"]],
            cwd=head,
            # A step's own env is the runner's (${{ ... }} expressions): the values above stand in.
            env={**{k: str(v) for k, v in step.get("env", {}).items() if "${{" not in str(v)}, **env},
            capture_output=True,
            text=True,
            timeout=1200,
        )
        codes.append((step["name"], out.returncode, out.stdout[-3000:] + out.stderr[-3000:]))
        if step["run"].strip().startswith("scripts/ci_gate.sh"):
            # The gate's log reads in a 100-column terminal or CI log pane (each command's default).
            assert [line for line in out.stdout.splitlines() if len(line) > 100] == [], out.stdout
            break
        assert out.returncode == 0, codes[-1]
    name, code, log = codes[-1]
    gate_dir = head / "results" / "ci-gate"
    latency = json.loads((gate_dir / "latency-gate.json").read_text())
    # One build against itself: never a regression; 3 rounds of 40 requests may not rule one out (3).
    assert latency["exit_code"] in (0, 3) and latency["arms"][0]["arm"] == "head", log
    assert latency["base"] == "base" and latency["primary"] == "mean_ttft_ms"
    assert "instruction gate exit 0" in log, log  # the same code counts the same instructions
    assert code == latency["exit_code"], log
    base_counts = json.loads((gate_dir / "instructions-base.json").read_text())
    assert base_counts["kind"] == "instructions" and base_counts["calls"]
    assert (tmp_path / "summary.md").read_text().startswith("### wirebench regression gate")
    # The base arm really ran the base checkout's Python.
    runs = sorted((gate_dir / "latency").glob("base-r*.json"))
    assert runs and json.loads(runs[0].read_text())["metadata"]["flags"]["server_python"] == str(
        tmp_path / "base" / ".venv" / "bin" / "python"
    )
