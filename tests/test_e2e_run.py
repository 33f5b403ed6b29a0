"""End to end: `bench run` starts real servers per codec and compares them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from harness.analysis import stats
from harness.experiment.server import READY_LINE
from harness.loadgen.arrivals import plan_arrivals
from harness.server_metrics import prometheus


def bench_run(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "harness.cli", "run", "--result-dir", str(tmp_path), "--no-progress", *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def comparison(tmp_path: Path) -> dict:
    (path,) = tmp_path.glob("compare-*.json")
    return json.loads(path.read_text())


@pytest.mark.slow
def test_interleaved_repeats_compare_two_codecs(tmp_path):
    done = bench_run(
        tmp_path,
        "--codec",
        "pickle,msgspec",
        "--repeat",
        "2",
        "--num-prompts",
        "12",
        "--request-rate",
        "40",
        "--sonnet-output-len",
        "20",
        "--block-size",
        "0",  # in sequence: each arm's whole workload in turn (blocks are the default with two arms)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = comparison(tmp_path)
    # Interleaved, the order reversed every other round (drift cancels in pairs).
    assert [(r["codec"], r["round"]) for r in summary["runs"]] == [
        ("pickle", 0),
        ("msgspec", 0),
        ("msgspec", 1),
        ("pickle", 1),
    ]
    assert all(r["status"] == "ok" for r in summary["runs"])
    for codec in ("pickle", "msgspec"):
        row = summary["table"][codec]
        assert len(row["mean_ttft_ms"]["values"]) == 2
        assert row["request_encode_us"]["median"] > 0
    result = json.loads((tmp_path / summary["runs"][0]["result_file"]).read_text())  # relative to the compare file
    assert result["completed"] == 12 and result["codec"] == "pickle"
    assert len(result["ttfts"]) == 12 and result["output_lens"] == [20] * 12
    engine = result["metadata"]["engine"]  # the engine's account of itself and of this run's steps
    assert engine["device"] == "cpu" and engine["preset"] == "tiny"
    assert engine["steps"] >= 20 and set(engine["steps_waiting"]) == {"kv_cache", "max_num_seqs", "token_budget"}
    # The paged cache's counters reach the run (prefix caching is off by default: no hits).
    assert engine["prefix_cache_hit_pct"] == 0.0 and engine["preemptions"] == 0
    assert "Codec comparison" in done.stdout  # the report was printed; what it reports is read from the files
    # Two rounds: figures, never a verdict.
    verdicts = summary["comparison"]["verdicts"]["msgspec"]
    assert verdicts["mean_ttft_ms"]["verdict"] == "too few rounds"
    assert {v["verdict"] for v in verdicts.values()} <= {"too few rounds", "not judged"}
    # Which process spent what: the client, the server's frontend and its engine, each measured.
    cpu = result["process_cpu"]
    assert set(cpu["roles"]) == {"client", "frontend", "engine"} and cpu["busiest"] in cpu["roles"]
    for role in cpu["roles"].values():
        assert role["cpu_s"] > 0 and role["ms_per_request"] > 0 and role["us_per_output_token"] > 0


@pytest.mark.slow
def test_an_aa_run_labels_the_second_arm_and_judges_it(tmp_path):
    done = bench_run(
        tmp_path,
        "--codec",
        "msgspec,msgspec",
        "--repeat",
        "3",
        "--num-prompts",
        "8",
        "--request-rate",
        "40",
        "--sonnet-output-len",
        "12",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = comparison(tmp_path)
    assert summary["codecs"] == ["msgspec", "msgspec#2"]
    verdicts = summary["comparison"]["verdicts"]["msgspec#2"]
    assert verdicts["mean_ttft_ms"]["rounds"] == 3
    assert all(v["verdict"] in stats.VERDICTS for v in verdicts.values())
    files = {Path(r["result_file"]).name.split("-r")[0] for r in summary["runs"]}
    assert files == {"msgspec", "msgspec#2"}


@pytest.mark.slow
def test_image_workload_marks_text_only_codec_unsupported(tmp_path):
    done = bench_run(
        tmp_path,
        "--codec",
        "msgspec,msgspec-oob",
        "--images-per-request",
        "1",
        "--image-width",
        "64",
        "--image-height",
        "64",
        "--num-prompts",
        "6",
        "--sonnet-output-len",
        "8",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = comparison(tmp_path)
    statuses = {r["codec"]: r for r in summary["runs"]}
    assert statuses["msgspec"]["status"] == "unsupported"
    assert "cannot carry PIL.Image.Image" in statuses["msgspec"]["message"]
    assert statuses["msgspec-oob"]["status"] == "ok"


def test_unknown_codec_is_a_clear_error(tmp_path):
    done = bench_run(tmp_path, "--codec", "pickle,nope")
    assert done.returncode == 2
    assert "unknown codec(s) nope" in done.stderr and "msgspec-oob" in done.stderr


def wait_for_completed_requests(server_log: Path, at_least: int, timeout_s: float) -> bool:
    """Poll the server's /metrics (its URL from the ready line in its log) until requests completed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        match = READY_LINE.search(server_log.read_text()) if server_log.exists() else None
        if match:
            try:
                with urllib.request.urlopen(match.group(1) + "/metrics", timeout=5) as resp:
                    text = resp.read().decode()
                done = prometheus.parse(text).get((prometheus.REQUESTS, frozenset({("outcome", "completed")})), 0)
                if done >= at_least:
                    return True
            except OSError:
                pass
        time.sleep(0.5)
    return False


