#!/usr/bin/env python
"""Time one prefill and one batched decode step of a model preset.

    .venv/bin/python scripts/studies/model_bench/model_bench.py --preset tiny --prefill-len 550 --batch 64

Medians over ``--iters`` timed calls after three untimed ones; on CUDA each
call is synchronized so the time covers the kernels, not just their launch.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from harness.engine.device import resolve_device, resolve_dtype, synchronize
from harness.engine.model import build_model, get_model_config


def median_ms(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    for _ in range(3):
        fn()
    synchronize(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e3


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--prefill-len", type=int, default=550)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--kv-len", type=int, default=700)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args(argv)
    device = resolve_device(a.device)
    if device.type == "cpu":
        torch.set_num_threads(a.threads)
    cfg = get_model_config(a.preset, a.vocab)
    model = build_model(cfg, a.batch, a.max_model_len, device, resolve_dtype(a.dtype, device), seed=0)

    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (a.prefill_len,), generator=g).to(device)
    tok = torch.randint(0, cfg.vocab_size, (a.batch,), generator=g).to(device)
    slots = list(range(a.batch))  # host lists, as the engine passes them: no device read-back
    positions = [a.kv_len - 1] * a.batch
    with torch.inference_mode():
        pre = median_ms(lambda: model.prefill(model.embed(prompt), 0, 0), device, a.iters)
        dec = median_ms(lambda: model.decode(model.embed(tok), slots, positions), device, a.iters)
    print(
        f"{a.preset} on {device} ({model.dtype}, {torch.get_num_threads()} threads): "
        f"prefill {a.prefill_len} tokens {pre:.2f} ms; decode {a.batch} seqs at KV {a.kv_len} {dec:.2f} ms"
    )


if __name__ == "__main__":
    main()
