"""Ctrl-C and SIGTERM stop `bench run` cleanly in every phase: one line naming the phase, exit 130 (143 for
SIGTERM), no traceback, no server or shared memory left; a round cut short is said before any table and
is not compared as if whole; a run that fell short says why on its own line."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.experiment.flow import Interrupted, phase, stopped_round
from harness.experiment.rounds import RunOutcome
from harness.experiment.server import READY_LINE
from harness.server_metrics import prometheus
from harness.workloads.chat import BATCH_CHARS, batches
from harness.workloads.progress import building

from serve_process import child_pids, leftovers_of, still_alive

EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}


# ---- the pieces, in process


def test_phase_names_where_an_interrupt_landed_and_an_inner_phase_wins():
    with pytest.raises(Interrupted) as caught, phase("preparation"):
        raise KeyboardInterrupt
    assert caught.value.phase == "preparation"
    with pytest.raises(Interrupted) as caught, phase("analysis"), phase("round 2/3"):
        raise KeyboardInterrupt
    assert caught.value.phase == "round 2/3"
    assert isinstance(caught.value, KeyboardInterrupt)  # whatever handles Ctrl-C (a sweep) handles it too


def _outcome(arm: str, rnd: int, status: str = "ok") -> RunOutcome:
    return RunOutcome(arm, rnd, status=status)  # type: ignore[arg-type]  # only the round and status are read


def test_the_round_an_interrupt_cut_is_the_one_under_way():
    exp: Any = SimpleNamespace(arms=("a", "b"))
    assert stopped_round(exp, []) == 0  # Ctrl-C while the first servers started
    assert stopped_round(exp, [_outcome("a", 0), _outcome("b", 0)]) == 1  # round 1 whole: round 2 starting
    assert stopped_round(exp, [_outcome("a", 0), _outcome("b", 0), _outcome("a", 1)]) == 1  # half of round 2
    assert stopped_round(exp, [_outcome("a", 0, "interrupted"), _outcome("b", 0, "interrupted")]) == 0


def test_prompts_are_counted_in_batches_short_enough_to_interrupt():
    pairs = [("x" * n, ()) for n in (10, BATCH_CHARS, 5, BATCH_CHARS // 2, BATCH_CHARS // 2 + 1, 3)]
    runs = list(batches(pairs))
    assert [p for run in runs for p in run] == pairs  # every prompt once, in order
    for run in runs:
        assert len(run) == 1 or sum(len(p) for p, _ in run) <= BATCH_CHARS


def test_a_long_build_off_a_terminal_says_what_it_builds_once():
    out = io.StringIO()  # not a terminal: no bars
    with building(200, "random-mm", stream=out, after_s=0.01):
        time.sleep(0.3)
    assert out.getvalue() == "building the workload: 200 prompts (random-mm) ...\n"
    quiet = io.StringIO()
    with building(200, "random-mm", stream=quiet, after_s=60):
        pass
    assert quiet.getvalue() == ""  # a quick build shows nothing


def test_sigterm_raises_its_own_keyboard_interrupt_in_the_main_thread():
    code = (
        "import os, signal, time\n"
        "from harness.cli import Terminated, stop_on_signals\n"
        "stop_on_signals()\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(10)\n"
        "except Terminated:\n"
        "    print('terminated')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout == "terminated\n", done.stderr


# ---- the real command


def start_bench(*flags: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "harness.cli", "run", "--no-progress", *flags]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, bufsize=1
    )


class Lines:
    """A stream's lines as they come, read on a thread, so a test can wait for one."""

    def __init__(self, stream: io.TextIOBase) -> None:
        self.lines: list[str] = []
        self._new = threading.Condition()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: io.TextIOBase) -> None:
        for line in stream:
            with self._new:
                self.lines.append(line.rstrip("\n"))
                self._new.notify_all()

    def wait_for(self, text: str, timeout_s: float = 120) -> bool:
        with self._new:
            return self._new.wait_for(lambda: any(text in line for line in self.lines), timeout_s)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def server_tree(pid: int) -> list[int]:
    """Every server `bench run` (``pid``) has started, with their engines."""
    servers = child_pids(pid)
    return servers + [p for s in servers for p in child_pids(s)]


