"""Sizes that become shared or resident memory are checked at start against what the machine reports
(harness.processes.machine_limits): refused in one line, exit 2, before anything is allocated."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.cli import build_parser
from harness.commands import serve as serve_command
from harness.engine.config import EngineConfig
from harness.engine.device import cpu_memory_asks
from harness.processes import machine_limits
from harness.processes.machine_limits import MachineRoom, Room, SizeAsk, first_refusal, read_machine, refusal
from harness.transports import SenderSettings, get_transport, transport_names

GIB = 1 << 30
MIB = 1 << 20
# The small machine CI runs on: 24 GiB, of which ~20 available, and a /dev/shm smaller than memory.
SMALL_MACHINE = MachineRoom(Room("/dev/shm has free", 1 * GIB), (Room("/proc/meminfo's MemAvailable", 20 * GIB),))


def _bench_serve(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "serve", "--port", "0", "--executor", "sim", *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("flags", "start"),
    [
        (("--transport", "shm", "--shm-size", str(1 << 20)), "bench serve: --shm-size 1048576 (1.0 TiB) is more than "),
        (
            ("--transport", "shm-store", "--mm-store-bytes", str(10**12)),
            "bench serve: --mm-store-bytes 1000000000000 (931.3 GiB) is more than ",
        ),
    ],
)
def test_bench_serve_refuses_shared_memory_the_machine_has_not_in_one_line(flags: tuple[str, ...], start: str) -> None:
    done = _bench_serve("--codec", "msgspec-oob", *flags)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), done.stderr
    assert f"; choose at most {flags[2]} " in lines[0]
    assert "Traceback" not in done.stderr and "wirebench serving" not in done.stdout


def _serve_in_process(argv: list[str]) -> int:
    parser, _ = build_parser(argv)
    return asyncio.run(serve_command.serve(parser.parse_args(argv)))


class Started(Exception):
    """Raised by the first step past the start's refusals."""


