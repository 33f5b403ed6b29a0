"""Workloads: lists of ``SampleRequest`` built before the clock starts.

Two datasets, as in vLLM's benchmark_serving:

``sonnet``
    Prompts of poem lines. Same semantics as vLLM's sonnet sampler: the base
    prompt "Pick as many lines as you can from these poem lines:\\n"; its length
    ``base_offset`` is measured through the chat template; ``avg_line_len`` is
    the mean token count of one poem line (newline included);
    ``num_input_lines = round((input_len - base_offset) / avg_line_len)`` and
    ``num_prefix_lines = round((prefix_len - base_offset) / avg_line_len)``.
    Every prompt starts with the base prompt and the file's first
    ``num_prefix_lines`` lines (a shared prefix), then lines drawn with
    ``random.choices`` (with replacement) seeded by ``--seed``. ``prompt_len``
    is the server tokenizer's count of the chat-formatted prompt. One
    difference from vLLM: lines are counted without special tokens (vLLM's
    per-line count includes a BOS for Llama tokenizers, which makes its
    prompts come out shorter than asked). A ``prefix_len`` at or below
    ``base_offset`` means no shared lines.

``random``
    Prompts of random token ids decoded to text, lengths drawn uniformly from
    ``[len*(1-r), len*(1+r)]`` (inclusive, integers). Re-tokenizing decoded
    text can merge or split tokens, so the text is nudged toward the target a
    few times and ``prompt_len`` records the actual length of the raw prompt
    (no chat template), which may differ from the drawn length by a token or
    two.

Images (``--images-per-request N``, sonnet only): N deterministic synthetic
images per request, encoded as data URLs here, before any timing. The sonnet
``prompt_len`` then counts one image marker per image, as the chat template
renders them.
"""

from __future__ import annotations

import argparse
import math
import os
import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.wire.tokenizer import TextTokenizer
from harness.workloads.images import FORMATS, synthetic_image, to_data_url
from harness.workloads.sample import SampleRequest
from harness.workloads.spec import WorkloadSpec

EMBEDDED_SONNETS = Path(__file__).resolve().parents[2] / "datasets" / "sonnets.txt"
SONNET_BASE_PROMPT = "Pick as many lines as you can from these poem lines:\n"
DATASET_NAMES = ("sonnet", "random")

# benchmark_serving's default, and the size of the seed measurement (1,000
# sonnet prompts); with the tiny CPU model a run of them takes well under a minute.
DEFAULT_NUM_PROMPTS = 1000
SONNET_INPUT_LEN, SONNET_OUTPUT_LEN, SONNET_PREFIX_LEN = 550, 150, 200
RANDOM_INPUT_LEN, RANDOM_OUTPUT_LEN, RANDOM_RANGE_RATIO = 1024, 128, 0.0
IMAGE_WIDTH = IMAGE_HEIGHT = 512
IMAGE_FORMAT = "png"
DEFAULT_SEED = 0


@dataclass(frozen=True)
class ImageSpec:
    """Synthetic images attached to every request."""

    per_request: int
    width: int = IMAGE_WIDTH
    height: int = IMAGE_HEIGHT
    fmt: str = IMAGE_FORMAT


@dataclass(frozen=True)
class SonnetPlan:
    """How a sonnet prompt is put together for one tokenizer and set of lengths."""

    base_offset: int
    avg_line_len: float
    num_input_lines: int
    num_prefix_lines: int


def user_message(prompt: str, image_data_urls: Sequence[str] = ()) -> dict[str, Any]:
    """The OpenAI chat message for a request: text first, then one part per image."""
    if not image_data_urls:
        return {"role": "user", "content": prompt}
    parts: list[dict[str, Any]] = [{"type": "text", "text": prompt}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in image_data_urls]
    return {"role": "user", "content": parts}


def chat_prompt_len(tokenizer: TextTokenizer, prompt: str, image_data_urls: Sequence[str] = ()) -> int:
    """Tokens of ``prompt`` as the server sees it through the chat template."""
    return len(tokenizer.encode(tokenizer.apply_chat_template([user_message(prompt, image_data_urls)])))


# -- sonnet -------------------------------------------------------------------


def read_poem_lines(path: str | Path | None = None) -> list[str]:
    """Non-blank lines of a sonnet.txt-like file, each ending in '\\n' (None = embedded)."""
    file = EMBEDDED_SONNETS if path is None else Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"sonnet dataset not found: {file}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"sonnet dataset {file} is not UTF-8 text: {exc}") from exc
    lines = [line if line.endswith("\n") else line + "\n" for line in text.splitlines(keepends=True)]
    lines = [line for line in lines if line.strip()]
    if not lines:
        raise ValueError(f"sonnet dataset {file} has no lines")
    return lines