def _start_bench_run(tmp_path: Path, *flags: str, at_least: int = 20) -> tuple[subprocess.Popen, list[int]]:
    """A long `bench run` once it has served some requests: the process and its server's tree."""
    from serve_process import child_pids

    cmd = [sys.executable, "-m", "harness.cli", "run", "--result-dir", str(tmp_path), "--no-progress"]
    cmd += ["--num-prompts", "400", "--request-rate", "20", "--server-log", str(tmp_path / "server.log")]
    cmd += flags or ("--codec", "msgspec")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    servers: list[int] = []
    while time.monotonic() < deadline and not servers:
        servers = child_pids(proc.pid)
        time.sleep(0.2)
    assert servers, "bench run should have started a server"
    # Stop it once some requests are done (however slow a shared machine is), not after a fixed time.
    assert wait_for_completed_requests(tmp_path / "server.log", at_least=at_least, timeout_s=90)
    servers = child_pids(proc.pid)  # every server by now (--block-size starts them all)
    return proc, servers + [p for s in servers for p in child_pids(s)]


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_kill_stops_servers_and_saves_what_it_has(tmp_path, sig):
    import signal

    from serve_process import still_alive

    proc, tree = _start_bench_run(tmp_path)
    proc.send_signal(getattr(signal, sig))  # SIGTERM takes Ctrl-C's path (harness.processes.parent_watch)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == (130 if sig == "SIGINT" else 143), out  # 128 + the signal's number
    assert not still_alive(tree)
    summary = comparison(tmp_path)
    (run,) = summary["runs"]
    assert run["status"] == "interrupted"
    result = json.loads((tmp_path / run["result_file"]).read_text())
    assert 0 < result["completed"] < 400
    assert result["completed"] + result["failed"] == 400  # every request accounted for


@pytest.mark.slow
def test_a_sigkilled_bench_run_takes_its_server_and_engine_with_it(tmp_path):
    import signal

    from serve_process import leftovers_of, still_alive

    proc, tree = _start_bench_run(tmp_path, "--codec", "msgspec-oob", "--transport", "shm")
    proc.send_signal(signal.SIGKILL)  # no handler runs: the server notices its parent is gone
    proc.communicate(timeout=30)
    assert not still_alive(tree, grace_s=15.0)
    assert leftovers_of(tree) == []


