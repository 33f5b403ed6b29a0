"""``custom``: prompt or messages lines, output lengths, images, and errors naming the file and the line."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from harness.cli import build_parser
from harness.experiment.flags import experiment_from_args
from harness.loadgen.client import CHAT_COMPLETIONS, COMPLETIONS, build_payload
from harness.tokenizers.tokenizer import TextTokenizer, load_tokenizer
from harness.workloads.custom import DEFAULT_OUTPUT_LEN, CustomOptions, sample_custom_requests
from harness.workloads.files import DatasetFileError

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "name a codec"}]


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return load_tokenizer()


def write(tmp_path: Path, *lines: Any) -> Path:
    file = tmp_path / "requests.jsonl"
    file.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return file


def test_prompt_and_messages_lines_and_their_output_lengths(tok: TextTokenizer, tmp_path: Path) -> None:
    file = write(tmp_path, {"prompt": "say hello", "output_tokens": 12}, "", {"messages": MESSAGES})
    requests = sample_custom_requests(tok, 2, dataset_path=file)
    by_kind = {r.messages is not None: r for r in requests}
    prompt, chat = by_kind[False], by_kind[True]

    assert prompt.expected_output_len == 12 and chat.expected_output_len == DEFAULT_OUTPUT_LEN
    formatted = tok.apply_chat_template([{"role": "user", "content": "say hello"}])
    assert (prompt.completion_prompt, prompt.prompt_len) == (formatted, len(tok.encode(formatted)))
    assert build_payload(prompt, "m", COMPLETIONS)["prompt"] == formatted
    assert build_payload(chat, "m", CHAT_COMPLETIONS)["messages"] == MESSAGES
    assert chat.prompt_len == len(tok.encode(tok.apply_chat_template(MESSAGES)))

    fixed = sample_custom_requests(tok, 3, output_len=5, skip_chat_template=True, dataset_path=file)
    assert [r.expected_output_len for r in fixed] == [5, 5, 5]  # 3 from 2 lines: drawn again
    raw = next(r for r in fixed if r.messages is None)
    assert (raw.prompt_len, raw.completion_prompt) == (len(tok.encode("say hello")), None)


def test_images_from_paths_and_data_urls(tok: TextTokenizer, tmp_path: Path) -> None:
    (tmp_path / "cat.png").write_bytes(b"\x89PNG fake")
    file = write(tmp_path, {"prompt": "describe", "images": ["cat.png", "data:image/jpeg;base64,AAAA"]})
    [request] = sample_custom_requests(tok, 1, dataset_path=file)
    assert request.image_data_urls == (
        "data:image/png;base64," + base64.b64encode(b"\x89PNG fake").decode(),
        "data:image/jpeg;base64,AAAA",
    )
    parts = build_payload(request, "m", CHAT_COMPLETIONS)["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url", "image_url"]


def test_the_shipped_sample_and_the_flags(tok: TextTokenizer) -> None:
    a = sample_custom_requests(tok, 40, seed=1)
    assert len(a) == 40 and a == sample_custom_requests(tok, 40, seed=1)
    assert {r.messages is None for r in a} == {True, False}
    argv = ["run", "--dataset-name", "custom", "--custom-output-len", "8", "--custom-skip-chat-template"]
    parser, _ = build_parser(argv)
    exp = experiment_from_args(parser.parse_args(argv))
    assert exp.workload.options == CustomOptions(custom_output_len=8, custom_skip_chat_template=True)
    assert exp.record()["custom_output_len"] == 8 and exp.record()["dataset_name"] == "custom"


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"prompt": "a"}', '{"prompt": "b",}'], "requests.jsonl, line 2: bad JSON"),
        (['{"prompt": "a"}', '{"text": "b"}'], "line 2: needs a 'prompt' or a 'messages' field"),
        (['{"prompt": "a", "messages": []}'], "line 1: needs a 'prompt' or a 'messages'"),
        (['{"prompt": 3}'], "line 1: field 'prompt' must be str"),
        (['{"prompt": "a", "output_tokens": 0}'], "line 1: field 'output_tokens' must be from 1 to 1048576 tokens"),
        (
            ['{"prompt": "ok"}', '{"prompt": "\\ud800x"}'],
            "line 2: invalid Unicode: a \\\\u escape makes a lone surrogate",
        ),
        (['{"prompt": "ok"}', '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}"], "line 2: JSON nested too deeply"),
        (['{"prompt": "a", "images": ["missing.png"]}'], r"line 1, images\[0\]: image 'missing.png' cannot be read"),
        (['{"messages": [{"role": "robot", "content": "x"}]}'], r"line 1: messages\[0\].role"),
        (["[1, 2]"], "line 1: expected a JSON object"),
        ([], "no requests"),
    ],
)
def test_a_bad_line_is_named(tok: TextTokenizer, tmp_path: Path, lines: list[str], message: str) -> None:
    file = write(tmp_path, *lines)
    with pytest.raises(DatasetFileError, match=message):
        sample_custom_requests(tok, 1, dataset_path=file)
