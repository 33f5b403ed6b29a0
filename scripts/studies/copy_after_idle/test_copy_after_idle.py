"""copy_after_idle.py writes every gap of every run, on a 1 MiB buffer and a few copies.

Not part of the product's test run (pytest's testpaths is tests/); run it with
``.venv/bin/python -m pytest scripts/studies/copy_after_idle``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest


def test_copy_after_idle_script_writes_every_gap_of_every_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = importlib.util.spec_from_file_location(
        "copy_after_idle", Path(__file__).resolve().parent / "copy_after_idle.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "idle.json"
    args = ["--mib", "1", "--gaps-ms", "0.1,0.5", "--copies", "5", "--runs", "2", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", ["copy_after_idle.py", *args])
    script.main()
    doc = json.loads(out.read_text())
    assert doc["kind"] == "copy-after-idle" and doc["nbytes"] == 1 << 20 and len(doc["runs"]) == 2
    for run in doc["runs"]:
        assert list(run) == ["back_to_back", "sleep 0.1", "spin 0.1", "sleep 0.5", "spin 0.5"]
        assert all(v > 0 for v in run.values())
    printed = capsys.readouterr().out
    assert "| spin 0.5 ms |" in printed and "| nothing (back to back) |" in printed
