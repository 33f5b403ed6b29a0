"""An experiment's settings as frozen values: read from the flags once by a command, then passed down.

Nothing below a command reads an ``argparse.Namespace``: a probe at rate inf or
a sweep point is ``dataclasses.replace`` of these, never a mutated namespace.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from harness.analysis.stats import DEFAULT_MARGIN_PCT
from harness.engine.config import EngineConfig
from harness.experiment.arms import ArmSpec, split_arm_env
from harness.experiment.server_flags import engine_of
from harness.experiment.sglang_server import SglangServer, check_arm_env, check_flags
from harness.experiment.vllm_server import VllmServer, check_python
from harness.loadgen.client import CHAT_COMPLETIONS, COMPLETIONS
from harness.loadgen.settings import LoadSettings
from harness.settings.declare import setting
from harness.workloads.spec import WorkloadSpec

DEFAULT_BLOCK_SIZE = 20  # requests an arm sends before the next arm's turn, when runs are in blocks
AUTO = "auto"  # --request-rate auto: a share of the capacity a probe measures
AUTO_LOAD = 0.5  # that share
SERVER_READY_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class ServerSettings:
    """How each arm's `bench serve` starts: the model/engine flags every arm shares, and per arm extras."""

    flags: tuple[str, ...] = ()  # experiment.server_flags.server_flags of the command line
    served_model: str = "wirebench-tiny"
    model_named: bool = False  # --served-model-name given: every arm is sent it, servers of a command arm too
    arm_flags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # label → extra flags
    log_path: str | None = None  # append every server's output here
    trace_file: str | None = None  # each server writes Chrome trace JSON (PATH-<arm>-r<round>)
    ready_timeout_s: float = SERVER_READY_TIMEOUT_S
    vllm: VllmServer | None = None  # --server vllm: how each arm's real vLLM starts
    sglang: SglangServer | None = None  # --server sglang: how each arm's real SGLang starts

    @property
    def engine(self) -> EngineConfig:
        """The engine settings ``flags`` give every arm's server (an arm's own flags aside)."""
        return engine_of(self.flags)


