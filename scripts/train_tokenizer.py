#!/usr/bin/env python3
"""Train datasets/tokenizer.json: the project's byte-level BPE tokenizer.

It is trained with the Hugging Face ``tokenizers`` library on the project's
own corpus (datasets/sonnets.txt) plus a supplement of ordinary English prose,
numbers, punctuation and a little code and non-Latin text that this script
composes from the project's word list (datasets/tokenizer-words.txt) and its
own short lists, so that chat prompts and random text tokenize sensibly too.
Byte-level means every Unicode string encodes and decodes losslessly, whatever
was in the training text.

    python scripts/train_tokenizer.py              # rewrite datasets/tokenizer.json
    python scripts/train_tokenizer.py --out x.json

Deterministic: the supplement comes from ``random.Random(SEED)`` and the BPE
trainer breaks ties by pair order, so the same ``tokenizers`` version writes a
byte-identical file (TRAINED_WITH records the version the committed file came
from).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "datasets" / "sonnets.txt"
OUT = ROOT / "datasets" / "tokenizer.json"
SEED = 4096
VOCAB_SIZE = 4096
TRAINED_WITH = "0.23.3"

# Order fixes the ids: 0..N-1 in this order. harness/tokenizers/tokenizer.py finds them by name.
SPECIAL_TOKENS = [
    "<|bos|>",
    "<|eos|>",
    "<|pad|>",
    "<|image|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|tool|>",
]

# Everyday English, written for this project (no external word list), one word a line; the order fixes
# what the seeded supplement draws, so the trained file depends on it.
WORDS = ROOT / "datasets" / "tokenizer-words.txt"
COMMON = WORDS.read_text(encoding="utf-8").split()

CAPITALIZED = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
    "London",
    "Paris",
    "Tokyo",
    "Berlin",
    "Madrid",
    "Rome",
    "Cairo",
    "Lagos",
    "Lima",
    "Oslo",
    "Alice",
    "Bob",
    "Carol",
    "David",
    "Emma",
    "Frank",
    "Grace",
    "Henry",
    "Iris",
    "Jack",
    "Python",
    "Linux",
    "Windows",
    "English",
    "French",
    "German",
    "Spanish",
    "Chinese",
    "Japanese",
]

CONTRACTIONS = [
    "don't",
    "it's",
    "I'm",
    "can't",
    "won't",
    "you're",
    "we've",
    "they'll",
    "isn't",
    "didn't",
    "that's",
    "there's",
    "I'd",
    "let's",
    "wasn't",
]

UNICODE = [
    "café",
    "naïve",
    "résumé",
    "über",
    "façade",
    "jalapeño",
    "coöperate",
    "München",
    "São Paulo",
    "Zürich",
    "Ελληνικά",
    "русский",
    "日本語",
    "中文",
    "한국어",
    "हिन्दी",
    "العربية",
    "emoji 🙂",
    "🚀",
    "✓",
    "→",
    "—",
    "…",
    "“quoted”",
]

CODE = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i)\n",
    '{"model": "wirebench", "max_tokens": 128, "stream": true}\n',
    "if (x > 0 && y < 10) { return x * y; }\n",
    "curl -s http://localhost:8000/v1/completions\n",
    'data: {"choices": [{"text": "hello"}]}\n\n',
    'x = [1, 2, 3]; y = {"a": 1, "b": 2}\n',
    "# comment: TODO(fix) -> see issue #42\n",
]

PUNCT_END = [".", ".", ".", "?", "!", "...", ":", ";"]


def _sentence(rng: random.Random) -> str:
    words: list[str] = []
    for _ in range(rng.randint(5, 18)):
        r = rng.random()
        if r < 0.68:
            words.append(rng.choice(COMMON))
        elif r < 0.80:
            words.append(_inflect(rng.choice(COMMON), rng))
        elif r < 0.88:
            words.append(rng.choice(CAPITALIZED))
        elif r < 0.93:
            words.append(rng.choice(CONTRACTIONS))
        elif r < 0.97:
            words.append(_number(rng))
        else:
            words.append(rng.choice(UNICODE))
    # Sprinkle inner punctuation the way prose does.
    for i in range(1, len(words) - 1):
        r = rng.random()
        if r < 0.10:
            words[i] += ","
        elif r < 0.12:
            words[i] = f"({words[i]})"
        elif r < 0.14:
            words[i] = f'"{words[i]}"'
        elif r < 0.15:
            words[i] += " -"
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice(PUNCT_END)


def _inflect(word: str, rng: random.Random) -> str:
    # Crude English morphology; enough to give suffixes their own merges.
    suffix = rng.choice(["s", "ed", "ing", "er", "ly", "ness", "ful"])
    if word.endswith("e") and suffix[0] in "ei":
        word = word[:-1]
    return word + suffix


def _number(rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        return str(rng.randint(0, 100))
    if kind == 1:
        return str(rng.randint(1800, 2030))
    if kind == 2:
        return f"{rng.uniform(0, 1000):.{rng.randint(1, 3)}f}"
    if kind == 3:
        return f"{rng.randint(1, 100)}%"
    if kind == 4:
        return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
    return f"${rng.randint(1, 9999)}"


def supplement(seed: int = SEED, paragraphs: int = 900) -> list[str]:
    """Deterministic prose, chat-shaped text and a little code."""
    rng = random.Random(seed)
    out: list[str] = ["Pick as many lines as you can from these poem lines:\n"]
    for _ in range(paragraphs):
        para = " ".join(_sentence(rng) for _ in range(rng.randint(1, 5)))
        r = rng.random()
        if r < 0.1:
            para = rng.choice(CODE) + para
        elif r < 0.2:
            para = f"<|user|>\n{para}\n<|assistant|>\n"
        out.append(para + "\n")
    return out


def training_texts() -> list[str]:
    # The corpus counts twice so its verse dominates the merges it shares.
    corpus = CORPUS.read_text(encoding="utf-8").splitlines(keepends=True)
    return corpus + corpus + supplement()


def build(vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    # trim_offsets only affects offsets; no special tokens are added on encode.
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_texts(), trainer=trainer)
    return tok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="where to write (default: %(default)s)")
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = parser.parse_args(argv)
    tok = build(args.vocab_size)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out), pretty=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
