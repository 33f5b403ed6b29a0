"""The flags of an experiment (``bench run``, ``calibrate``, ``sweep``), and the one place they
become typed settings: ``experiment_from_args``."""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

from harness.analysis import stats
from harness.experiment.arms import ARM_HELP, SERVERS, ArmSpec, parse_arm_flags, parse_arms, parse_build_arms
from harness.experiment.server_flags import add_model_arguments, server_flags
from harness.experiment.settings import AUTO, AUTO_LOAD, Experiment, RunPlan, ServerSettings
from harness.experiment.sglang_server import SglangServer
from harness.experiment.vllm_server import VllmServer
from harness.frontend.settings import default_model_name
from harness.loadgen.arrivals import positive_rate
from harness.loadgen.conversations import is_conversational
from harness.loadgen.flags import add_load_arguments, flags_dict
from harness.loadgen.settings import LoadSettings
from harness.settings.declare import add_arguments, from_args
from harness.transports import transport_names
from harness.workloads.datasets import add_dataset_arguments
from harness.workloads.spec import WorkloadSpec

RATE_HELP = (
    f"requests per second, 'inf' (all at once, benchmark_serving's default: a saturation test) or "
    f"'auto' (default: {AUTO_LOAD * 100:.0f}%% of the capacity a short probe at rate inf measures, "
    "so TTFT measures serving, not a queue)"
)
CODEC_HELP = (
    "codec name, a comma-separated list, or 'all' (default %(default)s); the first is the reference; "
    "a repeated name is an A/A arm; options after + inject a known cost (pickle+request-delay=500us)"
)


def rate_or_auto(text: str) -> float | str:
    return AUTO if text == AUTO else positive_rate(text)


def add_experiment_arguments(
    p: argparse.ArgumentParser,
    *,
    codec_default: str = "pickle",
    codec_help: str = CODEC_HELP,
    rate_help: str = RATE_HELP,
) -> None:
    """Every flag of an experiment: arms, rounds, blocks, margin, servers, workload, model, load."""
    p.add_argument("--codec", default=codec_default, help=codec_help)
    p.add_argument(
        "--transport",
        default="zmq",
        help=f"{', '.join(transport_names())}, or a comma list: every codec runs on every transport "
        "(interleaved in one table); all but zmq need a codec with out-of-band frames (see bench serve --help)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help=f"interleaved rounds, each in the order of one row of a Williams design (default %(default)s; "
        f"verdicts need >= {stats.MIN_ROUNDS}; the power of {stats.DEFAULT_ROUNDS} is in docs/method.md; "
        "ignored with --until-resolved)",
    )
    add_arguments(p, RunPlan)  # --block-size, --until-resolved
    p.add_argument(
        "--margin-pct",
        type=float,
        default=stats.DEFAULT_MARGIN_PCT,
        help=f"equivalence margin of the verdicts in percent (default {stats.DEFAULT_MARGIN_PCT:g})",
    )
    p.add_argument("--arm", action="append", default=[], metavar="NAME=SPEC", help=ARM_HELP)
    p.add_argument(
        "--server",
        choices=SERVERS,
        default="wirebench",
        help="whose server each arm runs: wirebench's own (bench serve); a real vLLM whose engine link the "
        "arm's codec replaces (vllm: vLLM's own msgpack), timed inside it by wirebench's plugin; or a real SGLang "
        "in the IPC mode the arm names (pickle or msgspec), every hop timed by wirebench's hook; a real server "
        "stays up across rounds in blocks (default %(default)s)",
    )
    add_arguments(p.add_argument_group("a real vLLM (--server vllm)"), VllmServer)
    add_arguments(p.add_argument_group("a real SGLang (--server sglang)"), SglangServer)
    p.add_argument("--server-log", default=None, help="append each server's output to this file")
    p.add_argument(
        "--arm-flags",
        action="append",
        default=[],
        metavar="LABEL=FLAGS",
        help="extra bench serve flags for one arm, e.g. --codec msgspec,msgspec --arm-flags 'msgspec#2=--no-spans' "
        "(an A/B of a server setting); with --server vllm, vLLM's flags, led by its environment variables if any "
        "('vllm#2=VLLM_MSGPACK_ZERO_COPY_THRESHOLD=1024 --mm-tensor-ipc torch_shm'); repeatable",
    )
    p.add_argument(
        "--trace-file",
        default=None,
        metavar="PATH",
        help="each server writes its request timelines as Chrome trace JSON: PATH with -<arm>-r<round> added",
    )
    add_dataset_arguments(p)  # defines --seed: the workload, arrivals and model weights share it
    add_model_arguments(p)
    # bench run's default rate is measured, not infinite (bench load keeps benchmark_serving's inf).
    add_load_arguments(p, rate_type=rate_or_auto, rate_default=AUTO, rate_help=rate_help)
    # A few untimed requests per server first, so one-off costs (allocator,
    # first model call) land outside every codec's measurement alike.
    p.set_defaults(warmup_requests=4)


def experiment_from_args(args: argparse.Namespace, arms: list[ArmSpec] | None = None) -> Experiment:
    """The experiment a parsed command line describes (ValueError or BenchmarkError on bad flags).
    ``arms``: the command's own (calibrate makes them); default: --codec × --transport."""
    build_flags: dict[str, tuple[str, ...]] = {}
    server_kind = getattr(args, "server", "wirebench")  # a real vLLM's arms accept its own serializer too
    if arms is None and getattr(args, "arm", None):
        arms, build_flags = parse_build_arms(args.arm, args.codec, args.transport, server_kind)
    arms = arms if arms is not None else parse_arms(args.codec, args.transport, server_kind)
    vllm = from_args(VllmServer, args) if server_kind == "vllm" else None
    sglang = from_args(SglangServer, args) if server_kind == "sglang" else None
    if server_kind != "wirebench":
        arms = [a if a.command else replace(a, server=server_kind) for a in arms]
    arm_flags = parse_arm_flags(args.arm_flags, arms)
    values = vars(args)
    rate = args.request_rate
    # The load is checked at rate inf when the rate is auto: the probe fixes it later.
    load = LoadSettings.from_args(argparse.Namespace(**{**values, "request_rate": math.inf if rate == AUTO else rate}))
    server = ServerSettings(
        flags=tuple(server_flags(values, args.seed)),
        served_model=args.served_model_name or default_model_name(args.model_preset),
        model_named=bool(args.served_model_name),
        arm_flags={k: (*build_flags.get(k, ()), *arm_flags.get(k, ())) for k in {*build_flags, *arm_flags}},
        log_path=args.server_log,
        trace_file=args.trace_file,
        vllm=vllm,
        sglang=sglang,
    )
    plan = from_args(
        RunPlan,
        args,
        repeat=args.repeat,
        margin_pct=args.margin_pct,
        auto_rate=rate == AUTO,
        save_result=args.save_result,
        result_dir=args.result_dir,
    )
    # Blocks are runs of independent requests: a conversation's later turns wait on its earlier ones.
    conversational = is_conversational(getattr(args, "dataset_name", None))
    plan = plan.with_blocks_for(len(arms), one_sender=load.workers == 1 and load.ray is None and not conversational)
    return Experiment(tuple(arms), WorkloadSpec.from_args(args), load, server, plan, flags=flags_dict(args))
