"""``trace``: a timed trace in Mooncake's JSONL format, replayed with its arrivals and shared prefixes.

One request a line: ``timestamp`` (its arrival, in ms), ``input_length`` and ``output_length`` (prompt
and output tokens) and ``hash_ids``: one id per block of ``--trace-block-size`` prompt tokens (512,
the block size of Mooncake's published traces), the last block possibly partial; two requests whose
leading ids are equal share those leading blocks. Each distinct id becomes one block of text, the
same wherever it appears, so requests that share leading ids share the same leading prompt text and
tokens (a shared prefix a server's prefix cache can hit). A block is words that are each one token
of the server's tokenizer, picked with ``--seed`` and the id, so a prompt is ``input_length`` tokens
(tokens past the last id's block come from blocks of the request's own). ``prompt_len`` counts the
raw prompt, as the trace does (no chat template); ``output_length`` is its max_tokens.

Arrivals: request i is sent at ``(timestamp_i - timestamp_0) / 1000 / --trace-speedup`` seconds, in
timestamp order; --request-rate and --burstiness are then ignored (``--trace-arrivals rate`` uses
them instead, keeping the trace's prompts). ``--num-prompts`` takes the first N requests; a shorter
trace is replayed again from its start, after its last request plus one mean interval.

``--dataset-path`` defaults to ``datasets/samples/trace-sample.jsonl``, a generated trace.
"""

from __future__ import annotations

import argparse
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path

from harness.engine.step_plan import blocks_for
from harness.settings.declare import setting
from harness.tokenizers.tokenizer import TextTokenizer
from harness.workloads.base import Sampling, check_num_requests, token_count
from harness.workloads.files import DatasetFileError, count_field, dataset_file, field, read_jsonl
from harness.workloads.sample import SampleRequest

SAMPLE = "trace-sample.jsonl"
MOONCAKE_BLOCK_SIZE = 512
MAX_SPAN_MS = 24 * 3.6e6  # a trace longer than a day is a unit mistake (timestamps are ms), or wants --trace-speedup
POOL_CANDIDATES = 4000  # token ids tried for the word pool; a few hundred pass
WORD = re.compile(r" [a-z]{3,}")


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


@dataclass(frozen=True)
class TraceOptions:
    trace_speedup: float = setting(
        1.0,
        flag="--trace-speedup",
        type=positive_float,
        help="replay the trace's timestamps this many times faster (default: %(default)s)",
        comparable=True,
    )
    trace_block_size: int = setting(
        MOONCAKE_BLOCK_SIZE,
        flag="--trace-block-size",
        type=token_count,
        help="prompt tokens per hash_ids entry (default: %(default)s, Mooncake's)",
        comparable=True,
    )
    trace_arrivals: str = setting(
        "timestamps",
        flag="--trace-arrivals",
        choices=("timestamps", "rate"),
        help="send at the trace's timestamps (--request-rate and --burstiness ignored) or as "
        "--request-rate plans (default: %(default)s)",
        comparable=True,
    )


@dataclass(frozen=True)
class TraceLine:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def read_trace(file: Path) -> list[TraceLine]:
    """Every line of a Mooncake trace, in timestamp order (ties keep the file's order). Timestamps are
    finite, >= 0 and within MAX_SPAN_MS of the earliest; lengths within MAX_TOKENS."""
    lines, where_of = [], []
    for n, record in read_jsonl(file):
        where = f"{file}, line {n}"
        timestamp = field(record, "timestamp", (int, float), where)
        if not (math.isfinite(timestamp) and timestamp >= 0):
            raise DatasetFileError(f"{where}: field 'timestamp' must be a finite number >= 0 (ms), got {timestamp}")
        ids = field(record, "hash_ids", list, where) if "hash_ids" in record else []
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise DatasetFileError(f"{where}: field 'hash_ids' must be a list of integers")
        inputs, outputs = count_field(record, "input_length", where), count_field(record, "output_length", where)
        lines.append(TraceLine(float(timestamp), inputs, outputs, tuple(ids)))
        where_of.append(where)
    if not lines:
        raise DatasetFileError(f"{file}: no requests (one JSON object a line)")
    first = min(line.timestamp_ms for line in lines)
    late = next((i for i, line in enumerate(lines) if line.timestamp_ms - first > MAX_SPAN_MS), None)
    if late is not None:
        hours = (lines[late].timestamp_ms - first) / 3.6e6
        raise DatasetFileError(
            f"{where_of[late]}: timestamp {lines[late].timestamp_ms:g} ms is {hours:,.1f} h after the trace's first; "
            f"a trace may span at most {MAX_SPAN_MS / 3.6e6:g} h (timestamps are in ms)"
        )
    return sorted(lines, key=lambda line: line.timestamp_ms)