def served_requests(server_log: Path, nth: int) -> float:
    """Requests completed so far by the ``nth`` server (from 1) that logged its ready line."""
    urls = READY_LINE.findall(server_log.read_text()) if server_log.exists() else []
    if len(urls) < nth:
        return 0
    try:
        with urllib.request.urlopen(urls[nth - 1] + "/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except OSError:
        return 0
    return prometheus.parse(text).get((prometheus.REQUESTS, frozenset({("outcome", "completed")})), 0)


def wait_served(server_log: Path, nth: int, at_least: int, timeout_s: float = 120) -> None:
    """Wait until the ``nth`` server has completed ``at_least`` requests (however slow the machine)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and served_requests(server_log, nth) < at_least:
        time.sleep(0.3)
    assert served_requests(server_log, nth) >= at_least, server_log.read_text()[-2000:]


def stopped(proc: subprocess.Popen, out: Lines, err: Lines, sig: int) -> tuple[str, str]:
    """Signal `bench run`, wait for it to end; its stdout and stderr."""
    proc.send_signal(sig)
    proc.wait(timeout=120)
    time.sleep(0.2)  # the reader threads' last lines
    return out.text, err.text


def assert_one_clean_line(stderr: str, line: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert stderr.strip().splitlines()[-1] == line, stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupt_while_the_workload_is_built_is_one_line(tmp_path, sig):
    proc = start_bench("--dataset-name", "random-mm", "--num-prompts", "400", "--result-dir", str(tmp_path))
    out, err = Lines(proc.stdout), Lines(proc.stderr)  # type: ignore[arg-type]
    assert err.wait_for("building the workload: 400 prompts (random-mm)"), err.text  # still building
    stdout, stderr = stopped(proc, out, err, sig)
    assert proc.returncode == EXIT[sig], stdout + stderr
    assert_one_clean_line(stderr, "bench run: interrupted during preparation; nothing left behind")
    assert not child_pids(proc.pid) and not list(tmp_path.iterdir())  # no server started, nothing saved


@pytest.mark.slow
def test_sigterm_in_a_round_stops_every_server_and_compares_nothing_cut(tmp_path):
    log = tmp_path / "server.log"
    proc = start_bench(
        *("--codec", "pickle,msgspec", "--block-size", "20", "--num-prompts", "400", "--request-rate", "20"),
        *("--result-dir", str(tmp_path), "--server-log", str(log)),
    )
    out, err = Lines(proc.stdout), Lines(proc.stderr)  # type: ignore[arg-type]
    wait_served(log, nth=1, at_least=10)
    tree = server_tree(proc.pid)
    assert len(child_pids(proc.pid)) == 2, tree  # both arms' servers, up for the round
    stdout, stderr = stopped(proc, out, err, signal.SIGTERM)
    assert proc.returncode == 143, stdout + stderr
    (compare,) = tmp_path.glob("compare-*.json")
    assert_one_clean_line(stderr, f"bench run: interrupted during round 1/1; what ran is saved in {compare}")
    assert "interrupted during round 1/1: no round ran whole, so no comparison" in stdout
    assert "Codec comparison" not in stdout and "verdicts against" not in stdout  # runs cut at two points
    assert stdout.count("; interrupted") == 2  # each arm's run line says so
    assert not still_alive(tree)
    assert not leftovers_of(tree)


@pytest.mark.slow
def test_ctrl_c_in_the_second_round_shows_only_the_whole_first_one(tmp_path):
    log = tmp_path / "server.log"
    proc = start_bench(
        *("--codec", "pickle", "--repeat", "2", "--block-size", "0", "--num-prompts", "200", "--request-rate", "40"),
        *("--sonnet-output-len", "16", "--no-save-result", "--server-log", str(log)),
    )
    out, err = Lines(proc.stdout), Lines(proc.stderr)  # type: ignore[arg-type]
    assert out.wait_for("[2/2] pickle round 2/2"), out.text + err.text
    wait_served(log, nth=2, at_least=10)
    tree = server_tree(proc.pid)
    stdout, stderr = stopped(proc, out, err, signal.SIGINT)
    assert proc.returncode == 130, stdout + stderr
    assert_one_clean_line(stderr, "bench run: interrupted during round 2/2; nothing left behind")
    note = "interrupted during round 2/2: the table and verdicts below are of the 1 round(s) that ran whole"
    assert note in stdout and stdout.index(note) < stdout.index("Codec comparison"), stdout
    rounds_row = next(line for line in stdout.splitlines() if line.startswith("rounds"))
    assert rounds_row.split() == ["rounds", "1"]  # the cut run is not in the table
    assert not still_alive(tree)
    assert not leftovers_of(tree)


def engine_of(server: int) -> int:
    (pid,) = [p for p in child_pids(server) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
    return pid


@pytest.mark.slow
def test_a_run_whose_engine_died_says_so_on_its_line(tmp_path):
    import os

    log = tmp_path / "server.log"
    proc = start_bench(
        *("--codec", "pickle", "--num-prompts", "120", "--request-rate", "20", "--sonnet-output-len", "16"),
        *("--result-dir", str(tmp_path), "--server-log", str(log)),
    )
    out, err = Lines(proc.stdout), Lines(proc.stderr)  # type: ignore[arg-type]
    wait_served(log, nth=1, at_least=10)
    (server,) = child_pids(proc.pid)
    os.kill(engine_of(server), signal.SIGKILL)
    proc.wait(timeout=300)
    time.sleep(0.2)
    assert proc.returncode == 1, out.text + err.text
    (line,) = [line for line in out.lines if line.startswith("pickle r1: ")]
    assert "requests failed" in line and "the engine process exited" in line, line  # as its file says
