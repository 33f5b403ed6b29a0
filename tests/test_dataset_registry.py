"""A dataset added from outside the project's modules, in this one file: its flags reach bench run's
parser, build_workload samples it, its settings are recorded in the run's flags and compared."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from harness.analysis.like_for_like import arm_differences, compared_settings
from harness.analysis.runs import RunEntry
from harness.analysis.verdicts import Arm
from harness.cli import build_parser
from harness.experiment.flags import experiment_from_args
from harness.settings.declare import setting
from harness.tokenizers.tokenizer import TextTokenizer, load_tokenizer
from harness.workloads.base import Sampling
from harness.workloads.datasets import build_workload
from harness.workloads.registry import dataset_names, register_dataset, unregister_dataset
from harness.workloads.sample import SampleRequest
from harness.workloads.sonnet import SonnetOptions

WORDS = ("wire", "codec", "frame", "engine", "token", "batch", "queue", "socket")


@dataclass(frozen=True)
class EchoOptions:
    echo_words: int = setting(6, flag="--echo-words", help="words per prompt (default: %(default)s)", comparable=True)
    echo_output_len: int = setting(4, flag="--echo-output-len", help="max_tokens per request", comparable=True)


class EchoDataset:
    name = "echo"
    options: type[Any] = EchoOptions
    takes_images = False

    def sample(self, tokenizer: TextTokenizer, options: EchoOptions, sampling: Sampling) -> list[SampleRequest]:
        rng = random.Random(sampling.seed)
        prompts = [" ".join(rng.choices(WORDS, k=options.echo_words)) for _ in range(sampling.num_requests)]
        return [SampleRequest(p, len(tokenizer.encode(p)), options.echo_output_len) for p in prompts]


@pytest.fixture
def echo() -> Iterator[EchoDataset]:
    dataset = register_dataset(EchoDataset())
    try:
        yield dataset
    finally:
        unregister_dataset(dataset.name)
    assert "echo" not in dataset_names()


def run_args(*argv: str) -> Any:
    parser, _ = build_parser(["run", *argv])
    return parser.parse_args(["run", *argv])


def test_a_registered_dataset_is_flagged_sampled_recorded_and_compared(echo: EchoDataset) -> None:
    args = run_args("--dataset-name", "echo", "--echo-words", "3", "--num-prompts", "5", "--seed", "4")
    exp = experiment_from_args(args)
    assert exp.workload.dataset is echo and exp.workload.options == EchoOptions(echo_words=3)

    requests = build_workload(exp.workload, load_tokenizer())
    assert len(requests) == 5 and all(len(r.prompt.split()) == 3 for r in requests)
    assert requests == build_workload(exp.workload, load_tokenizer())  # the same seed, the same requests

    recorded = exp.record()
    assert (recorded["echo_words"], recorded["echo_output_len"], recorded["dataset_name"]) == (3, 4, "echo")
    assert {"echo_words", "echo_output_len"} <= set(compared_settings())

    def arm(label: str, flags: dict[str, Any]) -> Arm:
        return Arm(label, [RunEntry(label, 0, "ok", "", None, {"metadata": {"flags": flags}})])

    other = experiment_from_args(run_args("--dataset-name", "echo", "--num-prompts", "5", "--seed", "4")).record()
    assert arm_differences([arm("a", recorded), arm("b", other)]) == ["b: echo_words: a 3, b 6"]


def test_a_dataset_without_images_refuses_them_and_a_taken_flag_is_refused(echo: EchoDataset) -> None:
    args = run_args("--dataset-name", "echo", "--images-per-request", "1")
    with pytest.raises(ValueError, match="--images-per-request needs --dataset-name sonnet"):
        build_workload(experiment_from_args(args).workload, load_tokenizer())

    class Clash(EchoDataset):
        name = "clash"
        options = SonnetOptions

    with pytest.raises(ValueError, match="--sonnet-input-len"):
        register_dataset(Clash())
    with pytest.raises(ValueError, match="already registered"):
        register_dataset(EchoDataset())
