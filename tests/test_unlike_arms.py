"""bench compare and bench report draw no verdict from runs whose settings differ.

Two saved run files, one of 50 prompts and one of 1,000 (made by the project's own
writer, documents.save_run, on test_results' hand-built results): both commands refuse
them (exit 2, each difference named, the flag to look anyway), and with --unlike show
their figures side by side under a "not judged" line, with no verdict anywhere. The same
files with their settings alike are judged as before.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_htmlreport import check_self_contained

from harness.analysis.documents import save_run
from harness.analysis.like_for_like import arm_differences
from harness.analysis.runs import RunEntry
from harness.analysis.verdicts import Arm
from harness.cli import main as bench

from test_results import BASE, make_result, write_comparison

# What a verdict says (harness.analysis.stats); none may appear for unlike arms.
VERDICT_WORDS = re.compile(r"slower|faster|equivalent|inconclusive|too few rounds|verdicts against", re.IGNORECASE)


def run_file(folder: Path, codec: str, num_prompts: int) -> Path:
    """One saved run of ``codec`` whose recorded --num-prompts is ``num_prompts``."""
    result = make_result(codec, 0, failed=False)
    result.flags = {**(result.flags or {}), "num_prompts": num_prompts}
    return save_run(result, folder / f"{codec}-{num_prompts}.json", sysinfo={})


@pytest.fixture
def unlike(tmp_path: Path) -> list[str]:
    return [str(run_file(tmp_path, "pickle", 50)), str(run_file(tmp_path, "msgspec", 1000))]


@pytest.fixture
def alike(tmp_path: Path) -> list[str]:
    return [str(run_file(tmp_path, "pickle", 50)), str(run_file(tmp_path, "msgspec", 50))]


def refused(err: str, prog: str) -> None:
    """The refusal: the error, the difference on a line of its own, the flag that shows them anyway."""
    lines = err.strip().splitlines()
    assert lines[0].startswith(f"{prog}: error: the arms ran with different settings"), err
    assert any(line.endswith("msgspec: num_prompts: pickle 50, msgspec 1000") for line in lines[1:-1]), err
    assert lines[-1].startswith(f"{prog}: hint: --unlike"), err
    assert "Traceback" not in err


def test_bench_compare_refuses_runs_of_different_num_prompts(
    unlike: list[str], alike: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench(["compare", *alike]) == 0  # alike: judged as before
    assert "verdicts against pickle" in capsys.readouterr().out
    assert bench(["compare", *unlike]) == 2
    out = capsys.readouterr()
    refused(out.err, "bench compare")
    assert not out.out
    assert bench(["compare", *unlike, "--gate"]) == 2  # the gate refuses them as before
    assert "num_prompts" in capsys.readouterr().err


def test_bench_compare_unlike_shows_the_figures_without_verdicts(
    unlike: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    markdown = tmp_path / "side.md"
    assert bench(["compare", *unlike, "--unlike", "--markdown", str(markdown)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "not judged: the arms differ in num_prompts"
    assert "msgspec: num_prompts: pickle 50, msgspec 1000" in out
    assert "TTFT mean" in out and "pickle" in out and "msgspec" in out  # the figures, side by side
    assert not VERDICT_WORDS.search(out), out
    text = markdown.read_text()
    assert "**not judged: the arms differ in num_prompts**" in text and "| TTFT mean |" in text
    assert not VERDICT_WORDS.search(text), text


def test_bench_compare_unlike_refuses_what_would_carry_a_verdict(
    unlike: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench(["compare", *unlike, "--unlike", "--gate"]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0  # one line
    saved = tmp_path / "c.json"
    assert bench(["compare", *unlike, "--unlike", "--json", str(saved)]) == 2
    assert "--json" in capsys.readouterr().err and not saved.exists()


def test_bench_report_refuses_runs_of_different_num_prompts(
    unlike: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "report.html"
    assert bench(["report", *unlike, "-o", str(page)]) == 2
    refused(capsys.readouterr().err, "bench report")
    assert not page.exists()


def test_bench_report_unlike_carries_a_note_and_no_verdict(
    unlike: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "report.html"
    assert bench(["report", *unlike, "--unlike", "-o", str(page)]) == 0
    parsed = check_self_contained(page.read_text())
    words = parsed.all_text
    assert "not judged: the arms differ in num_prompts" in words
    assert "msgspec: num_prompts: pickle 50, msgspec 1000" in words
    assert [a.get("class") for a in parsed.of("div") if a.get("class") == "unlike"]  # the visible note
    assert "TTFT mean" in words  # the figures are there
    shown = re.sub(r"<[^>]+>", " ", page.read_text().split("<body>")[1])  # the page, not its CSS
    assert not VERDICT_WORDS.search(shown), VERDICT_WORDS.findall(shown)
    assert not [td for td in parsed.of("td") if VERDICT_WORDS.search(td.get("class") or "")]


def test_bench_report_judges_alike_runs(alike: list[str], tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    assert bench(["report", *alike, "-o", str(page)]) == 0
    assert "Verdicts against pickle" in check_self_contained(page.read_text()).all_text


def test_runs_pooled_in_one_arm_must_agree_too() -> None:
    """An arm made of several sources (a folder of rounds, run files of one codec) is named when its
    own runs differ, whatever the other arm ran."""

    def entry(label: str, prompts: int) -> RunEntry:
        return RunEntry(label, 0, "ok", "", None, {"metadata": {"flags": {"num_prompts": prompts}}})

    base = Arm("base", [entry("base", 50), entry("base", 1000)])
    head = Arm("head", [entry("head", 50), entry("head", 1000)])
    assert arm_differences([base, head]) == [
        "base: num_prompts: its runs differ: 50 / 1000",
        "head: num_prompts: base 50, head 50 / 1000",
    ]
    assert arm_differences([Arm("a", [entry("a", 50)]), Arm("b", [entry("b", 50)])]) == []


def test_the_arms_of_one_bench_run_are_judged_whatever_their_arm_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A compare file alone holds one bench run's arms, which differ on purpose (here --arm-flags
    'msgspec=--overlap-on-cpu': the engine reports its loop overlapped): judged as before."""
    compare_file = write_comparison(tmp_path / "run", BASE, repeat=3, noise=0.02, seed=4)
    for path in (tmp_path / "run").glob("*-r*-*.json"):
        doc = json.loads(path.read_text())
        doc["metadata"]["engine"] = {"overlapped": doc["codec"] == "msgspec"}
        path.write_text(json.dumps(doc))
    assert bench(["compare", str(compare_file)]) == 0
    assert "verdicts against pickle" in capsys.readouterr().out
    page = tmp_path / "report.html"
    assert bench(["report", str(compare_file), "-o", str(page)]) == 0
    assert "Verdicts against pickle" in check_self_contained(page.read_text()).all_text
