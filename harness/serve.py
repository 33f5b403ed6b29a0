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
import signal
import sys
from dataclasses import replace
from typing import Any

from aiohttp import web

from harness.engine.config import EngineConfig
from harness.frontend.engine_client import ZmqEngineClient
from harness.serve_process import ready_line
from harness.transport import EngineAddresses, is_loopback
from wirecodecs import UnknownCodecError, available_codecs, check_codec_spec, unpickles_peer_data

log = logging.getLogger("wirebench.serve")

ENGINE_READY_TIMEOUT_S = 300.0  # an 8B model with random weights takes a while on a GPU


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--codec",
        default="pickle",
        type=codec_spec,
        help=f"wire codec in both directions: {', '.join(available_codecs())}; options after + inject a known "
        "cost (pickle+request-delay=500us, see wirecodecs.calibration)",
    )
    p.add_argument("--host", default="127.0.0.1", help="HTTP host")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (0 = any free port)")
    p.add_argument("--seed", type=int, default=EngineConfig.seed, help="model weights and sampling seed")
    add_model_arguments(p)
    t = p.add_argument_group("transport")
    t.add_argument("--transport", choices=("ipc", "tcp"), default="ipc")
    t.add_argument("--engine-host", default="127.0.0.1", help="tcp: engine address (binds here with --engine-only)")
    t.add_argument("--engine-port", type=int, default=5570, help="tcp: input port; output uses port+1")
    mode = t.add_mutually_exclusive_group()
    mode.add_argument("--engine-only", action="store_true", help="run only the engine, bound on tcp")
    mode.add_argument("--frontend-only", action="store_true", help="run only the frontend against a tcp engine")
    t.add_argument(
        "--allow-insecure-pickle",
        action="store_true",
        help="allow a pickle codec over non-loopback tcp (unpickling runs code the peer chooses)",
    )
    p.add_argument("--log-level", default="WARNING")


def codec_spec(name: str) -> str:
    """argparse type of --codec: a codec ``get_codec`` accepts, options included."""
    try:
        return check_codec_spec(name)
    except UnknownCodecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of what is served (model, engine limits, payload form); `bench run` forwards these."""
    g = p.add_argument_group("served model and engine")
    g.add_argument("--served-model-name", default=None, help="model id in the API (default: wirebench-<preset>)")
    g.add_argument("--tokenizer", default=None, help="path of a tokenizer.json (default: the embedded BPE)")
    g.add_argument(
        "--mm-payload",
        choices=("pil", "tensor"),
        default="pil",
        help="images travel as PIL images or as processed pixel tensors",
    )
    g.add_argument("--mm-tensor-size", type=int, default=336, help="side of processed pixel tensors")
    g.add_argument("--mm-tensor-dtype", default="float16", help="dtype of processed pixel tensors")
    defaults = EngineConfig()
    g.add_argument("--model-preset", default=defaults.model_preset)
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default=defaults.device)
    g.add_argument("--dtype", default=defaults.dtype, help="auto: float32 on CPU, bfloat16 on CUDA")
    g.add_argument(
        "--executor",
        choices=("torch", "sim"),
        default=defaults.executor,
        help="torch runs the model; sim models each step's time with no compute",
    )
    g.add_argument("--sim-step-fixed-ms", type=float, default=defaults.sim_step_fixed_ms)
    g.add_argument("--sim-step-per-token-ms", type=float, default=defaults.sim_step_per_token_ms)
    g.add_argument("--engine-threads", type=int, default=defaults.num_threads, help="torch CPU threads in the engine")
    g.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    g.add_argument("--max-num-batched-tokens", type=int, default=defaults.max_num_batched_tokens)
    g.add_argument("--max-model-len", type=int, default=defaults.max_model_len)
    g.add_argument("--kv-cache-tokens", type=int, default=defaults.kv_cache_tokens)
    g.add_argument("--image-tokens", type=int, default=defaults.image_tokens, help="embeddings per image")


def engine_config_from_args(args: argparse.Namespace, tokenizer: Any) -> EngineConfig:
    return EngineConfig(
        codec=args.codec,
        model_preset=args.model_preset,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        vocab_size=tokenizer.vocab_size,
        eos_token_id=tokenizer.eos_token_id,
        num_threads=args.engine_threads,
        executor=args.executor,
        sim_step_fixed_ms=args.sim_step_fixed_ms,
        sim_step_per_token_ms=args.sim_step_per_token_ms,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        kv_cache_tokens=args.kv_cache_tokens,
        image_tokens=args.image_tokens,
    )


def _addresses(args: argparse.Namespace) -> EngineAddresses:
    if args.transport == "tcp" or args.engine_only or args.frontend_only:
        return EngineAddresses.tcp(args.engine_host, args.engine_port)
    return EngineAddresses.private_ipc()


def check_transport_safety(args: argparse.Namespace, addresses: EngineAddresses) -> str | None:
    """An error message when a codec that unpickles peer data would face a non-loopback peer."""
    if unpickles_peer_data(args.codec) and not args.allow_insecure_pickle:
        for address in (addresses.input, addresses.output):
            if not is_loopback(address):
                return (
                    f"refusing codec {args.codec!r} over non-loopback {address}: it unpickles "
                    "frames, which runs code chosen by the peer. Use a msgspec codec, or pass "
                    "--allow-insecure-pickle if every host on that network is trusted."
                )
    return None


async def serve(args: argparse.Namespace, ready: asyncio.Event | None = None) -> int:
    from harness.engine.process import run_engine
    from harness.frontend.app import build_app
    from harness.frontend.settings import FrontendSettings
    from harness.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    config = engine_config_from_args(args, tokenizer)
    addresses = _addresses(args)
    error = check_transport_safety(args, addresses)
    if error:
        print(f"bench serve: {error}", file=sys.stderr)
        addresses.cleanup()
        return 2

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    process = None
    client: ZmqEngineClient | None = None
    runner: web.AppRunner | None = None
    try:
        if not args.frontend_only:
            ctx = multiprocessing.get_context("spawn")
            process = ctx.Process(
                target=run_engine, args=(config, addresses, args.log_level, True), name="wirebench-engine", daemon=True
            )
            process.start()
        client = ZmqEngineClient(
            args.codec,
            addresses,
            is_process_alive=(process.is_alive if process else None),
            owns_engine=not args.frontend_only,
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
        client.start()
        settings = FrontendSettings.from_engine_config(
            config, mm_payload=args.mm_payload, mm_tensor_size=args.mm_tensor_size, mm_tensor_dtype=args.mm_tensor_dtype
        )
        if args.served_model_name:
            settings = replace(settings, served_model_name=args.served_model_name)
        app = build_app(client, tokenizer, settings)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        server = site._server
        port = server.sockets[0].getsockname()[1] if isinstance(server, asyncio.Server) else args.port
        engine_desc = ", ".join(f"{k}={v}" for k, v in info.items() if k != "pid")
        print(ready_line(args.codec, f"http://{args.host}:{port}", engine_desc), flush=True)
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
        if process is not None:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
        addresses.cleanup()


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.engine_only:
        from harness.engine.process import run_engine
        from harness.tokenizer import load_tokenizer

        addresses = EngineAddresses.tcp(args.engine_host, args.engine_port)
        error = check_transport_safety(args, addresses)
        if error:
            print(f"bench serve: {error}", file=sys.stderr)
            return 2
        print(f"wirebench engine codec={args.codec} listening on {addresses.input} / {addresses.output}", flush=True)
        run_engine(engine_config_from_args(args, load_tokenizer(args.tokenizer)), addresses, args.log_level, False)
        return 0
    return asyncio.run(serve(args))
