"""The CI gate (bench compare --baseline, scripts/check_regression.py) and bench compare on saved files.

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
ROUNDS = 6
NOISE = 0.02


def bench(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *map(str, args)], capture_output=True, text=True, timeout=120
    )


def gate(current: Path, baseline: Path, *flags: object) -> subprocess.CompletedProcess[str]:
    return bench("compare", current, "--baseline", baseline, *flags)


def noisy(folder: Path, specs: dict, seed: int) -> Path:
    return write_comparison(folder, specs, repeat=ROUNDS, noise=NOISE, seed=seed)


@pytest.fixture
def baseline(tmp_path: Path) -> Path:
    return noisy(tmp_path / "baseline", BASE, seed=1)


def test_an_unchanged_rerun_passes(tmp_path: Path, baseline: Path) -> None:
    out = gate(noisy(tmp_path / "rerun", BASE, seed=2), baseline)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no regression" in out.stdout and "REGRESSION" not in out.stdout


def test_a_regression_of_the_reference_codec_alone_is_caught(tmp_path: Path, baseline: Path) -> None:
    slower = {"pickle": {**BASE["pickle"], "scale": 1.1}, "msgspec": BASE["msgspec"]}
    out = gate(noisy(tmp_path / "slow-ref", slower, seed=3), baseline)
    assert out.returncode == 1, out.stdout + out.stderr
    flagged = [line for line in out.stdout.splitlines() if line.endswith("REGRESSION")]
    assert any(line.startswith("pickle") and "TTFT mean" in line and " own " in line for line in flagged)
    # msgspec's own figures did not move; its ratio to pickle improved: neither fails.
    assert not any(line.startswith("msgspec") for line in flagged)


def test_a_slower_machine_passes_on_ratios_and_fails_on_own_figures(tmp_path: Path, baseline: Path) -> None:
    machine = {codec: {**kw, "scale": kw.get("scale", 1.0) * 1.5} for codec, kw in BASE.items()}
    slow = noisy(tmp_path / "machine", machine, seed=4)
    assert gate(slow, baseline, "--ratios-only").returncode == 0
    assert gate(slow, baseline).returncode == 1


def test_a_codec_worse_relative_to_the_reference_fails_unless_under_the_threshold(
    tmp_path: Path, baseline: Path
) -> None:
    worse = {"pickle": BASE["pickle"], "msgspec": {**BASE["msgspec"], "scale": 1.0}}  # was 0.8: +25%
    current = noisy(tmp_path / "worse", worse, seed=5)
    out = gate(current, baseline, "--markdown", tmp_path / "gate.md", "--json", tmp_path / "gate.json")
    assert out.returncode == 1
    assert any(
        line.startswith("msgspec") and "vs pickle" in line and line.endswith("REGRESSION")
        for line in out.stdout.splitlines()
    )
    doc = json.loads((tmp_path / "gate.json").read_text())
    assert doc["regressions"] >= 1 and {"codec", "figure", "check", "verdict", "outcome"} <= set(doc["rows"][0])
    assert "**REGRESSION**" in (tmp_path / "gate.md").read_text()
    assert gate(current, baseline, "--threshold-pct", "40").returncode == 0


def test_too_few_rounds_are_noisy_not_a_pass_in_disguise(tmp_path: Path, baseline: Path) -> None:
    one = write_comparison(tmp_path / "one", BASE, repeat=1)
    out = gate(one, baseline)
    # The gate cannot rule a regression out: exit 3, with or without the old --fail-on-noise.
    assert out.returncode == 3 and "too noisy" in out.stdout and "too few rounds" in out.stdout
    assert gate(one, baseline, "--fail-on-noise").returncode == 3


def test_missing_codecs_and_bad_input(tmp_path: Path, baseline: Path) -> None:
    extra = noisy(tmp_path / "extra", {**BASE, "pickle-oob": {"enc_us": 25.0}}, seed=6)
    out = gate(extra, baseline)
    assert out.returncode == 0 and "not measured in baseline: pickle-oob" in out.stdout

    fewer = noisy(tmp_path / "fewer", {k: v for k, v in BASE.items() if k != list(BASE)[-1]}, seed=7)
    out = gate(fewer, baseline)  # a codec of the baseline not measured now: the gate cannot say it is fine
    assert out.returncode == 3 and f"not measured now (in baseline only): {list(BASE)[-1]}" in out.stdout

    no_ref = write_comparison(tmp_path / "noref", {"pickle": None, "msgspec": {}}, repeat=1)
    out = gate(no_ref, baseline)
    assert out.returncode == 2 and "reference codec 'pickle'" in out.stderr

    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    run_file = next((tmp_path / "baseline").glob("pickle-r0-*.json"))
    for args in ((bad, baseline), (baseline, tmp_path / "missing.json"), (run_file, baseline)):
        out = gate(*args)
        assert out.returncode == 2 and out.stderr.startswith("bench compare: error:"), out.stderr
    script = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_regression.py"), bad, baseline],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert script.returncode == 2 and script.stderr.startswith("check_regression: error:")


def test_the_script_is_the_same_gate(tmp_path: Path, baseline: Path) -> None:
    slower = {"pickle": {**BASE["pickle"], "scale": 1.1}, "msgspec": BASE["msgspec"]}
    current = noisy(tmp_path / "slow-ref", slower, seed=3)
    script = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_regression.py"), current, baseline],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert script.returncode == 1 and "REGRESSION" in script.stdout


def test_bench_compare_judges_a_compare_file_and_writes_markdown_and_json(tmp_path: Path) -> None:
    faster = noisy(tmp_path / "run", BASE, seed=7)  # msgspec's latencies are 0.8x pickle's
    out = bench("compare", faster, "--markdown", tmp_path / "c.md", "--json", tmp_path / "c.json")
    assert out.returncode == 0, out.stderr
    assert "TTFT mean" in out.stdout and "faster by -20" in out.stdout
    doc = json.loads((tmp_path / "c.json").read_text())
    assert (
        doc["schema_version"] == 2 and doc["comparison"]["verdicts"]["msgspec"]["mean_ttft_ms"]["verdict"] == "faster"
    )
    assert all(run["figures"] for run in doc["runs"])  # compact: stands alone as a baseline
    assert "| TTFT mean |" in (tmp_path / "c.md").read_text()
    # The --json document works as a gate baseline by itself (no run files needed).
    for f in (tmp_path / "run").glob("*-r*-compare.json"):
        f.unlink()
    assert gate(faster, tmp_path / "c.json").returncode == 0


def test_bench_compare_of_two_sets_of_bench_load_results(tmp_path: Path) -> None:
    """Two server builds measured in alternating rounds with bench load: one folder of run files each."""
    a = noisy(tmp_path / "a", {"pickle": BASE["pickle"]}, seed=8)
    b = noisy(tmp_path / "b", {"pickle": {**BASE["pickle"], "scale": 1.3}}, seed=9)
    for compare_file in (a, b):
        compare_file.unlink()  # keep only the run files, as bench load leaves them
    saved = tmp_path / "ab.json"
    out = bench("compare", f"main={tmp_path / 'a'}", f"branch={tmp_path / 'b'}", "--json", saved)
    assert out.returncode == 0, out.stderr
    ttft = next(line for line in out.stdout.splitlines() if line.strip().startswith("TTFT mean") and "slower" in line)
    assert "slower by +2" in ttft or "slower by +3" in ttft, out.stdout  # truth +30%, 2% noise
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


BASELINES = ROOT / "results" / "baselines"


def test_files_with_different_settings_are_refused_with_the_difference_named() -> None:
    # Two committed A/A runs of one build, one in sequence, one in blocks of 20.
    out = gate(BASELINES / "aa-sequential-1.json", BASELINES / "aa-blocks-1.json")
    assert out.returncode == 2 and "different settings" in out.stderr, out.stdout + out.stderr
    assert "block_size: baseline 20, current 0" in out.stderr


def test_a_baseline_against_itself_is_too_noisy_to_pass_when_rounds_are_too_few() -> None:
    # text.json's verdicts are inconclusive at 7 rounds: the gate says it cannot tell (3), not "pass".
    out = gate(BASELINES / "text.json", BASELINES / "text.json")
    assert out.returncode == 3 and "REGRESSION" not in out.stdout, out.stdout + out.stderr


def test_settings_differences_name_rate_and_machine() -> None:
    from harness.analysis.comparable import differences

    base = {"flags": {"num_prompts": 100, "executor": "sim"}, "request_rate": {"rate": 20.0, "auto": False}}
    assert differences(base, base) == []
    other = {
        "flags": {"num_prompts": 200, "executor": "sim"},
        "request_rate": {"rate": 9.0, "auto": True},
        "machine": {"cpu_model": "B"},
    }
    said = differences(other, {**base, "machine": {"cpu_model": "A"}})
    assert "num_prompts: baseline 100, current 200" in said
    assert any(s.startswith("request rate: baseline 20.0 req/s, current auto") for s in said)
    assert "machine cpu_model: baseline 'A', current 'B'" in said
    # Two auto rates are the same setting (each is half of its own machine's capacity).
    auto = {**base, "request_rate": {"rate": 11.0, "auto": True}}
    assert differences(auto, {**base, "request_rate": {"rate": 13.0, "auto": True}}) == []