def word_pool(tokenizer: TextTokenizer) -> list[str]:
    """Words (" abc") that are each exactly one token, so any run of them is as many tokens as words."""
    candidates = random.Random(0).sample(range(tokenizer.vocab_size), min(POOL_CANDIDATES, tokenizer.vocab_size))
    texts = {tokenizer.decode([i]): i for i in candidates if i not in tokenizer.special_token_ids}
    words = sorted(t for t in texts if WORD.fullmatch(t))
    pool = [w for w, ids in zip(words, tokenizer.encode_batch(words)) if ids == [texts[w]]]
    if len(pool) < 16:
        raise ValueError(f"tokenizer {tokenizer.name} has too few one-token words to build trace prompts")
    return pool


class PromptBuilder:
    """Prompt text from hash ids: one fixed block of words per id, the same wherever the id appears.

    A block's words are drawn from a generator seeded with the id, only as far as some prompt has read
    into it (a prompt may stop inside its last block, and a block may be large): the words held are
    never more than the prompts use. A request's own blocks (past its ids) are drawn and not kept."""

    def __init__(self, pool: list[str], block_size: int, seed: int) -> None:
        self.pool, self.block_size, self.seed = pool, block_size, seed
        self.blocks: dict[str, tuple[random.Random, list[str]]] = {}

    def words(self, key: str, count: int, keep: bool = True) -> list[str]:
        """The first ``count`` words of block ``key``; the same words for the same key, however many are
        asked for (``choices`` draws one number a word, so a longer draw extends a shorter one)."""
        rng, drawn = self.blocks.get(key) or (random.Random(f"{self.seed}:{key}"), [])
        if len(drawn) < count:
            drawn += rng.choices(self.pool, k=count - len(drawn))
        if keep:
            self.blocks[key] = (rng, drawn)
        return drawn[:count]

    def prompt(self, line: TraceLine, index: int) -> str:
        shared = [str(i) for i in line.hash_ids]
        own = range(blocks_for(line.input_length, self.block_size) - len(shared))
        words: list[str] = []
        for k, key in enumerate(shared + [f"request {index} block {b}" for b in own]):
            words += self.words(key, min(self.block_size, line.input_length - len(words)), keep=k < len(shared))
            if len(words) == line.input_length:
                break
        return "".join(words)


def trace_arrivals(lines: list[TraceLine], count: int, speedup: float) -> list[float]:
    """Send offsets in seconds of ``count`` requests: the trace's timestamps, sped up, looped if short."""
    first, last = lines[0].timestamp_ms, lines[-1].timestamp_ms
    period = (last - first) * len(lines) / (len(lines) - 1) if len(lines) > 1 else 0.0
    offsets_ms = [lines[i % len(lines)].timestamp_ms - first + (i // len(lines)) * period for i in range(count)]
    return [ms / 1000.0 / speedup for ms in offsets_ms]


def sample_trace_requests(
    tokenizer: TextTokenizer,
    num_requests: int,
    options: TraceOptions = TraceOptions(),
    dataset_path: str | Path | None = None,
    seed: int = 0,
) -> list[SampleRequest]:
    check_num_requests(num_requests)
    if not options.trace_speedup > 0:
        raise ValueError(f"--trace-speedup must be > 0, got {options.trace_speedup}")
    lines = read_trace(dataset_file(dataset_path, SAMPLE))
    builder = PromptBuilder(word_pool(tokenizer), options.trace_block_size, seed)
    chosen = [lines[i % len(lines)] for i in range(num_requests)]
    prompts = [builder.prompt(line, i % len(lines)) for i, line in enumerate(chosen)]
    lens = [len(ids) for ids in tokenizer.encode_batch(prompts)]
    arrivals: list[float | None] = [None] * num_requests
    if options.trace_arrivals == "timestamps":
        arrivals = list(trace_arrivals(lines, num_requests, options.trace_speedup))
    return [
        SampleRequest(prompt=p, prompt_len=n, expected_output_len=line.output_length, arrival_s=t)
        for p, n, line, t in zip(prompts, lens, chosen, arrivals)
    ]


class TraceDataset:
    name = "trace"
    options = TraceOptions
    takes_images = False

    def sample(self, tokenizer: TextTokenizer, options: TraceOptions, sampling: Sampling) -> list[SampleRequest]:
        return sample_trace_requests(tokenizer, sampling.num_requests, options, sampling.dataset_path, sampling.seed)


TRACE = TraceDataset()
