"""``bench serve``: the OpenAI-compatible frontend plus the engine process.

By default the frontend spawns the engine and both talk over ipc sockets in
a private temporary directory. ``--engine-only`` runs just the engine, bound
on tcp, and ``--frontend-only`` connects a frontend to such an engine, so the
two can run on different hosts.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp import web

from harness.analysis.documents import write_json
from harness.engine.config import EngineConfig, codec_spec
from harness.engine.device import cpu_memory_asks
from harness.experiment.server import ready_line
from harness.experiment.server_flags import add_model_arguments
from harness.frontend.engine_client import REQUEST_TIMEOUT_S, ZmqEngineClient
from harness.frontend.served import ServedSettings
from harness.frontend.settings import FrontendSettings
from harness.processes import machine_limits, parent_watch
from harness.processes.heap import freeze_heap
from harness.settings import declare
from harness.transports import SenderSettings, get_transport
from harness.transports.base import DEFAULT_ARENA_MIB, DEFAULT_THRESHOLD
from harness.transports.policy import LinkSettings, check_shm, check_transport_safety, insecure_warnings
from harness.transports.registry import remove_leftovers, remove_stale
from harness.wire import curve, zmq_link
from harness.wire.spans import trace_events
from harness.wire.zmq_link import EngineAddresses
from wirecodecs import codec_listing

log = logging.getLogger("wirebench.serve")

DESCRIPTION = """\
Start an OpenAI-compatible server (/v1/completions, /v1/chat/completions,
/v1/models, /metrics) whose API process passes each request to an engine
process with the chosen codec and transport. By default the API process
starts the engine and the two talk over ipc sockets in a private folder;
--engine-only and --frontend-only split them over tcp, so they can run on
two hosts."""

EPILOG = """\
examples:
  bench serve --codec msgspec --port 8000
  bench serve --codec msgspec-oob --transport shm --executor sim"""


ENGINE_READY_TIMEOUT_S = 300.0  # an 8B model with random weights takes a while on a GPU


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--codec",
        default="pickle",
        type=codec_spec,
        help=f"wire codec of requests, and of outputs unless --output-codec: {codec_listing()}; options "
        "after + inject a known cost, e.g. pickle+request-delay=500us",
    )
    p.add_argument("--host", default="127.0.0.1", help="HTTP host")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (0 = any free port)")
    p.add_argument("--seed", type=int, default=EngineConfig.seed, help="model weights and sampling seed")
    add_model_arguments(p)
    t = p.add_argument_group("engine link")
    t.add_argument(
        "--socket",
        choices=("ipc", "tcp"),
        default="ipc",
        help="ipc (default: sockets in a private 0700 directory) or tcp to --engine-host:--engine-port",
    )
    t.add_argument("--engine-host", default="127.0.0.1", help="tcp: engine address (binds here with --engine-only)")
    t.add_argument("--engine-port", type=int, default=5570, help="tcp: input port; output uses port+1")
    mode = t.add_mutually_exclusive_group()
    mode.add_argument("--engine-only", action="store_true", help="run only the engine, bound on tcp")
    mode.add_argument("--frontend-only", action="store_true", help="run only the frontend against a tcp engine")
    t.add_argument(
        "--curve-dir",
        default=None,
        metavar="PATH",
        help="tcp split: the engine's CURVE keys (created by --engine-only, read by --frontend-only; "
        "default ~/.wirebench/curve/engine-PORT)",
    )
    declare.add_arguments(t, LinkSettings)  # --no-auth, --allow-remote-no-auth, --allow-insecure-pickle, --transport
    t.add_argument(
        "--shm-size",
        type=int,
        default=DEFAULT_ARENA_MIB,
        metavar="MIB",
        help=f"shm: the arena's size; a full arena makes requests wait, then fail (default {DEFAULT_ARENA_MIB})",
    )
    t.add_argument(
        "--shm-threshold",
        type=int,
        default=DEFAULT_THRESHOLD,
        metavar="BYTES",
        help=f"every transport but zmq: smaller frames stay in the message (default {DEFAULT_THRESHOLD})",
    )
    t.add_argument(
        "--engine-stall-timeout",
        type=float,
        default=zmq_link.STALL_TIMEOUT_S,
        metavar="S",
        help=f"seconds without a message before the engine counts as stalled (its requests fail, /health 503); "
        f"it is taken back when it answers again (default {zmq_link.STALL_TIMEOUT_S:g})",
    )
    t.add_argument(
        "--request-timeout",
        type=float,
        default=REQUEST_TIMEOUT_S,
        metavar="S",
        help="seconds without an output for one request before it fails (504) and is aborted in the engine "
        "(default %(default)s)",
    )
    lim = p.add_argument_group("request limits (a 400, 408, 413 or 415 with an OpenAI-style error)")
    declare.add_arguments(lim, FrontendSettings)
    p.add_argument(
        "--trace-file",
        default=None,
        metavar="PATH",
        help="at stop, write the request timelines as Chrome trace-event JSON (open in ui.perfetto.dev)",
    )
    p.add_argument(
        "--log-level",
        default="WARNING",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="the server's logging threshold (default %(default)s)",
    )


def write_trace(path: str, client: ZmqEngineClient, engine_pid: int | None) -> None:
    """The timelines the frontend joined, as Chrome trace events (harness.wire.spans.trace_events)."""
    t = client.timelines
    if not t.enabled:
        print(f"bench serve: no trace written: request timelines {t.unavailable}", file=sys.stderr)
        return
    pid = engine_pid or int(client.engine_info.get("pid", 0))
    doc = trace_events(list(t.requests), list(t.batches), list(t.steps), os.getpid(), pid)
    write_json(path, doc, indent=None)
    print(f"Trace written to {path} ({len(doc['traceEvents'])} events)", flush=True)


def engine_config_from_args(args: argparse.Namespace, tokenizer: Any) -> EngineConfig:
    """The engine's config from its declared flags, plus what serve's own flags and the tokenizer say."""
    return declare.from_args(
        EngineConfig,
        args,
        codec=args.codec,
        seed=args.seed,
        vocab_size=tokenizer.vocab_size,
        eos_token_id=tokenizer.eos_token_id,
        # The engine checks the frontend's bounds again: the same values, from the same declared flags.
        request_limits=FrontendSettings(
            max_model_len=args.max_model_len, **declare.field_values(FrontendSettings, vars(args))
        ).limits(),
    )


def _addresses(args: argparse.Namespace) -> EngineAddresses:
    """ipc in a private directory, or tcp; tcp is CURVE-authenticated unless --no-auth (harness.wire.curve)."""
    if not (args.socket == "tcp" or args.engine_only or args.frontend_only):
        return EngineAddresses.private_ipc()
    keys = None
    if not args.no_auth:
        if args.engine_only or args.frontend_only:
            folder = Path(args.curve_dir) if args.curve_dir else curve.default_dir(args.engine_port)
            keys = curve.create_or_load(folder) if args.engine_only else curve.load(folder)
            keys = curve.for_engine(keys) if args.engine_only else curve.for_frontend(keys)
        else:
            keys = curve.ephemeral()  # both halves here; the spawned engine gets its own in its addresses
    return EngineAddresses.tcp(args.engine_host, args.engine_port, keys)


def _key_dir(args: argparse.Namespace) -> Path:
    return Path(args.curve_dir) if args.curve_dir else curve.default_dir(args.engine_port)


def machine_refusal(config: EngineConfig | None, transport: str, sender: SenderSettings | None) -> str | None:
    """A size beyond what this machine has room for: the sender's shared memory, the engine's memory
    (None: this process starts none), checked before either is allocated (harness.processes.machine_limits)."""
    asks = machine_limits.shared_memory_asks(transport, sender) if sender is not None else []
    asks += cpu_memory_asks(config) if config is not None else []
    return machine_limits.first_refusal(asks)


def link_refusal(
    link: LinkSettings, addresses: EngineAddresses, config: EngineConfig | None, sender: SenderSettings | None
) -> str | None:
    """The first reason to refuse this engine link, checked in one order wherever a start makes one (a
    spawned engine, --engine-only, --frontend-only), after printing its warnings. ``config``: the engine this
    process starts (None: none); ``sender``: what this process sends through (None: nothing)."""
    from harness.engine.cuda_graphs import refusal as graphs_refusal

    for warning in insecure_warnings(link, addresses):
        print(f"bench serve: WARNING: {warning}", file=sys.stderr)
    return (
        check_transport_safety(link, addresses)
        or check_shm(link, addresses)
        or (graphs_refusal(config) if config is not None else None)
        or machine_refusal(config, link.transport, sender)
    )


def link_settings(args: argparse.Namespace) -> LinkSettings:
    """The engine link's choices, as the rules of harness.transports.policy judge them."""
    return declare.from_args(
        LinkSettings,
        args,
        codec=args.codec,
        output_codec=args.output_codec,
        engine_only=args.engine_only,
        frontend_only=args.frontend_only,
    )


