"""``random``: prompts of random token ids decoded to text, as vLLM benchmark_serving's random dataset.

Lengths are drawn uniformly from ``[len*(1-r), len*(1+r)]`` (inclusive, integers). Re-tokenizing
decoded text can merge or split tokens, so the text is nudged toward the target a few times and
``prompt_len`` records the actual length of the raw prompt (no chat template), which may differ
from the drawn length by a token or two. Takes no images.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np

from harness.settings.declare import setting
from harness.tokenizers.tokenizer import TextTokenizer
from harness.workloads.base import Sampling, check_counts, token_count
from harness.workloads.progress import bar
from harness.workloads.sample import SampleRequest


def unit_ratio(text: str) -> float:
    """argparse type of --random-range-ratio: a number in [0, 1)."""
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


@dataclass(frozen=True)
class RandomOptions:
    random_input_len: int = setting(
        1024,
        flag="--random-input-len",
        type=token_count,
        help="mean prompt tokens (default: %(default)s)",
        comparable=True,
    )
    random_output_len: int = setting(
        128,
        flag="--random-output-len",
        type=token_count,
        help="mean max_tokens (default: %(default)s)",
        comparable=True,
    )
    random_range_ratio: float = setting(
        0.0,
        flag="--random-range-ratio",
        type=unit_ratio,
        help="lengths uniform in [len*(1-r), len*(1+r)] (default: %(default)s)",
        comparable=True,
    )


def _text_token_ids(tokenizer: TextTokenizer) -> np.ndarray:
    """Ids that decode on their own to non-empty, whole-character text (no specials)."""
    ids = [i for i in range(tokenizer.vocab_size) if i not in tokenizer.special_token_ids]
    texts = tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=True)
    good = [i for i, t in zip(ids, texts) if t and "\ufffd" not in t]
    if not good:
        raise ValueError(f"tokenizer {tokenizer.name} has no plain-text tokens to sample from")
    return np.asarray(good, dtype=np.int64)


def _uniform_lengths(rng: np.random.Generator, length: int, ratio: float, n: int) -> np.ndarray:
    low = max(1, math.floor(length * (1 - ratio)))
    high = max(low, math.ceil(length * (1 + ratio)))
    return rng.integers(low, high + 1, size=n)


def _random_text(tokenizer: TextTokenizer, rng: np.random.Generator, pool: np.ndarray, target: int) -> tuple[str, int]:
    """Text of about ``target`` tokens from random ids; returns (text, actual length)."""
    ids = rng.choice(pool, size=target).tolist()
    text = tokenizer.decode(ids)
    for _ in range(4):  # nudge toward the target; usually 0-2 rounds
        ids = tokenizer.encode(text)
        if len(ids) == target:
            break
        if len(ids) > target:
            ids = ids[:target]
            # Do not cut inside a multi-byte character.
            while ids and tokenizer.decode(ids).endswith("\ufffd"):
                ids.pop()
        else:
            ids += rng.choice(pool, size=target - len(ids)).tolist()
        text = tokenizer.decode(ids)
    return text, len(tokenizer.encode(text))


def sample_random_requests(
    tokenizer: TextTokenizer,
    num_requests: int,
    input_len: int = RandomOptions.random_input_len,
    output_len: int = RandomOptions.random_output_len,
    range_ratio: float = RandomOptions.random_range_ratio,
    seed: int = 0,
) -> list[SampleRequest]:
    check_counts(num_requests, output_len, "--random-output-len")
    if input_len < 1:
        raise ValueError(f"--random-input-len must be >= 1, got {input_len}")
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    rng = np.random.default_rng(seed)
    input_lens = _uniform_lengths(rng, input_len, range_ratio, num_requests)
    output_lens = _uniform_lengths(rng, output_len, range_ratio, num_requests)
    pool = _text_token_ids(tokenizer)
    requests = []
    with bar(num_requests, "drawing random prompts", "prompt") as shown:
        for n_in, n_out in zip(input_lens.tolist(), output_lens.tolist()):
            text, actual = _random_text(tokenizer, rng, pool, n_in)
            requests.append(SampleRequest(prompt=text, prompt_len=actual, expected_output_len=n_out))
            shown.update(1)
    return requests


class RandomDataset:
    name = "random"
    options = RandomOptions
    takes_images = False

    def sample(self, tokenizer: TextTokenizer, options: RandomOptions, sampling: Sampling) -> list[SampleRequest]:
        return sample_random_requests(
            tokenizer,
            num_requests=sampling.num_requests,
            input_len=options.random_input_len,
            output_len=options.random_output_len,
            range_ratio=options.random_range_ratio,
            seed=sampling.seed,
        )


RANDOM = RandomDataset()