@pytest.mark.slow
def test_calibrate_runs_an_aa_arm_and_a_known_cost(tmp_path):
    cmd = [sys.executable, "-m", "harness.cli", "calibrate", "--result-dir", str(tmp_path), "--no-progress"]
    cmd += ["--executor", "sim", "--num-prompts", "6", "--repeat", "3", "--costs-pct", "50", "--request-rate", "20"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (path,) = tmp_path.glob("calibrate-*.json")
    doc = json.loads(path.read_text())
    cal = doc["calibration"]
    assert doc["codecs"] == ["pickle", "pickle#2", cal["injected"][0]["arm"]]
    # 7 latency figures, the codec family's 3 and the 4 codec µs per message (rate 20: no throughputs).
    assert cal["aa_arm"] == "pickle#2" and cal["aa_judged"] == 14 and cal["probe_mean_ttft_ms"] > 0
    (injected,) = cal["injected"]
    # Half the probe's TTFT per request, split between the frontend's encode and the engine's decode.
    assert injected["arm"] == f"pickle+request-delay={round(injected['cost_ms'] * 1000 / 2)}us"
    assert injected["cost_pct_of_ttft"] == 50 and injected["verdict"] in stats.VERDICTS
    # What the cost came to against the rounds' own reference TTFT (the probe may run in a slow moment).
    ref_ttft = sorted(doc["table"]["pickle"]["mean_ttft_ms"]["values"])[1]  # the median of 3 rounds
    assert cal["reference_mean_ttft_ms"] == pytest.approx(ref_ttft)
    assert injected["cost_pct_of_measured_ttft"] == pytest.approx(100 * injected["cost_ms"] / ref_ttft)
    assert doc["metadata"]["request_rate"] == {"rate": 20.0, "auto": False}
    assert doc["metadata"]["flags"]["block_size"] == 20  # calibrate takes turns in blocks by default


@pytest.mark.slow
def test_calibrate_until_resolved_stops_on_its_clock_and_says_why(tmp_path):
    cmd = [sys.executable, "-m", "harness.cli", "calibrate", "--result-dir", str(tmp_path), "--no-progress"]
    cmd += ["--executor", "sim", "--num-prompts", "9", "--block-size", "3", "--costs-pct", "50"]
    cmd += ["--request-rate", "40", "--sonnet-output-len", "8", "--until-resolved", "0.8"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[until resolved]" in done.stdout
    (path,) = tmp_path.glob("calibrate-*.json")
    doc = json.loads(path.read_text())
    stopping = doc["metadata"]["until_resolved"]
    assert stopping["stopped"] in ("resolved", "time") and stopping["rounds"] >= 1
    assert doc["comparison"]["sequential"] and len(doc["codecs"]) == 3  # the A/A pair and the injected arm
    assert doc["calibration"]["injected"][0]["verdict"] in stats.VERDICTS


@pytest.mark.slow
def test_block_size_lets_the_arms_take_turns_within_a_round(tmp_path):
    done = bench_run(
        tmp_path,
        *("--codec", "pickle,msgspec", "--block-size", "3", "--repeat", "3", "--executor", "sim"),
        *("--num-prompts", "8", "--request-rate", "40", "--sonnet-output-len", "12"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = comparison(tmp_path)
    assert sorted((r["round"], r["codec"]) for r in summary["runs"]) == [
        (rnd, codec) for rnd in range(3) for codec in ("msgspec", "pickle")
    ]
    assert all(r["status"] == "ok" for r in summary["runs"])
    offsets = plan_arrivals(8, 40.0, 1.0, 0)
    for run in summary["runs"]:
        records = json.loads((tmp_path / run["result_file"]).read_text())["records"]
        assert [r["index"] for r in records] == list(range(8))  # every request once, blocks in order
        planned = [r["planned_send"] for r in records]  # seconds from the arm's first block
        assert planned[0] == 0
        for i in range(7):  # a block keeps the schedule's spacing; the other arm's block runs in between
            gap, scheduled = planned[i + 1] - planned[i], offsets[i + 1] - offsets[i]
            assert gap > scheduled if i in (2, 5) else gap == pytest.approx(scheduled, abs=1e-6)
    verdicts = summary["comparison"]["verdicts"]["msgspec"]
    assert verdicts["mean_ttft_ms"]["rounds"] == 3 and verdicts["mean_ttft_ms"]["paired"]
    # In blocks each arm's server is its own; the client served both arms, so its share is per all requests.
    cpu = json.loads((tmp_path / summary["runs"][0]["result_file"]).read_text())["process_cpu"]
    assert cpu["roles"]["engine"]["cpu_s"] > 0 and cpu["roles"]["frontend"]["cpu_s"] > 0
    client = cpu["roles"]["client"]
    assert client["ms_per_request"] == pytest.approx(1000 * client["cpu_s"] / 16, rel=0.01, abs=0.002)


@pytest.mark.slow
def test_until_resolved_adds_rounds_until_the_time_is_up_and_judges_block_pairs(tmp_path):
    done = bench_run(
        tmp_path,
        *("--codec", "msgspec,pickle", "--until-resolved", "0.6", "--executor", "sim", "--duet"),
        *("--num-prompts", "12", "--block-size", "3", "--request-rate", "40", "--sonnet-output-len", "8"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[until resolved]" in done.stdout and "block pairs" in done.stdout  # the progress line
    summary = comparison(tmp_path)
    stopping = summary["metadata"]["until_resolved"]
    assert stopping["stopped"] in ("resolved", "time") and stopping["rounds"] >= 1
    assert stopping["elapsed_s"] < 0.6 * 60 + 30  # a round may not start that would overrun (one may run long)
    rounds = {r["round"] for r in summary["runs"]}
    assert rounds == set(range(stopping["rounds"]))  # every round that ran is in the document
    assert all(len(r["blocks"]["mean_ttft_ms"]) == 4 for r in summary["runs"])  # 12 prompts, blocks of 3
    judged = summary["comparison"]
    assert judged["sequential"] and "anytime-valid" in judged["method"]
    pickle = judged["verdicts"]["pickle"]
    # The unit is the round (the mean of its 4 block pairs), the pairs behind it reported beside it.
    assert pickle["mean_ttft_ms"]["rounds"] == stopping["rounds"]
    assert pickle["mean_ttft_ms"]["block_pairs"] == 4 * stopping["rounds"]
    assert pickle["first_token_path_us"]["role"] == "codec"
    assert pickle["mean_tpot_ms"]["verdict"] == "not judged"
    # bench compare of the saved document judges it the same way.
    (saved,) = tmp_path.glob("compare-*.json")
    again = subprocess.run(
        [sys.executable, "-m", "harness.cli", "compare", str(saved), "--json", str(tmp_path / "again.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    redone = json.loads((tmp_path / "again.json").read_text())["comparison"]
    assert redone["sequential"] and redone["verdicts"]["pickle"]["mean_ttft_ms"] == pickle["mean_ttft_ms"]


@pytest.mark.slow
def test_block_size_goes_on_when_one_arm_cannot_carry_the_payload(tmp_path):
    done = bench_run(
        tmp_path,
        *("--codec", "msgspec,msgspec-oob", "--block-size", "2", "--executor", "sim", "--request-rate", "20"),
        *("--images-per-request", "1", "--image-width", "64", "--image-height", "64"),
        *("--num-prompts", "6", "--sonnet-output-len", "8"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    statuses = {r["codec"]: r for r in comparison(tmp_path)["runs"]}
    assert statuses["msgspec"]["status"] == "unsupported"  # its warmup was refused: it takes no turns
    assert "cannot carry PIL.Image.Image" in statuses["msgspec"]["message"]
    assert statuses["msgspec-oob"]["status"] == "ok"


@pytest.mark.slow
def test_ctrl_c_in_blocks_stops_every_server_and_accounts_for_every_request(tmp_path):
    import signal

    from serve_process import still_alive

    # Past 40 requests on the server that logged first, the other has finished two blocks of 20 too.
    proc, tree = _start_bench_run(tmp_path, "--codec", "msgspec,pickle", "--block-size", "20", at_least=41)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert not still_alive(tree)
    runs = comparison(tmp_path)["runs"]
    assert sorted(r["codec"] for r in runs) == ["msgspec", "pickle"]
    for run in runs:
        assert run["status"] == "interrupted"
        result = json.loads((tmp_path / run["result_file"]).read_text())
        assert 20 <= result["completed"] < 400, run
        assert result["completed"] + result["failed"] == 400, run  # the blocks never sent count as failed


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_codec_runs_beside_ours_with_verdicts_logprobs_and_its_adapter_apart(tmp_path):
    """vLLM's own serializer as an arm, as CI runs it: verdicts against msgspec-oob, logprobs on
    the wire, and the adapter's time (our messages to vLLM's) reported apart from codec time."""
    done = bench_run(
        tmp_path,
        "--codec",
        "msgspec-oob,vllm",
        "--executor",
        "sim",
        "--repeat",
        "3",
        "--num-prompts",
        "10",
        "--sonnet-output-len",
        "8",
        "--logprobs",
        "3",
        "--output-stats",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = comparison(tmp_path)
    assert all(r["status"] == "ok" for r in summary["runs"])
    verdicts = summary["comparison"]["verdicts"]["vllm"]
    assert verdicts["mean_ttft_ms"]["rounds"] == 3 and verdicts["mean_ttft_ms"]["verdict"] in stats.VERDICTS
    vllm_run = next(r for r in summary["runs"] if r["codec"] == "vllm")
    result = json.loads((tmp_path / vllm_run["result_file"]).read_text())
    spans = result["ipc"]["spans_us"]
    assert spans["request.adapt"]["p50_us"] > 0 and spans["output.adapt"]["p50_us"] > 0
    assert result["completed"] == 10 and result["output_lens"] == [8] * 10
    assert result["metadata"]["flags"]["output_stats"] is True
    ours = json.loads((tmp_path / summary["runs"][0]["result_file"]).read_text())
    assert ours["ipc"]["spans_us"]["request.adapt"]["p99_us"] == 0  # msgspec-oob has no adapter


@pytest.mark.slow
def test_modelled_api_server_work_reaches_the_frontend_and_is_counted_there(tmp_path):
    flags = ["--executor", "sim", "--num-prompts", "12", "--sonnet-output-len", "10"]
    done = bench_run(tmp_path, *flags, "--frontend-cpu-us-per-token", "5000")
    assert done.returncode == 0, done.stderr[-3000:]
    run = comparison(tmp_path)["runs"][0]
    result = json.loads((tmp_path / run["result_file"]).read_text())
    assert result["completed"] == 12 and result["metadata"]["flags"]["frontend_cpu_us_per_token"] == 5000
    # Every output token cost the frontend 5 ms of CPU on top of its own work (~0.7-0.9 ms without).
    assert result["process_cpu"]["roles"]["frontend"]["us_per_output_token"] >= 5000
    # The frontend counts what it wrote back to back, and the client's guard reads it.
    assert 0 < result["client"]["server_behind_share"] <= 1  # 5 ms a token: it fell behind


@pytest.mark.slow
def test_the_seed_preset_runs_a_modelled_gpu_and_sets_itself_beside_the_seed(tmp_path):
    # The PR's arm: requests in pickle, outputs still msgspec, as the preset sets.
    done = bench_run(tmp_path, "--preset", "seed-10245", "--num-prompts", "40", "--codec", "pickle")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Beside the seed (vLLM PR #10245" in done.stdout  # the table was printed (tests/test_seed_preset.py)
    doc = comparison(tmp_path)
    run = doc["runs"][0]
    assert run["codec"] == "pickle" and run["figures"]["completed"] == 40
    result = json.loads((tmp_path / run["result_file"]).read_text())
    engine = result["metadata"]["engine"]  # the engine's account of itself: no model, a modelled GPU step
    assert engine["executor"] == "sim" and engine["sim_step"].startswith("llama8b-h100: ")
    assert engine["output_codec"] == "msgspec"  # what the engine itself used
    assert result["metadata"]["flags"]["output_codec"] == "msgspec"
