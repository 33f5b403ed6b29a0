"""``sharegpt``: the first human turn and its reply, vLLM's length bounds, seeded sampling, errors with the line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.cli import build_parser
from harness.experiment.flags import experiment_from_args
from harness.tokenizers.tokenizer import TextTokenizer, load_tokenizer
from harness.workloads.datasets import build_workload
from harness.workloads.files import SAMPLES_DIR, DatasetFileError
from harness.workloads.sharegpt import ShareGPTOptions, sample_sharegpt_requests


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return load_tokenizer()


def words(n: int) -> str:
    return " ".join(["codec"] * n)


def conversation(*turns: tuple[str, str]) -> dict[str, Any]:
    return {"conversations": [{"from": who, "value": text} for who, text in turns]}


def write(tmp_path: Path, entries: Any) -> Path:
    file = tmp_path / "sg.json"
    file.write_text(json.dumps(entries, indent=1))
    return file


def test_the_first_human_turn_is_the_prompt_and_the_reply_sets_the_output_len(
    tok: TextTokenizer, tmp_path: Path
) -> None:
    file = write(
        tmp_path,
        [
            conversation(("system", "be brief"), ("human", words(10)), ("gpt", words(20)), ("human", words(99))),
            conversation(("human", words(30))),  # one turn: skipped
            conversation(("human", "hi"), ("gpt", words(20))),  # prompt under 4 tokens: filtered
            conversation(("human", words(1100)), ("gpt", words(20))),  # prompt over 1024: filtered
        ],
    )
    [request] = sample_sharegpt_requests(tok, 1, dataset_path=file)
    assert request.prompt == words(10)
    assert request.prompt_len == len(tok.encode(words(10)))
    assert request.expected_output_len == len(tok.encode(words(20)))
    # Too few pass the bounds: the kept one is drawn again, as vLLM oversamples.
    assert [r.prompt for r in sample_sharegpt_requests(tok, 3, dataset_path=file)] == [words(10)] * 3
    fixed = sample_sharegpt_requests(tok, 2, output_len=7, dataset_path=file)
    assert [r.expected_output_len for r in fixed] == [7, 7]


def test_the_shipped_sample_is_the_default_and_the_seed_decides_the_sample(tok: TextTokenizer) -> None:
    a = sample_sharegpt_requests(tok, 20, seed=1)
    assert a == sample_sharegpt_requests(tok, 20, dataset_path=SAMPLES_DIR / "sharegpt-sample.json", seed=1)
    assert a != sample_sharegpt_requests(tok, 20, seed=2)
    assert all(4 <= r.prompt_len <= 1024 and r.prompt_len + r.expected_output_len <= 2048 for r in a)
    assert len({r.prompt for r in a}) == 20  # the sample has enough conversations for 20 different ones


def test_flags_reach_the_dataset_and_are_recorded(tmp_path: Path) -> None:
    file = write(tmp_path, [conversation(("human", words(10)), ("gpt", words(20)))])
    argv = ["run", "--dataset-name", "sharegpt", "--dataset-path", str(file), "--sharegpt-output-len", "9"]
    parser, _ = build_parser(argv)
    exp = experiment_from_args(parser.parse_args(argv))
    assert exp.workload.options == ShareGPTOptions(sharegpt_output_len=9)
    recorded = exp.record()
    assert (recorded["dataset_name"], recorded["dataset_path"], recorded["sharegpt_output_len"]) == (
        "sharegpt",
        str(file),
        9,
    )
    requests = build_workload(replace(exp.workload, num_prompts=2), load_tokenizer())
    assert [r.expected_output_len for r in requests] == [9, 9]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[\n {"conversations": []},\n {"conversations": [}\n]', "sg.json, line 3: bad JSON"),
        ('[\n {"conversations": []},\n {"turns": []}\n]', "sg.json, line 3: missing field 'conversations'"),
        ('[\n\n {"conversations": [{"from": "human"}, {"from": "gpt", "value": "x"}]}]', "line 3, conversations"),
        ('{"conversations": []}', "sg.json, line 1: expected a JSON array"),
        ('[\n {"conversations": []},\n {"conversations": "\\udc00"}\n]', "sg.json, line 3: invalid Unicode"),
        (
            '[\n {"conversations": []},\n' + "[" * 100_000 + "]" * 100_000 + "]",
            "sg.json, line 3: JSON nested too deeply",
        ),
    ],
)
def test_a_bad_file_is_named_with_its_line(tok: TextTokenizer, tmp_path: Path, text: str, message: str) -> None:
    file = tmp_path / "sg.json"
    file.write_text(text)
    with pytest.raises(DatasetFileError, match=message):
        sample_sharegpt_requests(tok, 1, dataset_path=file)


def test_a_missing_file_or_no_usable_conversation_is_refused(tok: TextTokenizer, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.json"):
        sample_sharegpt_requests(tok, 1, dataset_path=tmp_path / "nope.json")
    file = write(tmp_path, [conversation(("human", "hi"), ("gpt", "yo"))])
    with pytest.raises(DatasetFileError, match="no conversation"):
        sample_sharegpt_requests(tok, 1, dataset_path=file)
