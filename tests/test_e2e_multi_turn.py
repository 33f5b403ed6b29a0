"""End to end: `bench load` holds multi-turn conversations with wirebench's own server (`bench serve`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.loadgen.conversations import History
from harness.tokenizers.tokenizer import load_tokenizer
from harness.workloads.datasets import build_workload
from harness.workloads.multi_turn import ConversationTurn
from harness.workloads.spec import WorkloadSpec

from serve_process import bench_load

CONVERSATIONS, TURNS = 3, 3
OPTIONS = {"conversation_turn_mean": float(TURNS), "conversation_input_len": 32, "conversation_output_len": 4}


@pytest.mark.slow
def test_every_turn_resends_the_chat_with_the_servers_answers(tmp_path: Path) -> None:
    workload = ["--dataset-name", "multi-turn", "--num-prompts", str(CONVERSATIONS)]
    workload += ["--conversation-turn-mean", str(TURNS), "--conversation-input-len", "32"]
    workload += ["--conversation-output-len", "4", "--endpoint", "/v1/chat/completions"]
    done = bench_load([*workload, "--request-rate", "20"], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Conversations, by turn" in done.stdout

    (path,) = tmp_path.glob("*.json")
    doc = json.loads(path.read_text())
    records = doc["records"]
    assert doc["completed"] == CONVERSATIONS * TURNS == len(records)  # every turn sent and recorded
    assert [(r["conversation"], r["turn"]) for r in records] == [
        (c, k) for c in range(CONVERSATIONS) for k in range(TURNS)
    ]
    assert [t["requests"] for t in doc["metadata"]["turns"]] == [CONVERSATIONS] * TURNS

    # Each turn's prompt, as the server counted it, is the chat so far: the earlier messages and the
    # answers exactly as the server returned them (rebuilt here from the same seed's workload).
    tokenizer = load_tokenizer(None)
    spec = WorkloadSpec(dataset_name="multi-turn", num_prompts=CONVERSATIONS).with_options(**OPTIONS)
    turns = build_workload(spec, tokenizer)
    histories: dict[int, History] = {}
    for turn, record, answer in zip(turns, records, doc["generated_texts"], strict=True):
        assert isinstance(turn, ConversationTurn) and answer
        history = histories.setdefault(turn.conversation, History())
        chat = tokenizer.apply_chat_template(list(history.prompt(turn.prompt)))
        assert record["prompt_tokens"] == len(tokenizer.encode(chat))
        history.answered(turn.prompt, answer)
    for c in range(CONVERSATIONS):
        mine = [r for r in records if r["conversation"] == c]
        assert all(b["prompt_tokens"] > a["prompt_tokens"] for a, b in zip(mine, mine[1:]))
        assert all(b["request_bytes"] > a["request_bytes"] for a, b in zip(mine, mine[1:]))
