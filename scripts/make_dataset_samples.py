#!/usr/bin/env python3
"""Write the small generated samples of the file-backed datasets into datasets/samples/.

Everything is made up from the project's own word list (datasets/tokenizer-words.txt) with fixed
seeds, so the samples are nobody's data and rerunning this writes the same bytes:

- sharegpt-sample.json: 50 ShareGPT-format conversations (a few with one turn, which are skipped)
- custom-sample.jsonl: 30 requests, prompts or chat messages, most with "output_tokens"
- trace-sample.jsonl: 100 Mooncake-format requests (timestamp in ms, input_length, output_length,
  hash_ids of 512-token blocks), in a few groups that share leading blocks (a shared system prompt);
  prompt + output stay under 2,048 tokens, the reference server's context

Usage: python scripts/make_dataset_samples.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from harness.engine.step_plan import blocks_for

ROOT = Path(__file__).resolve().parents[1]
WORDS_FILE = ROOT / "datasets" / "tokenizer-words.txt"
OUT = ROOT / "datasets" / "samples"
BLOCK_TOKENS = 512  # Mooncake's block size: one hash id per 512 prompt tokens
MAX_INPUT = 1700  # + at most 300 output tokens: within the reference server's 2,048-token context


def words() -> list[str]:
    return [w for w in WORDS_FILE.read_text(encoding="utf-8").split() if w.isalpha()][:2000]


def sentence(rng: random.Random, vocab: list[str], n: int) -> str:
    text = " ".join(rng.choices(vocab, k=n))
    return text[:1].upper() + text[1:] + rng.choice([".", "?", "!"])


def paragraph(rng: random.Random, vocab: list[str], n_words: int) -> str:
    parts, left = [], n_words
    while left > 0:
        n = min(left, rng.randint(5, 18))
        parts.append(sentence(rng, vocab, n))
        left -= n
    return " ".join(parts)


def sharegpt(rng: random.Random, vocab: list[str], n: int = 50) -> list[dict[str, object]]:
    conversations: list[dict[str, object]] = []
    for i in range(n):
        turns = 1 if i % 12 == 5 else rng.choice([2, 2, 2, 4, 6])
        conversation = [
            {"from": "human" if t % 2 == 0 else "gpt", "value": paragraph(rng, vocab, rng.randint(8, 300))}
            for t in range(turns)
        ]
        conversations.append({"id": f"sample-{i:03d}", "conversations": conversation})
    return conversations


def custom(rng: random.Random, vocab: list[str], n: int = 30) -> list[dict[str, object]]:
    lines: list[dict[str, object]] = []
    for i in range(n):
        line: dict[str, object]
        if i % 3 == 2:
            line = {
                "messages": [
                    {"role": "system", "content": paragraph(rng, vocab, rng.randint(10, 40))},
                    {"role": "user", "content": paragraph(rng, vocab, rng.randint(10, 200))},
                ]
            }
        else:
            line = {"prompt": paragraph(rng, vocab, rng.randint(10, 400))}
        if i % 5 != 4:
            line["output_tokens"] = rng.randint(16, 256)
        lines.append(line)
    return lines


def trace(rng: random.Random, n: int = 100) -> list[dict[str, object]]:
    next_block = 0

    def blocks(k: int) -> list[int]:
        nonlocal next_block
        next_block += k
        return list(range(next_block - k, next_block))

    # A few shared system prompts (1-2 blocks each) that most requests start with.
    prefixes = [blocks(rng.randint(1, 2)) for _ in range(4)]
    lines: list[dict[str, object]] = []
    t_ms = 0
    for _ in range(n):
        if lines:  # the first request at 0 ms, as Mooncake's traces start
            t_ms += int(rng.expovariate(1 / 250))  # about 4 requests a second
        shared = rng.choice([*prefixes, []])
        input_length = len(shared) * BLOCK_TOKENS + rng.randint(1, MAX_INPUT - len(shared) * BLOCK_TOKENS)
        own = blocks(blocks_for(input_length, BLOCK_TOKENS) - len(shared))
        lines.append(
            {
                "timestamp": t_ms,
                "input_length": input_length,
                "output_length": rng.randint(8, 300),
                "hash_ids": shared + own,
            }
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT, help="folder to write into (default: datasets/samples)")
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    vocab = words()
    (out / "sharegpt-sample.json").write_text(json.dumps(sharegpt(random.Random(1), vocab), indent=1) + "\n")
    jsonl = {"custom-sample.jsonl": custom(random.Random(2), vocab), "trace-sample.jsonl": trace(random.Random(3))}
    for name, lines in jsonl.items():
        (out / name).write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(f"wrote {', '.join(['sharegpt-sample.json', *jsonl])} to {out}")


if __name__ == "__main__":
    main()
