"""``sonnet``: prompts of poem lines, with vLLM benchmark_serving's semantics.

The base prompt "Pick as many lines as you can from these poem lines:\\n"; its length
``base_offset`` is measured through the chat template; ``avg_line_len`` is the mean token count of
one poem line (newline included); ``num_input_lines = round((input_len - base_offset) / avg_line_len)``
and ``num_prefix_lines = round((prefix_len - base_offset) / avg_line_len)``. Every prompt starts
with the base prompt and the file's first ``num_prefix_lines`` lines (a shared prefix), then lines
drawn with ``random.choices`` (with replacement) seeded by ``--seed``. ``prompt_len`` is the server
tokenizer's count of the chat-formatted prompt. One difference from vLLM: lines are counted without
special tokens (vLLM's per-line count includes a BOS for Llama tokenizers, which makes its prompts
come out shorter than asked). A ``prefix_len`` at or below ``base_offset`` means no shared lines.

Images (``--images-per-request N``): N deterministic synthetic images per request, encoded as data
URLs before any timing; ``prompt_len`` then counts one image marker per image, as the chat template
renders them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.settings.declare import setting
from harness.tokenizers.tokenizer import TextTokenizer
from harness.workloads.base import Sampling, check_counts, non_negative_int, token_count
from harness.workloads.chat import chat_prompt_len, chat_requests
from harness.workloads.images import ImageSpec, make_image_urls
from harness.workloads.sample import SampleRequest

EMBEDDED_SONNETS = Path(__file__).resolve().parents[2] / "datasets" / "sonnets.txt"
SONNET_BASE_PROMPT = "Pick as many lines as you can from these poem lines:\n"


@dataclass(frozen=True)
class SonnetOptions:
    sonnet_input_len: int = setting(
        550,
        flag="--sonnet-input-len",
        type=token_count,
        help="target prompt tokens, chat template included (default: %(default)s)",
        comparable=True,
    )
    sonnet_output_len: int = setting(
        150,
        flag="--sonnet-output-len",
        type=token_count,
        help="max_tokens per request (default: %(default)s)",
        comparable=True,
    )
    sonnet_prefix_len: int = setting(
        200,
        flag="--sonnet-prefix-len",
        type=non_negative_int,
        help="tokens shared by every prompt (default: %(default)s)",
        comparable=True,
    )


@dataclass(frozen=True)
class SonnetPlan:
    """How a sonnet prompt is put together for one tokenizer and set of lengths."""

    base_offset: int
    avg_line_len: float
    num_input_lines: int
    num_prefix_lines: int


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
    input_len: int = SonnetOptions.sonnet_input_len,
    prefix_len: int = SonnetOptions.sonnet_prefix_len,
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
    input_len: int = SonnetOptions.sonnet_input_len,
    output_len: int = SonnetOptions.sonnet_output_len,
    prefix_len: int = SonnetOptions.sonnet_prefix_len,
    dataset_path: str | Path | None = None,
    seed: int = 0,
    images: ImageSpec | None = None,
) -> list[SampleRequest]:
    check_counts(num_requests, output_len, "--sonnet-output-len")
    lines = read_poem_lines(dataset_path)
    plan = plan_sonnet(tokenizer, lines, input_len, prefix_len)
    prefix = "".join(lines[: plan.num_prefix_lines])
    rng = random.Random(seed)
    prompts = [
        SONNET_BASE_PROMPT + prefix + "".join(rng.choices(lines, k=plan.num_input_lines - plan.num_prefix_lines))
        for _ in range(num_requests)
    ]
    urls = make_image_urls(images, num_requests, seed)
    return chat_requests(tokenizer, prompts, urls, [output_len] * num_requests)


class SonnetDataset:
    name = "sonnet"
    options = SonnetOptions
    takes_images = True

    def sample(self, tokenizer: TextTokenizer, options: SonnetOptions, sampling: Sampling) -> list[SampleRequest]:
        return sample_sonnet_requests(
            tokenizer,
            num_requests=sampling.num_requests,
            input_len=options.sonnet_input_len,
            output_len=options.sonnet_output_len,
            prefix_len=options.sonnet_prefix_len,
            dataset_path=sampling.dataset_path,
            seed=sampling.seed,
            images=sampling.images,
        )


SONNET = SonnetDataset()
