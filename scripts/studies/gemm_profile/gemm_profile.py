#!/usr/bin/env python
"""Time Llama-3.1-8B's per-step GPU work on this machine's GPU: a check of the ``llama8b-h100`` model.

    python scripts/studies/gemm_profile/gemm_profile.py [--json PATH] [--quick]

``harness/engine/step_time.py`` models a step as fixed + dense(rows) + kv_read x cached tokens, its
dense curve taken from Vidur's H100 profile of Llama-2-7B. This measures the same parts with torch
on whatever GPU runs it (bf16; on CPU only as a smoke test, with --quick):

- dense(rows): one layer's four weight matmuls (QKV 4096->6144, output 4096->4096, gate+up
  4096->28672, down 14336->4096) at each row count, x 32 layers; plus the LM head (4096->128256)
  on one row per sequence is reported apart;
- kv_read: decode attention (one query row per sequence, GQA 32/8 heads, head dim 128) over
  sequences x context cached tokens with SDPA, per cached token, x 32 layers.

Each figure is the median of CUDA-event timings of 20 calls after 5 untimed ones.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

LAYERS, DIM, FFN, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 32, 4096, 14336, 32, 8, 128, 128256
ROWS = (1, 64, 128, 256, 384, 512, 768, 1024, 2048, 4096)
DECODE = ((64, 600), (128, 600), (190, 600), (256, 600), (190, 1200))


def median_ms(fn: Callable[[], object], device: torch.device, iters: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--quick", action="store_true", help="tiny shapes and few calls: a smoke test on CPU")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    scale = 16 if args.quick else 1  # --quick: every width / 16
    iters = 3 if args.quick else 20
    dim, ffn, vocab = DIM // scale, FFN // scale, VOCAB // scale
    kv_dim = KV_HEADS * HEAD_DIM // scale
    w = {
        "qkv": torch.randn(dim + 2 * kv_dim, dim, device=device, dtype=dtype),
        "o": torch.randn(dim, dim, device=device, dtype=dtype),
        "gate_up": torch.randn(2 * ffn, dim, device=device, dtype=dtype),
        "down": torch.randn(dim, ffn, device=device, dtype=dtype),
    }
    head = torch.randn(vocab, dim, device=device, dtype=dtype)
    rows_list = ROWS[:4] if args.quick else ROWS
    dense: dict[int, float] = {}
    for rows in rows_list:
        x = torch.randn(rows, dim, device=device, dtype=dtype)
        h = torch.randn(rows, ffn, device=device, dtype=dtype)

        def layer(x: torch.Tensor = x, h: torch.Tensor = h) -> None:
            F.linear(x, w["qkv"])
            F.linear(x, w["o"])
            F.linear(x, w["gate_up"])
            F.linear(h, w["down"])

        dense[rows] = median_ms(layer, device, iters) * LAYERS
        print(f"dense  rows {rows:5d}: {dense[rows]:8.2f} ms (32 layers)", flush=True)
    lm_head: dict[int, float] = {}
    for rows in (1, 190, 256):
        x = torch.randn(rows, dim, device=device, dtype=dtype)

        def project(x: torch.Tensor = x) -> None:
            F.linear(x, head)

        lm_head[rows] = median_ms(project, device, iters)
        print(f"lm head rows {rows:4d}: {lm_head[rows]:8.3f} ms", flush=True)
    kv: dict[str, float] = {}
    heads, kv_heads, hd = HEADS // (4 if args.quick else 1), KV_HEADS // (4 if args.quick else 1), HEAD_DIM
    for seqs, ctx in DECODE[:1] if args.quick else DECODE:
        q = torch.randn(seqs, heads, 1, hd, device=device, dtype=dtype)
        k = torch.randn(seqs, kv_heads, ctx, hd, device=device, dtype=dtype)
        v = torch.randn_like(k)

        def attend(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v) -> None:
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        ms = median_ms(attend, device, iters) * LAYERS
        kv[f"{seqs}x{ctx}"] = ms
        print(f"decode attention {seqs}x{ctx}: {ms:7.2f} ms (32 layers), {ms / (seqs * ctx) * 1e6:.1f} ns/token")
    doc = {
        "kind": "gemm-profile",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "quick": args.quick,
        "dense_ms_by_rows": dense,
        "lm_head_ms_by_rows": lm_head,
        "decode_attention_ms": kv,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
