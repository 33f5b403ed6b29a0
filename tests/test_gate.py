"""The CI gate (bench compare --gate) and bench compare on saved files.

Compare files come from the project's own writers (tests/test_results.py's
write_comparison: made-up figures with seeded round-to-round noise), so what is
checked is the gate's decisions on data with a known truth, not timing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_results import BASE, write_comparison

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 7
BASELINES = ROOT / "results" / "baselines"
NOISE = 0.02


def bench(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *map(str, args)], capture_output=True, text=True, timeout=120
    )


def gate(compare_file: Path, *flags: object) -> subprocess.CompletedProcess[str]:
    return bench("compare", compare_file, "--gate", *flags)


def gate_document(compare_file: Path, *flags: object) -> tuple[subprocess.CompletedProcess[str], dict]:
    """The gate's run and the JSON document it wrote (--json beside the compare file)."""
    path = compare_file.parent / "gate.json"
    out = gate(compare_file, "--json", path, *flags)
    assert out.returncode in (0, 1, 3), out.stdout + out.stderr
    return out, json.loads(path.read_text())


def noisy(folder: Path, specs: dict, seed: int, repeat: int = ROUNDS, noise: float = NOISE) -> Path:
    return write_comparison(folder, specs, repeat=repeat, noise=noise, seed=seed)


CLEAN = {"failed": False}  # make_result's runs have one failed request unless told otherwise
AA = {"base": CLEAN, "head": CLEAN}


def test_the_same_build_twice_passes(tmp_path: Path) -> None:
    out, doc = gate_document(noisy(tmp_path / "aa", AA, seed=2))
    assert out.returncode == doc["exit_code"] == 0, out.stdout + out.stderr
    assert [(a["arm"], a["outcome"]) for a in doc["arms"]] == [("head", "ok")]
    assert doc["base"] == "base" and doc["primary"] == "mean_ttft_ms"


def test_a_slower_head_fails_and_says_so_in_markdown_and_json(tmp_path: Path) -> None:
    slower = noisy(tmp_path / "slow", {"base": CLEAN, "head": {**CLEAN, "scale": 1.1}}, seed=3)
    out = gate(slower, "--markdown", tmp_path / "gate.md", "--json", tmp_path / "gate.json")
    assert out.returncode == 1, out.stdout + out.stderr
    doc = json.loads((tmp_path / "gate.json").read_text())
    assert doc["exit_code"] == 1 and doc["arms"][0]["outcome"] == "REGRESSION"
    assert doc["arms"][0]["primary"]["verdict"] == "slower" and doc["primary"] == "mean_ttft_ms"
    assert "**REGRESSION**" in (tmp_path / "gate.md").read_text()
    # Statistically slower but by less than the threshold: not a regression.
    assert gate(slower, "--threshold-pct", "40").returncode == 0


def test_only_the_primary_decides_the_secondary_figures_are_reported(tmp_path: Path) -> None:
    # The head's request encode is 3x the base's, its latencies the same: the primary (TTFT) passes.
    codec_only = noisy(tmp_path / "codec", {"base": CLEAN, "head": {**CLEAN, "enc_us": 90.0}}, seed=4)
    out, doc = gate_document(codec_only)
    assert out.returncode == doc["exit_code"] == 0, out.stdout + out.stderr
    (head,) = doc["arms"]
    assert head["outcome"] == "ok" and head["primary"]["verdict"] in ("equivalent", "inconclusive")
    encode = head["secondary"]["request_encode_us"]  # reported, deciding nothing
    assert encode["verdict"] == "slower" and encode["change_pct"] == pytest.approx(200, abs=10)
    # The same change gated on that figure as the primary fails.
    assert gate(codec_only, "--primary", "request_encode_us").returncode == 1
    out = gate(codec_only, "--primary", "nope")
    assert out.returncode == 2 and "primary figure 'nope' is not judged here" in out.stderr


