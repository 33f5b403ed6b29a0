"""What workload to replay, as one frozen value: the dataset flags read once, then passed around.

Field names are the dataset flags' destinations, so ``build_workload`` reads a
spec the way it read the flags, and a sweep point is ``dataclasses.replace``
of the spec, not a copied namespace.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class WorkloadSpec:
    dataset_name: str = "sonnet"
    dataset_path: str | None = None
    num_prompts: int = 1000
    sonnet_input_len: int = 550
    sonnet_output_len: int = 150
    sonnet_prefix_len: int = 200
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    images_per_request: int = 0
    image_width: int = 512
    image_height: int = 512
    image_format: str = "png"
    seed: int = 0
    tokenizer: str | None = None  # a tokenizer.json; None: the embedded one

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WorkloadSpec:
        """The dataset flags (and --tokenizer) of a parsed command line; absent ones keep their defaults."""
        given = {f.name: getattr(args, f.name) for f in fields(cls) if getattr(args, f.name, None) is not None}
        return cls(**given)

    @property
    def has_images(self) -> bool:
        return self.images_per_request > 0
