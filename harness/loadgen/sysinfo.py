"""Run metadata for result files: versions, CPU, GPU, git revision, platform.

Library versions come from package metadata, so collecting them does not
import torch into the load generator. The GPU name is read from torch.cuda
when torch is already imported in this process (or ``probe_torch=True``),
otherwise from ``nvidia-smi`` when it is on PATH; None when neither answers.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

LIBRARIES = ("torch", "msgspec", "pyzmq", "aiohttp", "numpy")
REPO_ROOT = Path(__file__).resolve().parents[2]


def library_versions(names: tuple[str, ...] = LIBRARIES) -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=5, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def gpu_name(probe_torch: bool = False) -> str | None:
    if probe_torch or "torch" in sys.modules:
        try:
            import torch

            if torch.cuda.is_available():
                return torch.cuda.get_device_name(0)
            return None
        except Exception:  # a broken CUDA setup must not stop a result from being saved
            return None
    if shutil.which("nvidia-smi"):
        out = _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
        return out.splitlines()[0].strip() if out else None
    return None


def git_revision(repo: Path = REPO_ROOT) -> dict[str, Any] | None:
    """HEAD commit and whether the tree has uncommitted changes (read-only git calls)."""
    if shutil.which("git") is None or not (repo / ".git").exists():
        return None
    commit = _run(["git", "rev-parse", "HEAD"], cwd=repo)
    if commit is None:
        return None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo)
    return {"commit": commit, "dirty": bool(status)}


def collect_sysinfo(probe_torch: bool = False, *, hostname: bool = True) -> dict[str, Any]:
    """The run's metadata; ``hostname=False`` leaves the machine's name out
    (for results meant to be shared, such as ``bench micro``'s)."""
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "libraries": library_versions(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_usable": usable_cores(),
        "gpu": gpu_name(probe_torch),
        "git": git_revision(),
    }
    if hostname:
        info["hostname"] = platform.node()
    return info