def test_the_gate_cannot_say_when_rounds_are_too_few_or_too_noisy(tmp_path: Path) -> None:
    out, doc = gate_document(noisy(tmp_path / "two", AA, seed=5, repeat=2))
    assert out.returncode == doc["exit_code"] == 3
    assert doc["arms"][0]["outcome"] == "noisy" and doc["arms"][0]["primary"]["verdict"] == "too few rounds"
    out, doc = gate_document(noisy(tmp_path / "noisy", AA, seed=5, repeat=4, noise=0.3))
    assert out.returncode == doc["exit_code"] == 3
    (head,) = doc["arms"]
    assert head["outcome"] == "noisy" and head["primary"]["verdict"] == "inconclusive"
    assert head["primary"]["rounds_needed"] > head["primary"]["rounds"]  # a new run's rounds, not a top-up


def test_missing_arms_and_runs_with_failures(tmp_path: Path) -> None:
    out, doc = gate_document(noisy(tmp_path / "dead", {"base": CLEAN, "head": None}, seed=6))
    assert out.returncode == doc["exit_code"] == 3
    assert [(a["arm"], a["outcome"]) for a in doc["arms"]] == [("head", "missing")]
    # The head failed a request in every round: those runs are left out and counted, never judged.
    out, doc = gate_document(noisy(tmp_path / "failing", {"base": CLEAN, "head": {"scale": 0.5}}, seed=6))
    assert out.returncode == doc["exit_code"] == 3
    assert doc["excluded_runs"] == {"head": ROUNDS} and doc["arms"][0]["excluded_runs"] == ROUNDS
    out = gate(noisy(tmp_path / "base-failing", {"base": {}, "head": CLEAN}, seed=6))
    assert out.returncode == 2 and "no clean run" in out.stderr


def test_a_latency_baseline_from_another_session_is_refused() -> None:
    out = bench("compare", BASELINES / "aa-sequential-1.json", "--baseline", BASELINES / "aa-sequential-2.json")
    assert out.returncode == 2 and "not judged: session-to-session" in out.stderr, out.stderr
    assert "--arm base=" in out.stderr


def test_arms_from_separate_sources_must_share_their_settings(tmp_path: Path) -> None:
    a = noisy(tmp_path / "a", {"pickle": CLEAN}, seed=8)
    b = noisy(tmp_path / "b", {"pickle": CLEAN}, seed=9)
    for compare_file in (a, b):
        compare_file.unlink()
    assert bench("compare", f"base={tmp_path / 'a'}", f"head={tmp_path / 'b'}", "--gate").returncode == 0
    for folder, prompts, host in (("a", 100, "here"), ("b", 999, "elsewhere")):
        for run_file in (tmp_path / folder).glob("*.json"):
            doc = json.loads(run_file.read_text())
            doc["metadata"]["flags"]["num_prompts"] = prompts
            doc["metadata"]["hostname"] = host
            run_file.write_text(json.dumps(doc))
    out = bench("compare", f"base={tmp_path / 'a'}", f"head={tmp_path / 'b'}", "--gate")
    assert out.returncode == 2 and "different settings" in out.stderr, out.stderr
    assert "head: num_prompts: base 100, head 999" in out.stderr
    assert "head: hostname: base 'here', head 'elsewhere'" in out.stderr


def test_unusable_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    one = noisy(tmp_path / "one", {"base": CLEAN}, seed=7)
    for path, why in (
        (bad, "bench compare: error:"),
        (tmp_path / "missing.json", "bench compare: error:"),
        (one, "one arm"),
    ):
        out = gate(path)
        assert out.returncode == 2 and why in out.stderr, out.stderr


def test_bench_compare_judges_a_compare_file_and_writes_markdown_and_json(tmp_path: Path) -> None:
    faster = noisy(tmp_path / "run", BASE, seed=7)  # msgspec's latencies are 0.8x pickle's
    out = bench("compare", faster, "--markdown", tmp_path / "c.md", "--json", tmp_path / "c.json")
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "c.json").read_text())
    ttft = doc["comparison"]["verdicts"]["msgspec"]["mean_ttft_ms"]
    assert doc["schema_version"] == 2 and doc["comparison"]["primary"] == "mean_ttft_ms"
    assert ttft["verdict"] == "faster" and -22 < ttft["change_pct"] < -19  # truth -20%, 2% noise
    assert all(run["figures"] for run in doc["runs"])  # compact: stands alone as a baseline
    assert "| TTFT mean |" in (tmp_path / "c.md").read_text()
    # The --json document stands alone (no run files needed): the verdicts read back the same.
    for f in (tmp_path / "run").glob("*-r*-compare.json"):
        f.unlink()
    again = bench("compare", tmp_path / "c.json")
    assert again.returncode == 0 and again.stdout == out.stdout, again.stderr


