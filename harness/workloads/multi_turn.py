"""``multi-turn``: conversations whose every turn resends the chat so far, as vLLM's
``benchmarks/multi_turn`` and AIPerf's multi-turn conversations send them.

``--conversation-num`` conversations (default: ``--num-prompts``), each with a number of turns drawn
from a normal distribution of mean ``--conversation-turn-mean`` and standard deviation
``--conversation-turn-stddev`` (AIPerf's flags), rounded, at least 1 and at most MAX_TURNS. Each turn
brings a new user message: poem lines of the built-in corpus (``datasets/sonnets.txt``, drawn with
replacement as sonnet draws them) of about ``--conversation-input-len`` tokens, or with
``--dataset-path`` the human turns of a ShareGPT JSON, taken in the file's order after its
conversations are shuffled by ``--seed`` (a message of fewer than 4 or more than 1024 tokens is
skipped, as vLLM's ShareGPT bounds). Every turn asks for ``--conversation-output-len`` tokens.

The workload is one ``ConversationTurn`` per turn, conversation after conversation. What a later turn
sends is only known during the run: the chat so far, with the assistant's answers as the server
returned them, then the new message (harness.loadgen.conversations sends it once the previous answer
is in, ``--conversation-think-time`` seconds later). A turn's ``prompt_len`` here counts its new message
alone through the chat template; the load generator replaces it with the whole prompt's count.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.settings.declare import setting
from harness.tokenizers.tokenizer import TextTokenizer
from harness.workloads.base import Sampling, check_counts, positive_int, token_count
from harness.workloads.chat import chat_requests
from harness.workloads.files import DatasetFileError, dataset_file, field, read_json_array
from harness.workloads.sample import SampleRequest
from harness.workloads.sharegpt import MAX_PROMPT_LEN, MIN_LEN, SAMPLE
from harness.workloads.sonnet import read_poem_lines

NAME = "multi-turn"
# The most turns one conversation may draw: a chat that long has outgrown any context window here.
MAX_TURNS = 1000


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0.0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


@dataclass(frozen=True)
class MultiTurnOptions:
    conversation_num: int | None = setting(
        None,
        flag="--conversation-num",
        aliases=("--num-conversations",),  # AIPerf's two names
        type=positive_int,
        help="multi-turn: conversations to hold; the run sends the sum of their turns (default: --num-prompts)",
        comparable=True,
    )
    conversation_turn_mean: float = setting(
        3.0,
        flag="--conversation-turn-mean",
        type=float,
        help="multi-turn: mean turns per conversation, drawn from a normal distribution, rounded, at least 1 "
        "(default: %(default)s)",
        comparable=True,
    )
    conversation_turn_stddev: float = setting(
        0.0,
        flag="--conversation-turn-stddev",
        type=non_negative_float,
        help="multi-turn: standard deviation of the turns per conversation; 0: every one has the mean "
        "(default: %(default)s)",
        comparable=True,
    )
    conversation_think_time: float = setting(
        0.0,
        flag="--conversation-think-time",
        type=non_negative_float,
        metavar="SECONDS",
        help="multi-turn: seconds between a turn's answer and the next turn (AIPerf's "
        "--conversation-turn-delay-mean, but in seconds) (default: %(default)s)",
        comparable=True,
    )
    conversation_input_len: int = setting(
        128,
        flag="--conversation-input-len",
        type=token_count,
        help="multi-turn: tokens of each new user message drawn from the built-in corpus (with --dataset-path "
        "a ShareGPT file's human turns keep their own) (default: %(default)s)",
        comparable=True,
    )
    conversation_output_len: int = setting(
        64,
        flag="--conversation-output-len",
        type=token_count,
        help="multi-turn: max_tokens of every turn (default: %(default)s)",
        comparable=True,
    )


@dataclass(frozen=True)
class ConversationTurn(SampleRequest):
    """One turn of a conversation: its new user message (``prompt``) and where it stands."""

    conversation: int = 0
    turn: int = 0  # 0 for the conversation's first
    think_s: float = 0.0  # the wait after the previous turn's answer before this one is sent


def draw_turns(rng: random.Random, conversations: int, mean: float, stddev: float) -> list[int]:
    """Turns per conversation: normal(mean, stddev), rounded, clipped to 1..MAX_TURNS."""
    if not 1.0 <= mean <= MAX_TURNS:
        raise ValueError(f"--conversation-turn-mean must be from 1 to {MAX_TURNS}, got {mean:g}")
    return [min(MAX_TURNS, max(1, round(rng.gauss(mean, stddev) if stddev else mean))) for _ in range(conversations)]


def corpus_messages(
    tokenizer: TextTokenizer, count: int, input_len: int, rng: random.Random, path: str | Path | None = None
) -> list[str]:
    """``count`` messages of poem lines, each about ``input_len`` tokens (at least one line)."""
    lines = read_poem_lines(path)
    lens = [len(ids) for ids in tokenizer.encode_batch(lines)]
    per_message = max(1, round(input_len / (sum(lens) / len(lens))))
    return ["".join(rng.choices(lines, k=per_message)) for _ in range(count)]


def human_turns(file: Path) -> list[list[str]]:
    """Each conversation's human turns, in order, from a ShareGPT JSON (conversations without one left out)."""
    out = []
    for line, entry in read_json_array(file):
        where = f"{file}, line {line}"
        if not isinstance(entry, dict):
            raise DatasetFileError(f"{where}: expected an object with 'conversations', got {type(entry).__name__}")
        turns = field(entry, "conversations", list, where)
        texts = [_human_text(turn, f"{where}, conversations[{i}]") for i, turn in enumerate(turns)]
        human = [t for t in texts if t is not None]
        if human:
            out.append(human)
    return out