def plan_sonnet(
    tokenizer: TextTokenizer,
    poem_lines: Sequence[str],
    input_len: int = SONNET_INPUT_LEN,
    prefix_len: int = SONNET_PREFIX_LEN,
) -> SonnetPlan:
    """Work out line counts the way vLLM's sonnet sampler does; ValueError if impossible."""
    if prefix_len < 0:
        raise ValueError(f"--sonnet-prefix-len must be >= 0, got {prefix_len}")
    if prefix_len >= input_len:
        raise ValueError(f"--sonnet-prefix-len ({prefix_len}) must be smaller than --sonnet-input-len ({input_len})")
    base_offset = chat_prompt_len(tokenizer, SONNET_BASE_PROMPT)
    if input_len <= base_offset:
        raise ValueError(
            f"--sonnet-input-len ({input_len}) must be greater than the base prompt's {base_offset} tokens"
        )
    lens = [len(ids) for ids in tokenizer.encode_batch(list(poem_lines))]
    avg_line_len = sum(lens) / len(lens)
    num_input_lines = round((input_len - base_offset) / avg_line_len)
    num_prefix_lines = max(0, round((prefix_len - base_offset) / avg_line_len))
    if num_input_lines < 1:
        raise ValueError(
            f"--sonnet-input-len ({input_len}) leaves room for no poem line "
            f"(base prompt {base_offset} tokens, a line about {avg_line_len:.1f})"
        )
    if num_prefix_lines > len(poem_lines):
        raise ValueError(
            f"--sonnet-prefix-len ({prefix_len}) needs {num_prefix_lines} shared lines, "
            f"but the dataset has only {len(poem_lines)}"
        )
    return SonnetPlan(base_offset, avg_line_len, num_input_lines, min(num_prefix_lines, num_input_lines))


def sample_sonnet_requests(
    tokenizer: TextTokenizer,
    num_requests: int,
    input_len: int = SONNET_INPUT_LEN,
    output_len: int = SONNET_OUTPUT_LEN,
    prefix_len: int = SONNET_PREFIX_LEN,
    dataset_path: str | Path | None = None,
    seed: int = DEFAULT_SEED,
    images: ImageSpec | None = None,
) -> list[SampleRequest]:
    _check_counts(num_requests, output_len, "--sonnet-output-len")
    lines = read_poem_lines(dataset_path)
    plan = plan_sonnet(tokenizer, lines, input_len, prefix_len)
    prefix = "".join(lines[: plan.num_prefix_lines])
    rng = random.Random(seed)
    prompts = [
        SONNET_BASE_PROMPT + prefix + "".join(rng.choices(lines, k=plan.num_input_lines - plan.num_prefix_lines))
        for _ in range(num_requests)
    ]
    urls = make_image_urls(images, num_requests, seed)
    formatted = [tokenizer.apply_chat_template([user_message(p, u)]) for p, u in zip(prompts, urls)]
    lens = [len(ids) for ids in tokenizer.encode_batch(formatted)]
    return [
        SampleRequest(
            prompt=p,
            prompt_len=n,
            expected_output_len=output_len,
            image_data_urls=u,
            completion_prompt=None if u else f,
        )
        for p, n, u, f in zip(prompts, lens, urls, formatted)
    ]


# -- random -------------------------------------------------------------------


def _text_token_ids(tokenizer: TextTokenizer) -> np.ndarray:
    """Ids that decode on their own to non-empty, whole-character text (no specials)."""
    ids = [i for i in range(tokenizer.vocab_size) if i not in tokenizer.special_token_ids]
    texts = tokenizer.hf.decode_batch([[i] for i in ids], skip_special_tokens=True)
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
    input_len: int = RANDOM_INPUT_LEN,
    output_len: int = RANDOM_OUTPUT_LEN,
    range_ratio: float = RANDOM_RANGE_RATIO,
    seed: int = DEFAULT_SEED,
) -> list[SampleRequest]:
    _check_counts(num_requests, output_len, "--random-output-len")
    if input_len < 1:
        raise ValueError(f"--random-input-len must be >= 1, got {input_len}")
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    rng = np.random.default_rng(seed)
    input_lens = _uniform_lengths(rng, input_len, range_ratio, num_requests)
    output_lens = _uniform_lengths(rng, output_len, range_ratio, num_requests)
    pool = _text_token_ids(tokenizer)
    requests = []
    for n_in, n_out in zip(input_lens.tolist(), output_lens.tolist()):
        text, actual = _random_text(tokenizer, rng, pool, n_in)
        requests.append(SampleRequest(prompt=text, prompt_len=actual, expected_output_len=n_out))
    return requests


# -- images -------------------------------------------------------------------


def make_image_urls(spec: ImageSpec | None, num_requests: int, seed: int) -> list[tuple[str, ...]]:
    """Per request, ``spec.per_request`` data URLs of distinct deterministic images."""
    if spec is None or spec.per_request == 0:
        return [() for _ in range(num_requests)]
    if spec.per_request < 0:
        raise ValueError(f"--images-per-request must be >= 0, got {spec.per_request}")
    if spec.width <= 0 or spec.height <= 0:
        raise ValueError(f"--image-width/--image-height must be positive, got {spec.width}x{spec.height}")
    if spec.fmt.lower() not in FORMATS:
        raise ValueError(f"--image-format must be png or jpeg, got {spec.fmt!r}")

    def one(job: tuple[int, int]) -> str:
        # Each image's seed depends on (seed, request, image) only, so the
        # result is the same whatever the thread scheduling.
        image_seed = int(np.random.SeedSequence([seed, *job]).generate_state(1)[0])
        return to_data_url(synthetic_image(spec.width, spec.height, image_seed), spec.fmt)

    jobs = [(i, j) for i in range(num_requests) for j in range(spec.per_request)]
    # numpy and zlib/libjpeg release the GIL, so threads do speed this up.
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        flat = list(pool.map(one, jobs))
    k = spec.per_request
    return [tuple(flat[i * k : (i + 1) * k]) for i in range(num_requests)]


