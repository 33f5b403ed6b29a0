"""What workload to replay, as one frozen value: the dataset flags read once, then passed around.

The common settings (which dataset, how many prompts, images, the seed) are declared here; each
dataset's own (``--sonnet-input-len``, ``--random-range-ratio``, ...) are its ``options``, declared in
its module (harness.settings.declare). A sweep point is ``dataclasses.replace`` of the spec (or
``with_options``), not a copied namespace.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import Any

from harness.settings import declare
from harness.settings.declare import setting
from harness.workloads.base import Dataset, Sampling, non_negative_int, positive_int, unit_interval
from harness.workloads.images import ImageSpec
from harness.workloads.registry import dataset_names, get_dataset

# benchmark_serving's default, and the size of the seed measurement (1,000 sonnet prompts); with the
# tiny CPU model a run of them takes well under a minute.
DEFAULT_NUM_PROMPTS = 1000


@dataclass(frozen=True)
class WorkloadSpec:
    dataset_name: str = setting(
        "sonnet",
        flag="--dataset-name",
        choices=dataset_names,
        help="workload to replay (default: %(default)s)",
        comparable=True,
    )
    dataset_path: str | None = setting(
        None,
        flag="--dataset-path",
        help="the dataset's file: sonnet: one poem line per line (default: datasets/sonnets.txt); sharegpt, "
        "custom, trace: a ShareGPT JSON, a JSONL of requests, a Mooncake trace (default: the generated sample "
        "in datasets/samples/)",
        comparable=True,
    )
    num_prompts: int = setting(
        DEFAULT_NUM_PROMPTS,
        flag="--num-prompts",
        type=positive_int,
        help="number of requests (default: %(default)s; vLLM bench serve sends 1000)",
        comparable=True,
    )
    images_per_request: int = setting(
        0,
        flag="--images-per-request",
        type=non_negative_int,
        help="synthetic images attached to each sonnet prompt (default: %(default)s)",
        comparable=True,
    )
    image_width: int = setting(
        512,
        flag="--image-width",
        type=positive_int,
        help="synthetic image width in pixels (default: %(default)s)",
        comparable=True,
    )
    image_height: int = setting(
        512,
        flag="--image-height",
        type=positive_int,
        help="synthetic image height in pixels (default: %(default)s)",
        comparable=True,
    )
    image_format: str = setting(
        "png",
        flag="--image-format",
        choices=("png", "jpeg"),
        help="encoding of the synthetic images (default: %(default)s)",
        comparable=True,
    )
    image_reuse: float = setting(
        0.0,
        flag="--image-reuse",
        type=unit_interval,
        metavar="P",
        help="probability that an image repeats, byte for byte, one of an earlier request (of its size, "
        "not yet in its request), else it is new; about a share P of the images repeat; with sonnet and "
        "no --images-per-request, one image per request (default: %(default)s)",
        comparable=True,
    )
    seed: int = setting(
        0,
        flag="--seed",
        help="seed for line sampling, random prompts and images (default: %(default)s)",
        comparable=True,
    )
    tokenizer: str | None = None  # a tokenizer.json (the server's --tokenizer); None: the embedded one
    # The dataset's own settings: an instance of its ``options`` dataclass; None: its defaults.
    options: Any = None

    def __post_init__(self) -> None:
        kind = self.dataset.options
        if self.options is None:
            object.__setattr__(self, "options", kind())
        elif type(self.options) is not kind:  # exactly: random-mm's options are a subclass of random's
            raise ValueError(f"dataset {self.dataset_name!r} takes {kind.__name__}, not {type(self.options).__name__}")
        if self.image_reuse and not self.has_images and self.dataset.takes_images:
            # --image-reuse alone asks for images to repeat: a dataset that attaches them gets one each.
            object.__setattr__(self, "images_per_request", 1)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WorkloadSpec:
        """The dataset flags (and --tokenizer) of a parsed command line; absent ones keep their defaults."""
        name = getattr(args, "dataset_name", None) or cls.dataset_name
        options = declare.from_args(get_dataset(name).options, args)
        return declare.from_args(cls, args, tokenizer=getattr(args, "tokenizer", None), options=options)

    @property
    def dataset(self) -> Dataset:
        return get_dataset(self.dataset_name)

    @property
    def has_images(self) -> bool:
        """Whether requests carry images: by --images-per-request, or drawn by the dataset (random-mm)."""
        return self.images_per_request > 0 or bool(getattr(self.options, "has_images", False))

    @property
    def sampling(self) -> Sampling:
        images = None
        if self.images_per_request:
            size = (self.image_width, self.image_height)
            images = ImageSpec(self.images_per_request, *size, self.image_format, self.image_reuse)
        return Sampling(self.num_prompts, self.seed, self.dataset_path, images, self.image_format, self.image_reuse)

    def with_options(self, **changes: Any) -> WorkloadSpec:
        """This workload with some of its dataset's own settings changed; ValueError for one it lacks."""
        known = {f.name for f in declare.declared(type(self.options))}
        foreign = sorted(set(changes) - known)
        if foreign:
            raise ValueError(f"dataset {self.dataset_name!r} has no setting {', '.join(foreign)}")
        return replace(self, options=replace(self.options, **changes))

    def record(self) -> dict[str, Any]:
        """The workload as flat flags by destination, as run files record them."""
        return {**declare.flag_values(self), "tokenizer": self.tokenizer, **declare.flag_values(self.options)}
