"""``sharegpt``: conversations from a ShareGPT-format JSON file, as vLLM's ``bench serve --dataset-name sharegpt``.

The file is a JSON array of ``{"conversations": [{"from": "human"|"gpt", "value": str}, ...]}``. A
conversation's first human turn is the prompt and the turn after it (the reply) sets the output
length: its token count, or ``--sharegpt-output-len`` for every request. Conversations with fewer
than two turns are skipped. As vLLM does, a pair is kept only if the prompt and the reply each have
at least 4 tokens (the reply's length is not checked when ``--sharegpt-output-len`` is given), the
prompt at most 1024 and prompt + output at most 2048. Conversations are shuffled with ``--seed`` and
taken in that order until ``--num-prompts`` pass; when too few pass, the kept ones are drawn again
(with replacement), as vLLM oversamples. ``prompt_len`` is the raw prompt's token count, as vLLM
counts it (no chat template). Takes no synthetic images.

``--dataset-path`` defaults to ``datasets/samples/sharegpt-sample.json``: generated conversations
(scripts/make_dataset_samples.py), not ShareGPT's; point it at the real file to replay that.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.settings.declare import setting
from harness.tokenizers.tokenizer import TextTokenizer
from harness.workloads.base import Sampling, check_counts, token_count
from harness.workloads.files import DatasetFileError, dataset_file, field, read_json_array
from harness.workloads.sample import SampleRequest

SAMPLE = "sharegpt-sample.json"
# vLLM's is_valid_sequence bounds.
MIN_LEN = 4
MAX_PROMPT_LEN = 1024
MAX_TOTAL_LEN = 2048
BATCH = 256  # conversations tokenized at a time: a large file is not tokenized past what is needed


@dataclass(frozen=True)
class ShareGPTOptions:
    sharegpt_output_len: int | None = setting(
        None,
        flag="--sharegpt-output-len",
        type=token_count,
        help="max_tokens of every request instead of the reply's length (default: the reply's length)",
        comparable=True,
    )


@dataclass(frozen=True)
class Pair:
    """One conversation's prompt and reply, and the line of the file it starts on."""

    line: int
    prompt: str
    reply: str


def read_pairs(file: Path) -> list[Pair]:
    """The (first human turn, the turn after it) of every conversation with at least two turns."""
    pairs = []
    for line, entry in read_json_array(file):
        where = f"{file}, line {line}"
        if not isinstance(entry, dict):
            raise DatasetFileError(f"{where}: expected an object with 'conversations', got {type(entry).__name__}")
        turns = field(entry, "conversations", list, where)
        if len(turns) < 2:
            continue
        pair = _first_exchange(turns, where)
        if pair is not None:
            pairs.append(Pair(line, *pair))
    return pairs


def _first_exchange(turns: list[Any], where: str) -> tuple[str, str] | None:
    texts = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise DatasetFileError(f"{where}: conversations[{i}] must be an object, got {type(turn).__name__}")
        texts.append((field(turn, "from", str, f"{where}, conversations[{i}]"), turn))
    for i, (speaker, turn) in enumerate(texts[:-1]):
        if speaker == "human":
            prompt = field(turn, "value", str, f"{where}, conversations[{i}]")
            reply = field(texts[i + 1][1], "value", str, f"{where}, conversations[{i + 1}]")
            return prompt, reply
    return None


def _valid(prompt_len: int, output_len: int, fixed_output: bool) -> bool:
    if prompt_len < MIN_LEN or (not fixed_output and output_len < MIN_LEN):
        return False
    return prompt_len <= MAX_PROMPT_LEN and prompt_len + output_len <= MAX_TOTAL_LEN


def _kept(tokenizer: TextTokenizer, pairs: list[Pair], output_len: int | None) -> Iterator[SampleRequest]:
    for start in range(0, len(pairs), BATCH):
        batch = pairs[start : start + BATCH]
        prompt_lens = [len(ids) for ids in tokenizer.encode_batch([p.prompt for p in batch])]
        reply_lens = (
            [len(ids) for ids in tokenizer.encode_batch([p.reply for p in batch])] if output_len is None else []
        )
        for i, (pair, n_in) in enumerate(zip(batch, prompt_lens)):
            n_out = output_len if output_len is not None else reply_lens[i]
            if _valid(n_in, n_out, output_len is not None):
                yield SampleRequest(prompt=pair.prompt, prompt_len=n_in, expected_output_len=n_out)


def sample_sharegpt_requests(
    tokenizer: TextTokenizer,
    num_requests: int,
    output_len: int | None = None,
    dataset_path: str | Path | None = None,
    seed: int = 0,
) -> list[SampleRequest]:
    check_counts(num_requests, output_len, "--sharegpt-output-len")
    file = dataset_file(dataset_path, SAMPLE)
    pairs = read_pairs(file)
    rng = random.Random(seed)
    rng.shuffle(pairs)
    requests = []
    for request in _kept(tokenizer, pairs, output_len):
        requests.append(request)
        if len(requests) == num_requests:
            return requests
    if not requests:
        raise DatasetFileError(
            f"{file}: no conversation has a first human turn and a reply within vLLM's bounds "
            f"(prompt {MIN_LEN}..{MAX_PROMPT_LEN} tokens, reply >= {MIN_LEN}, both <= {MAX_TOTAL_LEN})"
        )
    return requests + rng.choices(requests, k=num_requests - len(requests))


class ShareGPTDataset:
    name = "sharegpt"
    options = ShareGPTOptions
    takes_images = False

    def sample(self, tokenizer: TextTokenizer, options: ShareGPTOptions, sampling: Sampling) -> list[SampleRequest]:
        return sample_sharegpt_requests(
            tokenizer,
            num_requests=sampling.num_requests,
            output_len=options.sharegpt_output_len,
            dataset_path=sampling.dataset_path,
            seed=sampling.seed,
        )


SHAREGPT = ShareGPTDataset()
