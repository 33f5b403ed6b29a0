"""The flags of what is served (model, engine limits, payload form), and turning them back into
``bench serve`` flags: every arm of an experiment gets the same ones.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from typing import Any

from harness.engine.config import EngineConfig
from harness.engine.step_time import STEP_MODELS
from wirecodecs import UnknownCodecError, check_codec_spec


def codec_spec(name: str) -> str:
    """argparse type of --codec and --output-codec: a codec ``get_codec`` accepts, options included."""
    try:
        return check_codec_spec(name)
    except UnknownCodecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def non_negative_float(text: str) -> float:
    """argparse type of a finite amount that may be 0 (--frontend-cpu-us-per-token)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of what is served (model, engine limits, payload form); `bench run` forwards these."""
    g = p.add_argument_group("served model and engine")
    g.add_argument("--served-model-name", default=None, help="model id in the API (default: wirebench-<preset>)")
    g.add_argument(
        "--verify",
        action="store_true",
        help="each request carries a digest of its token ids and images, checked by the engine after it "
        "crossed: a corrupted or swapped request fails instead of being served",
    )
    g.add_argument(
        "--no-spans",
        action="store_true",
        help="record no request timelines (GET /v1/wirebench/spans, the IPC budget): to measure what they cost",
    )
    g.add_argument(
        "--output-codec",
        type=codec_spec,
        default=None,
        metavar="CODEC",
        help="the codec of the engine's outputs, the same for every arm (default: each arm's --codec): "
        "vLLM PR #10245 moved only requests to pickle, so its preset keeps outputs msgspec",
    )
    g.add_argument(
        "--frontend-cpu-us-per-token",
        type=non_negative_float,
        default=0.0,
        metavar="US",
        help="model a heavier API server: CPU microseconds the frontend's event loop spends on each output "
        "token as a step's outputs arrive, on top of its own work (vLLM 0.6.4's V1 detokenized and built "
        "each chunk in one loop; docs/seed.md). Default 0: none",
    )
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
    g.add_argument(
        "--sim-step-model",
        choices=STEP_MODELS,
        default=defaults.sim_step_model,
        help="sim: how a step's GPU time is modelled: linear (fixed + per token), or llama8b-h100 "
        "(Llama-3.1-8B on one H100 from public measurements, harness/engine/step_time.py)",
    )
    g.add_argument(
        "--sim-step-fixed-ms", type=float, default=None, help="sim: fixed ms per step (default: the model's own)"
    )
    g.add_argument(
        "--sim-step-per-token-ms", type=float, default=None, help="sim: ms per token (default: the model's own)"
    )
    g.add_argument("--engine-threads", type=int, default=defaults.num_threads, help="torch CPU threads in the engine")
    g.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    g.add_argument("--max-num-batched-tokens", type=int, default=defaults.max_num_batched_tokens)
    g.add_argument("--max-model-len", type=int, default=defaults.max_model_len)
    g.add_argument(
        "--kv-cache-tokens",
        type=int,
        default=defaults.kv_cache_tokens,
        help="KV tokens admission may reserve (prompt + max_tokens a request); default max-num-seqs x max-model-len",
    )
    g.add_argument("--compile", action="store_true", help="torch.compile each layer's dense parts (compiles at start)")
    g.add_argument("--image-tokens", type=int, default=defaults.image_tokens, help="embeddings per image")
    g.add_argument(
        "--no-gc-freeze",
        action="store_true",
        help="leave the frontend's and engine's startup heaps to the garbage collector's full collections, "
        "as vLLM did before 2025 (default: frozen once started, as vLLM's now are; scripts/gc_pauses.py)",
    )
    g.add_argument(
        "--output-stats",
        action="store_true",
        help="attach the scheduler's state (running, waiting, KV usage, step tokens) to every output batch, as "
        "vLLM does with stats logging on (its default): outputs as heavy as a real server's, for every codec",
    )


def server_flags(values: Mapping[str, Any], seed: int) -> list[str]:
    """The `bench serve` flags that reproduce ``values`` (parsed flags): ``--seed`` and every
    model/engine flag whose value differs from its default. A flag's name is its destination with
    dashes (``max_num_seqs`` → ``--max-num-seqs``); a True switch is the bare flag."""
    defaults = model_defaults()
    flags = ["--seed", str(seed)]
    for dest, default in defaults.items():
        value = values.get(dest)
        if value is None or value == default:
            continue
        flag = "--" + dest.replace("_", "-")
        flags += [flag] if isinstance(default, bool) else [flag, str(value)]
    return flags


def model_values(flags: Sequence[str], base: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` (parsed flags) with the model/engine flags among ``flags`` read over it; other flags are
    ignored. Raises ValueError when one of them cannot be read."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    add_model_arguments(parser)
    parser.set_defaults(**base)  # every value of base, model flag or not, comes back unless a flag sets it
    try:
        own, _ = parser.parse_known_args(list(flags))
    except (argparse.ArgumentError, SystemExit) as exc:  # SystemExit: errors argparse still exits on
        raise ValueError(f"cannot read {' '.join(flags)!r}: {exc}") from None
    return vars(own)


def model_defaults() -> dict[str, Any]:
    """Every model/engine flag's destination and default, read from a parser of those flags alone."""
    parser = argparse.ArgumentParser(add_help=False)
    add_model_arguments(parser)
    return vars(parser.parse_args([]))
