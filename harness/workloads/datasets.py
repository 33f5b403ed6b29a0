"""Workloads: lists of ``SampleRequest`` built before the clock starts, from a ``WorkloadSpec``.

Each dataset is one module and an entry of the registry (``harness.workloads.registry``): ``sonnet``
and ``random`` keep vLLM benchmark_serving's semantics (their modules' docstrings say how), and a
dataset registered by code or entry point is sampled, flagged, recorded and compared the same way.
Images (``--images-per-request``) go only to a dataset that takes them; ``random-mm`` draws its
own; ``--image-reuse`` repeats earlier ones in either.
"""

from __future__ import annotations

import argparse

from harness.settings.declare import add_arguments, declared
from harness.tokenizers.tokenizer import TextTokenizer
from harness.workloads.chat import chat_prompt_len, user_message
from harness.workloads.progress import building
from harness.workloads.registry import datasets
from harness.workloads.sample import SampleRequest
from harness.workloads.sonnet import EMBEDDED_SONNETS
from harness.workloads.spec import WorkloadSpec

__all__ = ["EMBEDDED_SONNETS", "add_dataset_arguments", "build_workload", "chat_prompt_len", "load_workload"]
__all__ += ["user_message"]  # where the client and scripts have imported it from


def add_dataset_arguments(parser: argparse.ArgumentParser) -> None:
    """Workload flags shared by ``bench load`` and ``bench run`` (includes ``--seed``): the common ones,
    then every registered dataset's own."""
    g = parser.add_argument_group("workload")
    add_arguments(g, WorkloadSpec)
    added: set[str] = set()
    for dataset in datasets():  # a flag two datasets share (random-mm's text flags are random's) once
        add_arguments(g, dataset.options, exclude=added)
        added.update(d.dest for d in declared(dataset.options))


def build_workload(spec: WorkloadSpec, tokenizer: TextTokenizer) -> list[SampleRequest]:
    """The requests ``spec`` describes, counted with ``tokenizer``; ValueError on bad settings."""
    dataset = spec.dataset
    if spec.images_per_request and not dataset.takes_images:
        takers = " or ".join(d.name for d in datasets() if d.takes_images)
        raise ValueError(f"--images-per-request needs --dataset-name {takers}")
    if spec.image_reuse and not spec.has_images:
        raise ValueError("--image-reuse needs images: --images-per-request with sonnet, or random-mm")
    return dataset.sample(tokenizer, spec.options, spec.sampling)


def load_workload(spec: WorkloadSpec) -> tuple[list[SampleRequest], str]:
    """The workload and the tokenizer's name, built before any clock starts."""
    from harness.tokenizers.tokenizer import load_tokenizer

    with building(spec.num_prompts, spec.dataset_name):
        tokenizer = load_tokenizer(spec.tokenizer)
        return build_workload(spec, tokenizer), tokenizer.name