# -- CLI glue -----------------------------------------------------------------


def _check_counts(num_requests: int, output_len: int, output_flag: str) -> None:
    if num_requests < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {num_requests}")
    if output_len < 1:
        raise ValueError(f"{output_flag} must be >= 1, got {output_len}")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _ratio(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def add_dataset_arguments(parser: argparse.ArgumentParser) -> None:
    """Workload flags shared by ``bench load`` and ``bench run`` (includes ``--seed``)."""
    g = parser.add_argument_group("workload")
    g.add_argument(
        "--dataset-name", choices=DATASET_NAMES, default="sonnet", help="workload to replay (default: %(default)s)"
    )
    g.add_argument(
        "--dataset-path",
        default=None,
        help="sonnet.txt-like file, one poem line per line (default: the project's datasets/sonnets.txt)",
    )
    g.add_argument(
        "--num-prompts",
        type=_positive_int,
        default=DEFAULT_NUM_PROMPTS,
        help="number of requests (default: %(default)s; vLLM uses 1000, "
        "fewer here because the reference server is a small model on CPU)",
    )
    g.add_argument(
        "--sonnet-input-len",
        type=_positive_int,
        default=SONNET_INPUT_LEN,
        help="target prompt tokens, chat template included (default: %(default)s)",
    )
    g.add_argument(
        "--sonnet-output-len",
        type=_positive_int,
        default=SONNET_OUTPUT_LEN,
        help="max_tokens per request (default: %(default)s)",
    )
    g.add_argument(
        "--sonnet-prefix-len",
        type=_non_negative_int,
        default=SONNET_PREFIX_LEN,
        help="tokens shared by every prompt (default: %(default)s)",
    )
    g.add_argument(
        "--random-input-len",
        type=_positive_int,
        default=RANDOM_INPUT_LEN,
        help="mean prompt tokens (default: %(default)s)",
    )
    g.add_argument(
        "--random-output-len",
        type=_positive_int,
        default=RANDOM_OUTPUT_LEN,
        help="mean max_tokens (default: %(default)s)",
    )
    g.add_argument(
        "--random-range-ratio",
        type=_ratio,
        default=RANDOM_RANGE_RATIO,
        help="lengths uniform in [len*(1-r), len*(1+r)] (default: %(default)s)",
    )
    g.add_argument(
        "--images-per-request",
        type=_non_negative_int,
        default=0,
        help="synthetic images attached to each sonnet prompt (default: %(default)s)",
    )
    g.add_argument(
        "--image-width",
        type=_positive_int,
        default=IMAGE_WIDTH,
        help="synthetic image width in pixels (default: %(default)s)",
    )
    g.add_argument(
        "--image-height",
        type=_positive_int,
        default=IMAGE_HEIGHT,
        help="synthetic image height in pixels (default: %(default)s)",
    )
    g.add_argument(
        "--image-format",
        choices=("png", "jpeg"),
        default=IMAGE_FORMAT,
        help="encoding of the synthetic images (default: %(default)s)",
    )
    g.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help="seed for line sampling, random prompts and images (default: %(default)s)",
    )


def build_workload(spec: WorkloadSpec, tokenizer: TextTokenizer) -> list[SampleRequest]:
    """The requests ``spec`` describes, counted with ``tokenizer``; ValueError on bad settings."""
    if spec.dataset_name == "sonnet":
        images = None
        if spec.images_per_request:
            images = ImageSpec(spec.images_per_request, spec.image_width, spec.image_height, spec.image_format)
        return sample_sonnet_requests(
            tokenizer,
            num_requests=spec.num_prompts,
            input_len=spec.sonnet_input_len,
            output_len=spec.sonnet_output_len,
            prefix_len=spec.sonnet_prefix_len,
            dataset_path=spec.dataset_path,
            seed=spec.seed,
            images=images,
        )
    if spec.dataset_name == "random":
        if spec.images_per_request:
            raise ValueError("--images-per-request needs --dataset-name sonnet")
        return sample_random_requests(
            tokenizer,
            num_requests=spec.num_prompts,
            input_len=spec.random_input_len,
            output_len=spec.random_output_len,
            range_ratio=spec.random_range_ratio,
            seed=spec.seed,
        )
    raise ValueError(f"unknown --dataset-name {spec.dataset_name!r}; choose from {DATASET_NAMES}")


def load_workload(spec: WorkloadSpec) -> tuple[list[SampleRequest], str]:
    """The workload and the tokenizer's name, built before any clock starts."""
    from harness.wire.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(spec.tokenizer)
    return build_workload(spec, tokenizer), tokenizer.name
