"""What a dataset is: the ``Dataset`` protocol, the ``Sampling`` every dataset is given, and the checks
the datasets' flags share. One module per dataset (``sonnet``, ``random_dataset``); the registry
(``harness.workloads.registry``) lists them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Protocol

from harness.tokenizers.tokenizer import TextTokenizer
from harness.workloads.images import ImageSpec
from harness.workloads.sample import SampleRequest


@dataclass(frozen=True)
class Sampling:
    """What every dataset samples with, from the workload's common flags."""

    num_requests: int  # --num-prompts
    seed: int = 0  # --seed: the same seed gives the same requests, byte for byte
    dataset_path: str | None = None  # --dataset-path, for a dataset that reads a file
    images: ImageSpec | None = None  # only given to a dataset that takes images
    # How a dataset that draws its own images (random-mm) encodes them and how often it repeats one.
    image_format: str = "png"  # --image-format
    image_reuse: float = 0.0  # --image-reuse


class Dataset(Protocol):
    """One workload to replay.

    ``options`` is a frozen dataclass of the dataset's own settings, each declared with
    ``harness.settings.declare.setting``: its flags (named after the dataset, e.g. ``--sonnet-input-len``),
    defaults and help, the keys a run file records, and which make two runs incomparable. An options
    class may inherit another dataset's (random-mm's inherits random's) to share its flags. A dataset
    that draws images of its own, not by ``--images-per-request``, gives its options a ``has_images``
    property (true when its requests carry images).
    """

    name: str  # its --dataset-name
    options: type[Any]
    takes_images: bool  # whether --images-per-request applies to it

    def sample(self, tokenizer: TextTokenizer, options: Any, sampling: Sampling) -> list[SampleRequest]:
        """``sampling.num_requests`` requests, counted with the server's ``tokenizer``; ValueError on bad
        settings. The same arguments must give the same requests."""
        ...


def check_num_requests(num_requests: int) -> None:
    if num_requests < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {num_requests}")


def check_counts(num_requests: int, output_len: int | None, output_flag: str) -> None:
    """ValueError naming the flag of a count below 1; no ``output_len`` (None) keeps each request's own."""
    check_num_requests(num_requests)
    if output_len is not None and output_len < 1:
        raise ValueError(f"{output_flag} must be >= 1, got {output_len}")


# The most tokens one prompt or one output may have, from a file or a flag: past any context window served
# today, and what keeps a bad line (input_length 10^8) from growing the client by gigabytes.
MAX_TOKENS = 1 << 20


def token_count(text: str) -> int:
    """argparse type of a length in tokens: 1 to MAX_TOKENS."""
    value = positive_int(text)
    if value > MAX_TOKENS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_TOKENS} tokens, got {text}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def unit_interval(text: str) -> float:
    """argparse type of a share or probability: a number in [0, 1]."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value