def test_bench_compare_of_two_sets_of_bench_load_results(tmp_path: Path) -> None:
    """Two server builds measured in alternating rounds with bench load: one folder of run files each."""
    a = noisy(tmp_path / "a", {"pickle": BASE["pickle"]}, seed=8)
    b = noisy(tmp_path / "b", {"pickle": {**BASE["pickle"], "scale": 1.3}}, seed=9)
    for compare_file in (a, b):
        compare_file.unlink()  # keep only the run files, as bench load leaves them
    saved = tmp_path / "ab.json"
    out = bench("compare", f"main={tmp_path / 'a'}", f"branch={tmp_path / 'b'}", "--json", saved)
    assert out.returncode == 0, out.stderr
    ttft = json.loads(saved.read_text())["comparison"]["verdicts"]["branch"]["mean_ttft_ms"]
    assert ttft["verdict"] == "slower" and 20 <= ttft["change_pct"] < 40, ttft  # truth +30%, 2% noise
    # Both builds run the same codec: the saved document keeps them apart by their labels.
    again = bench("compare", saved)
    assert again.returncode == 0, again.stderr
    assert again.stdout.split("verdicts against")[1] == out.stdout.split("verdicts against")[1]
    out = bench("compare", tmp_path / "a")
    assert out.returncode == 2 and "one arm" in out.stderr


def test_dashboard_exports_have_the_documented_shapes(tmp_path: Path) -> None:
    current = noisy(tmp_path / "run", BASE, seed=10)
    gab, bmf = tmp_path / "gab.json", tmp_path / "bmf.json"
    out = bench("compare", current, "--github-benchmark", gab, "--bencher", bmf)
    assert out.returncode == 0, out.stderr
    entries = json.loads(gab.read_text())
    # github-action-benchmark customSmallerIsBetter: a list of {name, unit, value[, range, extra]}
    assert entries and all({"name", "unit", "value"} <= set(e) and isinstance(e["value"], float) for e in entries)
    assert {"pickle/TTFT mean", "msgspec/req enc µs"} <= {e["name"] for e in entries}
    assert {e["unit"] for e in entries} == {"ms", "us"}
    # Bencher Metric Format: {benchmark: {measure: {value, lower_value, upper_value}}}
    doc = json.loads(bmf.read_text())
    assert set(doc) == {"pickle", "msgspec"}
    m = doc["pickle"]["ttft-mean"]
    assert m["lower_value"] <= m["value"] <= m["upper_value"]


# --- within 100 columns ----------------------------------------------------------------------

WIDTH = 100
WIDEST = BASELINES / "seed-10245-16core.json"  # the committed compare file with the most figures and arms


def widest_line(text: str) -> int:
    return max(len(line) for line in text.splitlines())


@pytest.mark.parametrize("flags", [[], ["--gate"]], ids=["compare", "gate"])
def test_compare_and_gate_print_within_100_columns_and_wide_restores_the_rows_per_arm(flags: list[str]) -> None:
    default = bench("compare", WIDEST, *flags)
    assert default.stdout and widest_line(default.stdout) <= WIDTH, default.stdout
    wide = bench("compare", WIDEST, *flags, "--wide")
    assert wide.returncode == default.returncode and widest_line(wide.stdout) > WIDTH
    # The same verdicts or decision either way (the last paragraph): only the layout differs.
    assert default.stdout.split("\n\n")[-1].split() == wide.stdout.split("\n\n")[-1].split()


def test_every_committed_compare_file_prints_within_100_columns(capsys: pytest.CaptureFixture[str]) -> None:
    from harness import cli

    docs = {p: json.loads(p.read_text()) for p in sorted(BASELINES.glob("*.json"))}
    files = [p for p, doc in docs.items() if isinstance(doc, dict) and doc.get("kind") == "compare"]
    assert len(files) > 50
    for path in files:
        if cli.main(["compare", str(path)]) == 0:  # a file of one arm is refused (exit 2)
            assert widest_line(capsys.readouterr().out) <= WIDTH, path