async def serve(args: argparse.Namespace, ready: asyncio.Event | None = None) -> int:
    from harness.engine.process import run_engine
    from harness.frontend.app import build_app
    from harness.tokenizers.tokenizer import load_tokenizer

    served = declare.from_args(ServedSettings, args)
    tokenizer = load_tokenizer(served.tokenizer)
    config = engine_config_from_args(args, tokenizer)
    for stale, pid in zmq_link.remove_stale_ipc_dirs():
        log.warning("removed %s, left by a process that is gone", stale)
        for name in remove_leftovers(pid):  # e.g. a frontend killed while torch created a storage
            log.warning("removed shared memory %s, left by the same process", name)
    try:
        addresses = _addresses(args)
    except (FileNotFoundError, curve.KeyFolderError) as exc:
        print(f"bench serve: {exc}", file=sys.stderr)
        return 2
    link = link_settings(args)
    sender_settings = SenderSettings(args.shm_threshold, args.shm_size << 20, link.mm_store_bytes)
    # A frontend-only host runs no engine: the engine's host refuses --cuda-graphs where it cannot run.
    error = link_refusal(link, addresses, None if args.frontend_only else config, sender_settings)
    if error:
        print(f"bench serve: {error}", file=sys.stderr)
        addresses.cleanup()
        return 2
    for stale in remove_stale():
        log.warning("removed shared memory %s, left by a process that is gone", stale)
    transport = get_transport(link.transport)

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    process = None
    client: ZmqEngineClient | None = None
    runner: web.AppRunner | None = None
    sender = None
    engine_ready = False  # an engine stopped while it starts hears no shutdown: it is terminated at once
    try:
        sender = transport.sender(sender_settings)
        segment = sender.segment if sender is not None else None
        if not args.frontend_only:
            ctx = multiprocessing.get_context("spawn")
            engine_addresses = (
                replace(addresses, curve=curve.for_engine(addresses.curve)) if addresses.curve else addresses
            )
            # The engine maps memory only of this process, only in this segment, only by this transport.
            engine_addresses = replace(
                engine_addresses, frontend_segment=segment, transport=link.transport, frontend_pid=os.getpid()
            )
            process = ctx.Process(
                target=run_engine,
                args=(config, engine_addresses, args.log_level, True),
                name="wirebench-engine",
                daemon=True,
            )
            process.start()
        client = ZmqEngineClient(
            args.codec,
            replace(addresses, curve=curve.for_frontend(addresses.curve)) if addresses.curve else addresses,
            output_codec=args.output_codec,
            extra_cpu_us_per_token=served.frontend_cpu_us_per_token,
            heartbeat_timeout_s=args.engine_stall_timeout,
            request_timeout_s=args.request_timeout,
            verify=served.verify,
            sender=sender,
            is_process_alive=(process.is_alive if process else None),
            owns_engine=not args.frontend_only,
            spans=config.spans,
        )
        ready_task = asyncio.ensure_future(
            client.wait_ready(ENGINE_READY_TIMEOUT_S, accept_heartbeat=args.frontend_only)
        )
        stop_task = asyncio.ensure_future(stop.wait())
        await asyncio.wait({ready_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        if stop_task.done():
            ready_task.cancel()
            return 130
        stop_task.cancel()
        info = ready_task.result()
        engine_ready = True
        client.start()
        settings = FrontendSettings.from_engine_config(
            config,
            mm_payload=served.mm_payload,
            mm_tensor_size=served.mm_tensor_size,
            mm_tensor_dtype=served.mm_tensor_dtype,
            **declare.field_values(FrontendSettings, vars(args)),
        )
        if served.served_model_name:
            settings = replace(settings, served_model_name=served.served_model_name)
        app = build_app(client, tokenizer, settings)
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            handler_cancellation=True,
            keepalive_timeout=settings.header_timeout_s,  # idle or slow-header connections are closed
            auto_decompress=False,  # a compressed body is refused (415), never inflated while it arrives
        )
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        if config.gc_freeze:
            freeze_heap()  # everything started: keep it out of full collections
        server = site._server
        port = server.sockets[0].getsockname()[1] if isinstance(server, asyncio.Server) else args.port
        engine_desc = ", ".join(f"{k}={v}" for k, v in info.items() if k != "pid")
        engine_desc = f"transport={link.transport}, {engine_desc}"
        host = f"[{args.host}]" if ":" in args.host else args.host  # an IPv6 literal needs brackets in a URL
        print(ready_line(args.codec, f"http://{host}:{port}", engine_desc), flush=True)
        if ready is not None:
            ready.set()
        await stop.wait()
        return 0
    except Exception as exc:  # startup failures: one clear line, not a traceback
        print(f"bench serve: {exc}", file=sys.stderr)
        return 1
    finally:
        if runner is not None:
            await runner.cleanup()
        if client is not None:
            await client.shutdown()
            if args.trace_file:
                write_trace(args.trace_file, client, process.pid if process else None)
        elif sender is not None:  # a start that failed before the client took the sender
            sender.close()
        if process is not None:
            process.join(timeout=5 if engine_ready else 0)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
            if process.pid is not None:  # e.g. an engine killed while torch created a storage
                remove_leftovers(process.pid)
        addresses.cleanup()


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    parent_watch.die_with_parent()
    if args.engine_only:
        from harness.engine.process import run_engine
        from harness.tokenizers.tokenizer import load_tokenizer

        addresses = _addresses(args)
        config = engine_config_from_args(args, load_tokenizer(args.tokenizer))
        error = link_refusal(link_settings(args), addresses, config, None)
        if error:
            print(f"bench serve: {error}", file=sys.stderr)
            return 2
        auth = "no authentication" if addresses.curve is None else f"CURVE keys in {_key_dir(args)}"
        line = f"wirebench engine codec={args.codec} listening on {addresses.input} / {addresses.output} ({auth})"
        # Said once the sockets are bound, so a script waiting for the line can connect at once.
        run_engine(config, addresses, args.log_level, False, on_listening=lambda: print(line, flush=True))
        return 0
    return asyncio.run(serve(args))
