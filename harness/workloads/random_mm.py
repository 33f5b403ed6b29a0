"""``random-mm``: random prompts with synthetic images, as vLLM's ``bench serve --dataset-name random-mm``.

The text is the ``random`` dataset's, from its flags (``--random-input-len``, ``--random-output-len``,
``--random-range-ratio``) and the same seed: the same prompts. Each request then carries a number of
images drawn uniformly from the integers ``[floor(n*(1-r)), ceil(n*(1+r))]``, n being
``--random-mm-base-items-per-request`` and r ``--random-mm-num-mm-items-range-ratio`` (r=0: always n;
r=1: from 0 to 2n); the top is cut to ``--random-mm-limit-mm-per-prompt``. Each image's size is
drawn from ``--random-mm-bucket-config``, a dict of (height, width, frames) to probability, renormalised
after dropping zeros. As vLLM's, the keys are (height, width, frames), the limit may be a dict by
modality, and a (h, w, frames) key with frames > 1 is a video: here only images are sent, so a video
bucket must have probability 0 and only the limit's "image" counts.

Images are synthetic (``harness.workloads.images``), encoded as ``--image-format`` data URLs before
the clock starts; ``--image-reuse`` repeats earlier ones. Two differences from vLLM: its images are
uniform pixel noise (ours are gradients, blobs and noise, sized more like photos once encoded), and
``prompt_len`` counts the prompt as the server sees it, through the chat template with one marker per
image (vLLM's counts the text alone).
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.settings.declare import flag_type, setting
from harness.tokenizers.tokenizer import TextTokenizer
from harness.workloads.base import Sampling, non_negative_int, unit_interval
from harness.workloads.chat import chat_requests
from harness.workloads.images import Size, check_format, check_reuse, draw_image_urls
from harness.workloads.random_dataset import RandomOptions, sample_random_requests
from harness.workloads.sample import SampleRequest

Bucket = tuple[int, int, int]  # (height, width, frames), vLLM's order
BUCKET_FLAG = "--random-mm-bucket-config"
LIMIT_FLAG = "--random-mm-limit-mm-per-prompt"
RATIO_FLAG = "--random-mm-num-mm-items-range-ratio"
BASE_FLAG = "--random-mm-base-items-per-request"
DEFAULT_IMAGE_LIMIT = 255  # vLLM's default limit of images
MODALITIES = ("image", "video", "audio")  # keys a limit may have; only images are drawn here
# The item counts' and sizes' own stream, apart from the text's (which is seeded as random's).
_ITEMS_STREAM = 0x1B5


class BucketConfig(tuple[tuple[Bucket, float], ...]):
    """Image sizes and their probabilities (summing to 1), in the order given; it prints as the dict
    the flag takes, and a run file records it as a list of [[height, width, frames], probability]."""

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{key}: {p!r}" for key, p in self) + "}"

    __str__ = __repr__

    def sizes(self) -> list[Size]:
        """The buckets as (width, height), the order images are made in."""
        return [(w, h) for (h, w, _), _ in self]

    def probabilities(self) -> list[float]:
        return [p for _, p in self]


def _literal(text: str, what: str) -> Any:
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise ValueError(f"{text!r} is not {what}") from None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _bucket_key(key: Any) -> Bucket:
    if isinstance(key, str):  # JSON has no tuple keys: "(256, 256, 1)"
        key = _literal(key, "a (height, width, frames) key")
    if not (isinstance(key, tuple | list) and len(key) == 3 and all(_is_int(x) for x in key)):
        raise ValueError(f"key {key!r} is not (height, width, frames), three integers")
    height, width, frames = key
    if height < 1 or width < 1 or frames < 1:
        raise ValueError(f"key {tuple(key)}: height, width and frames must be >= 1")
    return height, width, frames


def bucket_config(raw: Any) -> BucketConfig:
    """The buckets of a dict of (height, width, frames) to probability: zeros dropped, the rest
    renormalised; ValueError for a bad key or value, a video bucket (frames > 1) with a chance, or
    no chance at all."""
    if not isinstance(raw, dict | tuple | list):
        raise ValueError(f"{raw!r} is not a dict of (height, width, frames) to probability")
    items = raw.items() if isinstance(raw, dict) else raw
    weights: dict[Bucket, float] = {}
    for entry in items:
        if not (isinstance(entry, tuple | list) and len(entry) == 2):
            raise ValueError(f"{entry!r} is not a (height, width, frames), probability pair")
        raw_key, p = entry
        key = _bucket_key(raw_key)
        if key in weights:
            raise ValueError(f"bucket {key} is given twice")
        if not isinstance(p, int | float) or isinstance(p, bool) or not math.isfinite(p) or p < 0:
            raise ValueError(f"bucket {key}: probability must be a number >= 0, got {p!r}")
        if p > 0 and key[2] != 1:
            raise ValueError(f"bucket {key}: frames {key[2]} is a video; only images (frames 1) are sent here")
        weights[key] = float(p)
    total = sum(weights.values())
    if total <= 0:
        raise ValueError("no bucket has a probability above 0")
    return BucketConfig((key, p / total) for key, p in weights.items() if p > 0)


def parse_bucket_config(text: str) -> BucketConfig:
    """--random-mm-bucket-config: a Python dict literal, e.g. ``{(256, 256, 1): 0.5, (720, 1280, 1): 0.5}``
    (the keys may also be strings, "(256, 256, 1)", as JSON needs)."""
    return bucket_config(_literal(text, "a dict such as {(256, 256, 1): 0.5, (720, 1280, 1): 0.5}"))


def parse_limit(text: str) -> int:
    """--random-mm-limit-mm-per-prompt: images per request at most, as a number or as vLLM's dict by
    modality (``{"image": 3, "video": 0}``: only its "image" counts, no other modality is sent)."""
    value = _literal(text, 'a number or a dict such as {"image": 3, "video": 0}')
    if isinstance(value, dict):
        unknown = sorted(str(k) for k in value if k not in MODALITIES)
        if unknown:
            raise ValueError(f"unknown modality {', '.join(unknown)}; the keys are {', '.join(MODALITIES)}")
        if "image" not in value:
            raise ValueError('no "image" limit: only images are sent here')
        value = value["image"]
    if not _is_int(value) or value < 0:
        raise ValueError(f"the image limit must be an integer >= 0, got {value!r}")
    return int(value)


DEFAULT_BUCKETS = BucketConfig((((256, 256, 1), 0.5), ((720, 1280, 1), 0.5)))  # vLLM's images


@dataclass(frozen=True)
class RandomMMOptions(RandomOptions):
    random_mm_base_items_per_request: int = setting(
        1,
        flag=BASE_FLAG,
        type=non_negative_int,
        metavar="N",
        help="mean images per request, n (default: %(default)s)",
        comparable=True,
    )
    random_mm_num_mm_items_range_ratio: float = setting(
        0.0,
        flag=RATIO_FLAG,
        type=unit_interval,
        metavar="R",
        help="images per request uniform in the integers [floor(n*(1-r)), ceil(n*(1+r))], r in [0, 1] "
        "(default: %(default)s)",
        comparable=True,
    )
    random_mm_limit_mm_per_prompt: int = setting(
        DEFAULT_IMAGE_LIMIT,
        flag=LIMIT_FLAG,
        type=flag_type(parse_limit),
        metavar="LIMIT",
        help='images per request at most: a number, or vLLM\'s dict {"image": 3, "video": 0} (images '
        "only here) (default: %(default)s)",
        comparable=True,
    )
    random_mm_bucket_config: BucketConfig = setting(
        DEFAULT_BUCKETS,
        flag=BUCKET_FLAG,
        type=flag_type(parse_bucket_config),
        metavar="BUCKETS",
        help="image sizes and their chances, a dict of (height, width, frames) to probability; frames "
        "must be 1 (images only here) (default: %(default)s)",
        comparable=True,
    )

    @property
    def item_range(self) -> tuple[int, int]:
        """Images per request, least and most; ValueError naming the flags when the range is empty."""
        n, r = self.random_mm_base_items_per_request, self.random_mm_num_mm_items_range_ratio
        if n < 0:
            raise ValueError(f"{BASE_FLAG} must be >= 0, got {n}")
        if not 0.0 <= r <= 1.0:
            raise ValueError(f"{RATIO_FLAG} must be in [0, 1], got {r}")
        limit = self.random_mm_limit_mm_per_prompt
        if limit < 0:
            raise ValueError(f"{LIMIT_FLAG} must be >= 0, got {limit}")
        low, high = max(0, math.floor(n * (1 - r))), min(limit, math.ceil(n * (1 + r)))
        if low > high:
            raise ValueError(
                f"{BASE_FLAG} {n} with {RATIO_FLAG} {r} asks for at least {low} images, above {LIMIT_FLAG} {limit}"
            )
        return low, high

    @property
    def has_images(self) -> bool:
        return self.item_range[1] > 0


def draw_image_sizes(options: RandomMMOptions, num_requests: int, seed: int) -> list[list[Size]]:
    """Per request, the (width, height) of each of its images."""
    low, high = options.item_range
    try:
        buckets = bucket_config(options.random_mm_bucket_config)
    except ValueError as exc:
        raise ValueError(f"{BUCKET_FLAG}: {exc}") from None
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_ITEMS_STREAM,)))
    counts = rng.integers(low, high + 1, size=num_requests).tolist()
    picks = rng.choice(len(buckets), size=sum(counts), p=buckets.probabilities()).tolist()
    sizes = buckets.sizes()
    out: list[list[Size]] = []
    start = 0
    for count in counts:
        out.append([sizes[i] for i in picks[start : start + count]])
        start += count
    return out


def sample_random_mm_requests(
    tokenizer: TextTokenizer,
    num_requests: int,
    options: RandomMMOptions | None = None,
    seed: int = 0,
    image_format: str = "png",
    image_reuse: float = 0.0,
) -> list[SampleRequest]:
    options = options or RandomMMOptions()
    # The settings are checked before the text is drawn.
    check_format(image_format)
    check_reuse(image_reuse)
    sizes = draw_image_sizes(options, num_requests, seed)
    text = sample_random_requests(
        tokenizer,
        num_requests,
        input_len=options.random_input_len,
        output_len=options.random_output_len,
        range_ratio=options.random_range_ratio,
        seed=seed,
    )
    urls = draw_image_urls(sizes, image_format, seed, image_reuse)
    return chat_requests(tokenizer, [r.prompt for r in text], urls, [r.expected_output_len for r in text])


class RandomMMDataset:
    name = "random-mm"
    options = RandomMMOptions
    takes_images = False  # its images come from its own flags, not --images-per-request

    def sample(self, tokenizer: TextTokenizer, options: RandomMMOptions, sampling: Sampling) -> list[SampleRequest]:
        return sample_random_mm_requests(
            tokenizer,
            sampling.num_requests,
            options,
            seed=sampling.seed,
            image_format=sampling.image_format,
            image_reuse=sampling.image_reuse,
        )


RANDOM_MM = RandomMMDataset()