def test_the_refusal_comes_before_the_transport_or_engine_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a machine whose /dev/shm has 64 MiB free (a container's default), the default 256 MiB arena is
    refused before the sender's segment or the engine exists; 64 MiB starts."""

    def started(name: str) -> None:
        raise Started

    small_shm = MachineRoom(Room("/dev/shm has free", 64 * MIB), (Room("/proc/meminfo's MemAvailable", 20 * GIB),))
    monkeypatch.setattr(machine_limits, "read_machine", lambda: small_shm)
    monkeypatch.setattr(serve_command, "get_transport", started)
    argv = ["serve", "--codec", "msgspec-oob", "--transport", "shm", "--executor", "sim"]
    assert _serve_in_process(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "bench serve: --shm-size 256 (256.0 MiB) is more than /dev/shm has free (64.0 MiB); "
        "choose at most --shm-size 64"
    ]
    with pytest.raises(Started):
        _serve_in_process([*argv, "--shm-size", "64"])


def test_every_default_fits_a_small_machine() -> None:
    """The defaults of every transport and the default engine (torch on the CPU) start on 24 GiB with a
    smaller /dev/shm."""
    engine = cpu_memory_asks(EngineConfig(device="cpu"))
    assert [a.flag for a in engine] == ["--kv-cache-tokens"]
    for name in transport_names():
        asks = machine_limits.shared_memory_asks(name, SenderSettings()) + engine
        assert first_refusal(asks, SMALL_MACHINE) is None, name


def test_the_shared_sizes_are_those_each_sender_creates() -> None:
    """SHARED_SIZES names, for each transport, the setting its sender sizes its segment by (none: no segment)."""
    settings = SenderSettings(arena_bytes=3 * MIB, store_bytes=5 * MIB)
    for name in transport_names():
        sender = get_transport(name).sender(settings)
        try:
            segment = sender.segment if sender is not None else None
            size = os.stat(Path("/dev/shm") / segment).st_size if segment else None
        finally:
            if sender is not None:
                sender.close()
        declared = machine_limits.SHARED_SIZES.get(name)
        assert size == (getattr(settings, declared.field) if declared else None), name


def test_a_cpu_engine_too_big_for_memory_is_refused_with_what_to_lower() -> None:
    too_many = cpu_memory_asks(EngineConfig(device="cpu", kv_cache_tokens=10**11))
    line = first_refusal(too_many, SMALL_MACHINE)
    assert line is not None and line.startswith("--kv-cache-tokens 100000000000 (46.6 TiB with the tiny model's ")
    assert "is more than /proc/meminfo's MemAvailable (20.0 GiB); choose at most --kv-cache-tokens " in line
    fit = int(line.rsplit(" ", 1)[1])
    fitting = cpu_memory_asks(EngineConfig(device="cpu", kv_cache_tokens=fit))
    assert first_refusal(fitting, SMALL_MACHINE) is None
    big = cpu_memory_asks(EngineConfig(device="cpu", model_preset="llama-8b"))
    line = first_refusal(big, SMALL_MACHINE)
    assert line is not None
    assert line.endswith("the weights alone do not fit: choose a smaller --model-preset or --dtype")
    assert "its default is --max-num-seqs x --max-model-len" in line
    # sim computes nothing; CUDA memory is the engine's own check
    assert cpu_memory_asks(EngineConfig(device="cpu", executor="sim")) == []
    assert cpu_memory_asks(EngineConfig(device="cuda")) == []


# -- the check and the readings, with the machine faked --------------------------------------------


def test_the_tightest_limit_is_named_and_what_fits_is_said() -> None:
    machine = MachineRoom(
        Room("/dev/shm has free", 23 * GIB + GIB // 2),
        (Room("/proc/meminfo's MemAvailable", 30 * GIB), Room("the cgroup's memory.max of 40.0 GiB leaves", 35 * GIB)),
    )
    ask = SizeAsk("--shm-size", 1 << 20, MIB)
    assert refusal(ask, machine) == (
        "--shm-size 1048576 (1.0 TiB) is more than /dev/shm has free (23.5 GiB); choose at most --shm-size 24064"
    )
    assert refusal(SizeAsk("--shm-size", 24064, MIB), machine) is None
    # A process's own memory does not take /dev/shm's space: the tightest memory limit speaks.
    own = SizeAsk("--x", 31 * GIB, shared=False)
    assert refusal(own, machine) == (
        f"--x {31 * GIB} (31.0 GiB) is more than /proc/meminfo's MemAvailable (30.0 GiB); choose at most --x {30 * GIB}"
    )


def test_a_size_below_one_is_refused_and_an_unreported_limit_refuses_nothing() -> None:
    assert refusal(SizeAsk("--shm-size", 0, MIB), SMALL_MACHINE) == "--shm-size must be at least 1, got 0"
    assert refusal(SizeAsk("--mm-store-bytes", 10**15), MachineRoom(None, ())) is None
    full = MachineRoom(Room("/dev/shm has free", 0), ())
    assert refusal(SizeAsk("--shm-size", 1, MIB), full) == (
        "--shm-size 1 (1.0 MiB) is more than /dev/shm has free (0 B); free some memory first"
    )


def _fake_machine(tmp_path: Path, cgroup_path: str = "/") -> dict[str, Path]:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683772 kB\nMemFree:  100 kB\nMemAvailable:   23756044 kB\n")
    self_cgroup = tmp_path / "self-cgroup"
    self_cgroup.write_text(f"0::{cgroup_path}\n")
    root = tmp_path / "cgroup"
    root.mkdir()
    return {"shm_dir": tmp_path, "meminfo": meminfo, "cgroup_root": root, "self_cgroup": self_cgroup}


def test_the_readings_statvfs_meminfo_and_no_cgroup_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _fake_machine(tmp_path)
    (paths["cgroup_root"] / "memory.max").write_text("max\n")  # no limit set
    (paths["cgroup_root"] / "memory.current").write_text(f"{GIB}\n")
    monkeypatch.setattr(os, "statvfs", lambda path: SimpleNamespace(f_bavail=1000, f_frsize=4096))
    machine = read_machine(**paths)
    assert machine.shm_free == Room(f"{tmp_path} has free", 4_096_000)
    assert machine.memory == (Room(f"{paths['meminfo']}'s MemAvailable", 23756044 * 1024),)


def test_the_cgroup_and_its_parents_limit_memory(tmp_path: Path) -> None:
    """memory.max minus memory.current, with the cgroup's inactive page cache given back, at every level."""
    paths = _fake_machine(tmp_path, "/user.slice/job.scope")
    leaf = paths["cgroup_root"] / "user.slice" / "job.scope"
    leaf.mkdir(parents=True)
    (leaf / "memory.max").write_text(f"{8 * GIB}\n")
    (leaf / "memory.current").write_text(f"{6 * GIB}\n")
    (leaf / "memory.stat").write_text(f"anon 100\ninactive_file {GIB}\nfile 5\n")
    parent = leaf.parent
    (parent / "memory.max").write_text(f"{4 * GIB}\n")
    (parent / "memory.current").write_text(f"{GIB}\n")
    machine = read_machine(**paths)
    assert machine.memory[1:] == (
        Room("the cgroup's memory.max of 8.0 GiB leaves", 3 * GIB),
        Room("the cgroup's memory.max of 4.0 GiB leaves", 3 * GIB),
    )
    assert refusal(SizeAsk("--mm-store-bytes", 4 * GIB), machine) == (
        f"--mm-store-bytes {4 * GIB} (4.0 GiB) is more than the cgroup's memory.max of 8.0 GiB leaves (3.0 GiB); "
        f"choose at most --mm-store-bytes {3 * GIB}"
    )


def test_a_machine_that_reports_nothing_reads_as_no_limits(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    machine = read_machine(missing, missing, missing, missing)
    assert machine == MachineRoom(None, ())
