"""Multi-turn conversations: the dataset's draw, the chat history each turn sends, the driver against the
fake server (answers fed back, think time, a failed turn ending its conversation), the per-turn table and
the flags refused with conversations."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import math
import random
from pathlib import Path

import pytest

from harness.loadgen import runner
from harness.loadgen.conversations import NOT_SENT, History, by_turn, first_turns, refusal, turn_lines
from harness.loadgen.report import format_report
from harness.loadgen.runner import BenchmarkError, LoadSettings, check_endpoint, run_benchmark
from harness.tokenizers.tokenizer import TextTokenizer, load_tokenizer
from harness.workloads.datasets import build_workload
from harness.workloads.multi_turn import ConversationTurn, draw_turns
from harness.workloads.sample import SampleRequest
from harness.workloads.spec import WorkloadSpec

from fake_openai_server import FakeConfig, FakeOpenAIServer

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return load_tokenizer(None)


@pytest.fixture(autouse=True)
def _no_scrape_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_wait() -> None:
        return None

    monkeypatch.setattr(runner, "_settle", no_wait)


def _spec(**options: object) -> WorkloadSpec:
    return WorkloadSpec(dataset_name="multi-turn", num_prompts=4).with_options(**options)


# --- the dataset -------------------------------------------------------------------------------------


def test_turns_are_drawn_around_the_mean_at_least_one_and_the_same_for_a_seed() -> None:
    fixed = draw_turns(random.Random(0), 50, 4.0, 0.0)
    assert fixed == [4] * 50
    drawn = draw_turns(random.Random(1), 2000, 5.0, 2.0)
    assert min(drawn) >= 1 and abs(sum(drawn) / len(drawn) - 5.0) < 0.2 and len(set(drawn)) > 5
    assert drawn == draw_turns(random.Random(1), 2000, 5.0, 2.0)
    with pytest.raises(ValueError, match="--conversation-turn-mean must be from 1"):
        draw_turns(random.Random(0), 1, 0.5, 0.0)


def test_the_workload_is_each_conversations_turns_in_order_with_new_messages(tok: TextTokenizer) -> None:
    spec = _spec(conversation_turn_mean=3.0, conversation_turn_stddev=1.0, conversation_think_time=0.5)
    workload = [t for t in build_workload(spec, tok) if isinstance(t, ConversationTurn)]
    assert len(workload) == len(build_workload(spec, tok))
    places = [(t.conversation, t.turn) for t in workload]
    counts = [sum(1 for c, _ in places if c == n) for n in range(4)]
    assert places == [(c, k) for c in range(4) for k in range(counts[c])]
    assert len({t.prompt for t in workload}) == len(workload)  # every turn brings a new message
    assert all(t.think_s == 0.5 and t.expected_output_len == 64 for t in workload)
    first = workload[0]  # its prompt_len counts the new message through the chat template
    assert first.prompt_len == len(tok.encode(tok.apply_chat_template([{"role": "user", "content": first.prompt}])))
    assert abs(first.prompt_len - 128) < 30  # --conversation-input-len, give or take a poem line
    assert [t.prompt for t in build_workload(spec, tok)] == [t.prompt for t in workload]  # the seed's draw


def test_with_a_sharegpt_file_the_messages_are_its_human_turns(tok: TextTokenizer, tmp_path: Path) -> None:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    humans = [" ".join(words[i:] + words[:i]) for i in range(3)]
    turns = [{"from": "human", "value": h} for h in humans[:2]] + [{"from": "gpt", "value": "an answer here"}]
    data = [{"conversations": turns}, {"conversations": [{"from": "human", "value": humans[2]}]}]
    (path := tmp_path / "chats.json").write_text(json.dumps(data))
    spec = WorkloadSpec(dataset_name="multi-turn", num_prompts=2, dataset_path=str(path))
    workload = build_workload(spec.with_options(conversation_turn_mean=3.0), tok)
    assert len(workload) == 6 and {t.prompt for t in workload} == set(humans)  # from the start again
    assert "an answer here" not in {t.prompt for t in workload}


# --- the history a turn sends --------------------------------------------------------------------------


def test_the_history_is_every_earlier_message_and_answer_then_the_new_message() -> None:
    history = History()
    assert history.prompt("hello") == ({"role": "user", "content": "hello"},)
    history.answered("hello", " t0 t1")
    history.answered("more", "")  # an empty answer is still the assistant's turn
    assert history.prompt("last") == (
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": " t0 t1"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "last"},
    )


# --- the driver against the fake server ----------------------------------------------------------------


def _turns(messages: list[list[str]], tokens: int = 3, think_s: float = 0.0) -> list[SampleRequest]:
    return [
        ConversationTurn(m, 5, tokens, conversation=c, turn=k, think_s=think_s)
        for c, conversation in enumerate(messages)
        for k, m in enumerate(conversation)
    ]


def _load(**changes: object) -> LoadSettings:
    return LoadSettings(endpoint=CHAT, request_rate=math.inf, **changes)  # type: ignore[arg-type]


def test_each_turn_sends_the_chat_with_the_servers_answers_after_its_think_time() -> None:
    workload = _turns([["a0", "a1", "a2"], ["b0", "b1"]], think_s=0.1)
    with FakeOpenAIServer(FakeConfig(ttft_s=0.01, token_gap_s=0.001)) as server:
        result = asyncio.run(run_benchmark(server.base_url, "fake-model", workload, _load()))
        bodies = {b["messages"][-1]["content"]: b["messages"] for b in server.state.bodies}
    assert result.failed == 0 and [(r.conversation, r.turn) for r in result.records] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 1),
    ]
    answer = " t0 t1 t2"  # what the fake server streams for 3 tokens
    assert [r.generated_text for r in result.records] == [answer] * 5
    user, assistant = ({"role": r, "content": c} for r, c in (("user", "a0"), ("assistant", answer)))
    assert bodies["a1"] == [user, assistant, {"role": "user", "content": "a1"}]
    assert bodies["a2"][:-1] == [user, assistant, {"role": "user", "content": "a1"}, assistant]
    records = result.records
    for earlier, later in ((records[0], records[1]), (records[1], records[2]), (records[3], records[4])):
        end = earlier.actual_send + earlier.latency
        assert later.planned_send == pytest.approx(end + 0.1)  # its predecessor's end + the think time
        assert later.actual_send >= later.planned_send
        assert later.request_bytes > earlier.request_bytes
    assert [r.prompt_len for r in records] == [r.prompt_tokens for r in records]  # the server's own count
    assert [t.turn for t in result.extra["turns"]] == [0, 1, 2]
    assert [t.requests for t in result.extra["turns"]] == [2, 2, 1]
    assert first_turns(records) == [records[0], records[3]]


def test_a_failed_turn_ends_its_conversation_and_the_rest_are_recorded_not_sent() -> None:
    workload = _turns([["a0", "a1 FAIL500", "a2", "a3"], ["b0", "b1"]])
    with FakeOpenAIServer(FakeConfig(ttft_s=0.01, token_gap_s=0.001)) as server:
        result = asyncio.run(run_benchmark(server.base_url, "fake-model", workload, _load()))
        sent = [b["messages"][-1]["content"] for b in server.state.bodies]
    assert "a2" not in sent and "a3" not in sent
    assert len(result.records) == len(workload) == result.metrics.completed + result.failed
    errors = {(r.conversation, r.turn): r.error for r in result.records}
    assert errors[(0, 1)].startswith("HTTP 500")
    assert errors[(0, 2)] == errors[(0, 3)] == NOT_SENT
    assert errors[(1, 0)] == errors[(1, 1)] == "" and result.failed == 3
    rows = {t.turn: t for t in by_turn(result.records)}
    assert (rows[1].requests, rows[1].failed, rows[2].failed, rows[3].failed) == (2, 1, 1, 1)


def test_the_report_has_one_row_per_turn() -> None:
    workload = _turns([["a0", "a1"], ["b0", "b1"]])
    with FakeOpenAIServer(FakeConfig(ttft_s=0.01, token_gap_s=0.001)) as server:
        result = asyncio.run(run_benchmark(server.base_url, "fake-model", workload, _load()))
    text = format_report(result).splitlines()
    title = next(i for i, line in enumerate(text) if "Conversations, by turn" in line)
    header, *rows = text[title + 1 : title + 4]
    assert "TTFT mean ms" in header and "prompt tok" in header and "req bytes" in header
    assert [row.split()[:3] for row in rows] == [["0", "2", "0"], ["1", "2", "0"]]
    assert all(len(line) <= 80 for line in turn_lines(by_turn(result.records)))


# --- what is refused -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, words",
    [
        ({"block_size": 20}, "--block-size"),
        ({"until_resolved": 5.0}, "--until-resolved"),
        ({"workers": 2}, "--workers/--ray"),
        ({"ray": ""}, "--workers/--ray"),
    ],
)
def test_flags_that_assume_independent_requests_are_refused(flags: dict, words: str) -> None:
    why = refusal({"dataset_name": "multi-turn", **flags})
    assert why is not None and words in why and "wait for each other" in why
    assert refusal({"dataset_name": "sonnet", **flags}) is None
    assert refusal({"dataset_name": "multi-turn", "block_size": 0}) is None


def test_a_conversation_needs_the_chat_endpoint() -> None:
    with pytest.raises(BenchmarkError, match="use --endpoint /v1/chat/completions"):
        check_endpoint(_turns([["a0", "a1"]]), "/v1/completions")
    check_endpoint(_turns([["a0", "a1"]]), CHAT)


def _bench(argv: list[str]) -> argparse.Namespace:
    from harness.cli import build_parser

    parser, _ = build_parser(argv)
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    "command, extra, words",
    [
        ("run", ["--codec", "pickle,msgspec", "--block-size", "10"], "--block-size"),
        ("run", ["--codec", "pickle,msgspec", "--until-resolved", "5"], "--until-resolved"),
        ("load", ["--base-url", "http://127.0.0.1:9", "--workers", "2"], "--workers/--ray"),
    ],
)
def test_the_commands_refuse_them_in_one_line_with_exit_2(
    command: str, extra: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _bench([command, "--dataset-name", "multi-turn", "--endpoint", CHAT, *extra])
    assert importlib.import_module(f"harness.commands.{command}").main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"bench {command}: error: ") and words in err[0]


def test_bench_load_refuses_conversations_on_the_completions_endpoint(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeOpenAIServer() as server:
        args = _bench(["load", "--base-url", server.base_url, "--dataset-name", "multi-turn", "--num-prompts", "2"])
        assert importlib.import_module("harness.commands.load").main(args) == 2
        assert server.state.bodies == []  # refused before anything was sent
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "use --endpoint /v1/chat/completions" in err[0]