def parse_cpus(text: str) -> tuple[int, ...]:
    """'1', '1,3' or '2-3,6' as CPU numbers (ValueError on anything else)."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"--pin-servers: {text!r} is not a CPU list like 1 or 2-3,6")
        cpus.update(range(int(low), int(high or low) + 1))
    return tuple(sorted(cpus))


@dataclass(frozen=True)
class RunPlan:
    """How the arms are run and judged: rounds, blocks, whether a probe fixes the rate, where results go.
    A field declared with ``setting`` is its own flag (harness.settings.declare); the others are read by
    ``experiment_from_args``."""

    repeat: int = 1
    block_size: int | None = setting(
        None,
        flag="--block-size",
        type=int,
        metavar="N",
        help="keep every arm's server up for the round and let the arms take turns, N requests at a time "
        "(A B, B A, ...): each arm sees the same moments of a shared machine; 0: each arm serves the "
        f"whole workload in turn (default: {DEFAULT_BLOCK_SIZE} with two or more arms sent from this process, "
        "else 0)",
        comparable=True,
    )
    duet: bool = setting(
        False,
        flag="--duet",
        help="in blocks, send every arm's block at the same moment instead of in turns (duet benchmarking: "
        "a pair of blocks shares the machine's moment exactly); only where the machine has a core for every "
        "busy process of every arm: on 2 busy cores the arms share each other's CPU costs, and a cost "
        "injected into one arm read a third of its size (docs/results.md)",
        comparable=True,
    )
    block_gap: float | None = setting(
        None,
        flag="--block-gap",
        type=float,
        metavar="SECONDS",
        help="in blocks, wait this long before a block goes to another arm than the last one (and before a "
        "round's first, after the warmups), so the last arm's server has gone quiet (default: 1.5 when an "
        "arm is a real vLLM, whose worker keeps polling its queue for 1 s after its last step, on the cores "
        "the next arm needs; else 0)",
        comparable=True,
    )
    pin_servers: str = setting(
        "",
        flag="--pin-servers",
        metavar="CPUS",
        help="run every arm's server processes on these CPUs (e.g. 1, or 2-3,6) and the load generator on the "
        "others, so the client's event loop and the servers do not take each other's cores",
        comparable=True,
    )
    until_resolved: float = setting(
        0.0,
        flag="--until-resolved",
        metavar="MINUTES",
        help="add rounds in blocks until the primary figure of every arm is resolved (slower, faster or "
        "equivalent within the margin) or a round would not end within MINUTES, judging with an anytime-valid "
        "test that holds its error rate however often it looks (--repeat is then ignored; docs/method.md)",
    )
    margin_pct: float = DEFAULT_MARGIN_PCT
    # --request-rate auto: a capacity probe fixes the load's rate before the rounds (harness.experiment.probe).
    auto_rate: bool = True
    save_result: bool = True
    result_dir: str = "results"
    full_report: bool = setting(
        False,
        flag="--full-report",
        help="print each run's whole report (benchmark_serving's figures, wirebench's, the client's health, "
        "process CPU: ~90 lines) instead of one line a run; the run file has all of it either way",
    )

    def check(self) -> None:
        if self.repeat < 1:
            raise ValueError("--repeat must be >= 1")
        if self.block_size is not None and self.block_size < 0:
            raise ValueError(f"--block-size must be >= 0, got {self.block_size}")
        if self.block_gap is not None and not 0 <= self.block_gap <= 60:
            raise ValueError(f"--block-gap must be between 0 and 60 seconds, got {self.block_gap:g}")
        if self.pin_servers:
            usable = os.sched_getaffinity(0)
            outside = set(self.server_cpus) - usable
            if outside or not usable - set(self.server_cpus):
                why = f"CPUs {sorted(outside)} are not usable here" if outside else "it leaves the client none"
                raise ValueError(f"--pin-servers {self.pin_servers}: {why} (usable: {sorted(usable)})")
        if self.until_resolved < 0:
            raise ValueError(f"--until-resolved must be >= 0 minutes, got {self.until_resolved:g}")
        if self.duet and not self.block_size:
            raise ValueError(
                "--duet sends the arms' blocks side by side: it needs --block-size N > 0 (the default with two or "
                "more arms) and one sender (no --workers/--ray)"
            )
        if self.until_resolved and not self.block_size:
            raise ValueError(
                "--until-resolved judges pairs of blocks: it needs --block-size N > 0 (the default with two or more "
                "arms) and one sender (no --workers/--ray)"
            )

    @property
    def server_cpus(self) -> tuple[int, ...]:
        """--pin-servers as CPU numbers (empty: not pinned)."""
        return parse_cpus(self.pin_servers) if self.pin_servers else ()

    @property
    def sequential(self) -> bool:
        """Rounds until the answer is known, judged with the anytime-valid test."""
        return self.until_resolved > 0

    def with_blocks_for(self, arms: int, one_sender: bool) -> RunPlan:
        """The block size resolved: the one given, else DEFAULT_BLOCK_SIZE when two or more arms are sent
        from this process (blocks need one sender), else 0."""
        if self.block_size is not None:
            return self
        return replace(self, block_size=DEFAULT_BLOCK_SIZE if arms > 1 and one_sender else 0)


@dataclass(frozen=True)
class Experiment:
    """Everything one comparison needs: the arms, the workload, the load, the servers, the plan.

    ``flags`` is the command line as parsed, recorded in result documents (``record`` overlays the
    values this experiment actually used: the resolved rate, the endpoint, the workload).
    """

    arms: tuple[ArmSpec, ...]
    workload: WorkloadSpec
    load: LoadSettings
    server: ServerSettings
    plan: RunPlan
    flags: Mapping[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        """Refuse bad settings before any server starts (ValueError, or BenchmarkError from the load)."""
        if self.plan.until_resolved and len(self.arms) < 2:
            raise ValueError("--until-resolved compares arms: give two or more (--codec A,B)")
        self.plan.check()
        if self.server.vllm is not None:
            self.server.vllm.check(self.workload.tokenizer)
            for arm in self.arms:
                if arm.server == "vllm":  # an unpickling codec on a link that may be tcp: refused now
                    arm_env, flags = split_arm_env(self.server.arm_flags.get(arm.label, ()))
                    self.server.vllm.serialization_env(arm.codec, flags, arm_env)
                    if arm.python:  # the arm's own vLLM build
                        check_python(arm.python, f"--arm {arm.label}")
        for arm in self.arms:
            why = arm.unsupported() if arm.server == "sglang" else None
            if why:  # nothing to compare on a grid of one transport: refused now, not shown as a cell
                raise ValueError(f"{arm.label}: {why}")
        if self.server.sglang is not None:
            self.server.sglang.check()
            for arm in self.arms:
                arm_env, flags = split_arm_env(self.server.arm_flags.get(arm.label, ()))
                check_arm_env(arm_env, arm.label)
                check_flags(list(flags), f"--arm-flags {arm.label}")
                if arm.python:  # the arm's own SGLang build
                    check_python(arm.python, f"--arm {arm.label}", "--with-sglang-cpu", "SGLang")
        if self.plan.block_size and (self.load.workers != 1 or self.load.ray is not None):
            raise ValueError("--block-size sends every arm's blocks from this process: drop --workers/--ray")

    def with_images_on_chat(self) -> tuple[Experiment, bool]:
        """Images only travel through chat: an image workload on /v1/completions moves to chat (True when it did)."""
        if self.workload.has_images and self.load.endpoint == COMPLETIONS:
            return replace(self, load=replace(self.load, endpoint=CHAT_COMPLETIONS)), True
        return self, False

    @property
    def request_rate(self) -> float | str:
        """The load's rate, or 'auto' while a probe has yet to fix it."""
        return AUTO if self.plan.auto_rate else self.load.request_rate

    def at_rate(self, rate: float) -> Experiment:
        """This experiment at a fixed rate (no probe)."""
        return replace(self, plan=replace(self.plan, auto_rate=False), load=replace(self.load, request_rate=rate))

    def record(self) -> dict[str, Any]:
        """The flags as this experiment ran them, for result documents."""
        return {
            **self.flags,
            **self.workload.record(),
            "endpoint": self.load.endpoint,
            "request_rate": self.request_rate,
            "repeat": self.plan.repeat,
            "block_size": self.plan.block_size,
            "until_resolved": self.plan.until_resolved,
            "duet": self.plan.duet,
            "pin_servers": self.plan.pin_servers,
            "result_dir": self.plan.result_dir,
        }
