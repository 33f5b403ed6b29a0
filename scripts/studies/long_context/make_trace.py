"""A long-context trace made here, in the Mooncake JSONL shape ``--dataset-name trace`` reads: prompt
lengths drawn from a log-normal with the published traces' shape (median ~8k tokens, p90 ~30k, the tail
cut at 120k so a prompt and its output fit a 131,072-token context), a few shared system prompts, sends
about ``--rate`` a second. Seeded: the same file every time. README.md beside this script has the study."""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path
from typing import Any

BLOCK_TOKENS = 512  # one hash id per 512 prompt tokens, as Mooncake's traces count them
MEDIAN_TOKENS = 8_000
P90_TOKENS = 30_000
MIN_TOKENS = 600
MAX_TOKENS = 120_000


def prompt_length(rng: random.Random) -> int:
    sigma = math.log(P90_TOKENS / MEDIAN_TOKENS) / 1.2816  # the normal's 90th percentile, in sigmas
    return int(min(MAX_TOKENS, max(MIN_TOKENS, rng.lognormvariate(math.log(MEDIAN_TOKENS), sigma))))


def trace(n: int, rate: float, output_tokens: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    next_block = 0

    def blocks(k: int) -> list[int]:
        nonlocal next_block
        next_block += k
        return list(range(next_block - k, next_block))

    prefixes = [blocks(1) for _ in range(3)]  # shared system prompts: one block each
    lines: list[dict[str, Any]] = []
    t_ms = 0.0
    for i in range(n):
        if i:
            t_ms += rng.expovariate(rate) * 1000
        length = prompt_length(rng)
        shared = rng.choice(prefixes)
        own = blocks(math.ceil(length / BLOCK_TOKENS) - len(shared))
        lines.append(
            {"timestamp": int(t_ms), "input_length": length, "output_length": output_tokens, "hash_ids": shared + own}
        )
    # Every bucket of the study met at least once: the longest line is the tail's end.
    lines[n // 2]["input_length"] = MAX_TOKENS
    lines[n // 2]["hash_ids"] = lines[n // 2]["hash_ids"][:1] + blocks(math.ceil(MAX_TOKENS / BLOCK_TOKENS) - 1)
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--rate", type=float, default=1.0, help="requests a second, on average")
    p.add_argument("--output-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    lines = trace(args.requests, args.rate, args.output_tokens, args.seed)
    args.out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    lengths = sorted(int(line["input_length"]) for line in lines)
    print(
        f"wrote {len(lines)} lines to {args.out}: prompt tokens median {lengths[len(lengths) // 2]:,}, "
        f"max {lengths[-1]:,}"
    )


if __name__ == "__main__":
    main()