def _human_text(turn: Any, where: str) -> str | None:
    if not isinstance(turn, dict):
        raise DatasetFileError(f"{where}: must be an object, got {type(turn).__name__}")
    return field(turn, "value", str, where) if field(turn, "from", str, where) == "human" else None


def file_messages(tokenizer: TextTokenizer, count: int, file: Path, rng: random.Random) -> list[str]:
    """``count`` human turns of the ShareGPT ``file``, in order after its conversations are shuffled,
    from the start again when it has too few; each of MIN_LEN..MAX_PROMPT_LEN tokens."""
    conversations = human_turns(file)
    rng.shuffle(conversations)
    pool = [message for turns in conversations for message in turns]
    kept = [m for m, ids in zip(pool, tokenizer.encode_batch(pool)) if MIN_LEN <= len(ids) <= MAX_PROMPT_LEN]
    if not kept:
        raise DatasetFileError(f"{file}: no human turn of {MIN_LEN} to {MAX_PROMPT_LEN} tokens")
    return [kept[i % len(kept)] for i in range(count)]


def turn_requests(
    tokenizer: TextTokenizer, turns: Sequence[int], messages: Sequence[str], output_len: int, think_s: float
) -> list[ConversationTurn]:
    """The workload: one ConversationTurn per turn, conversation by conversation, ``messages`` in order."""
    counted = chat_requests(tokenizer, messages, [()] * len(messages), [output_len] * len(messages))
    places = list(_places(turns))
    return [
        ConversationTurn(**{**asdict(s), "completion_prompt": None}, conversation=c, turn=k, think_s=think_s)
        for s, (c, k) in zip(counted, places, strict=True)
    ]


def _places(turns: Sequence[int]) -> Iterator[tuple[int, int]]:
    for conversation, n in enumerate(turns):
        for turn in range(n):
            yield conversation, turn


class MultiTurnDataset:
    name = NAME
    options = MultiTurnOptions
    takes_images = False
    # Its turns depend on each other: harness.loadgen.conversations sends them.
    conversational = True

    def sample(self, tokenizer: TextTokenizer, options: MultiTurnOptions, sampling: Sampling) -> list[SampleRequest]:
        conversations = options.conversation_num or sampling.num_requests
        check_counts(conversations, options.conversation_output_len, "--conversation-output-len")
        rng = random.Random(sampling.seed)
        turns = draw_turns(rng, conversations, options.conversation_turn_mean, options.conversation_turn_stddev)
        if sampling.dataset_path is None:
            messages = corpus_messages(tokenizer, sum(turns), options.conversation_input_len, rng)
        else:
            messages = file_messages(tokenizer, sum(turns), dataset_file(sampling.dataset_path, SAMPLE), rng)
        think_s = options.conversation_think_time
        return list(turn_requests(tokenizer, turns, messages, options.conversation_output_len, think_s))


MULTI_TURN = MultiTurnDataset()
