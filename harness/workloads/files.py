"""Reading a dataset's file: where each dataset's shipped sample is, and JSON / JSONL read with errors
that name the file and the line, so a bad line in a user's file is found without a debugger."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from harness.workloads.base import MAX_TOKENS

# Small generated samples (scripts/make_dataset_samples.py), the default of --dataset-path.
SAMPLES_DIR = Path(__file__).resolve().parents[2] / "datasets" / "samples"


class DatasetFileError(ValueError):
    """A dataset file that cannot be read as its dataset expects; the message names the file and line."""


def dataset_file(path: str | Path | None, sample: str) -> Path:
    """The file ``--dataset-path`` names, or the shipped sample ``sample`` when it is None."""
    file = SAMPLES_DIR / sample if path is None else Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"dataset file not found: {file}")
    return file


def _read_text(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetFileError(f"{file}: not UTF-8 text: {exc}") from exc


def _checked(value: Any, text: str, where: str) -> Any:
    """``value`` decoded from ``text``, refused if a ``\\u`` escape in it made a lone surrogate: a string
    that is no Unicode text, which no tokenizer can encode."""
    if "\\u" in text:
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise DatasetFileError(f"{where}: invalid Unicode: a \\u escape makes a lone surrogate") from None
    return value


def _too_deep(where: str) -> DatasetFileError:
    return DatasetFileError(f"{where}: JSON nested too deeply")


def read_jsonl(file: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSON Lines file."""
    for lineno, line in enumerate(_read_text(file).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{file}, line {lineno}"
        try:
            value = _checked(json.loads(line), line, where)
        except json.JSONDecodeError as exc:
            raise DatasetFileError(f"{where}: bad JSON: {exc.msg} (column {exc.colno})") from None
        except RecursionError:
            raise _too_deep(where) from None
        if not isinstance(value, dict):
            raise DatasetFileError(f"{file}, line {lineno}: expected a JSON object, got {type(value).__name__}")
        yield lineno, value


def field(record: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``record[name]``, checked to be a ``kind``; DatasetFileError naming ``where`` (file and line)."""
    if name not in record:
        raise DatasetFileError(f"{where}: missing field {name!r}")
    value = record[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise DatasetFileError(f"{where}: field {name!r} must be {names}, got {type(value).__name__}")
    return value


def count_field(record: Mapping[str, Any], name: str, where: str, minimum: int = 1) -> int:
    """A length in tokens: an integer from ``minimum`` to MAX_TOKENS."""
    value = field(record, name, int, where)
    if not minimum <= value <= MAX_TOKENS:
        raise DatasetFileError(f"{where}: field {name!r} must be from {minimum} to {MAX_TOKENS} tokens, got {value}")
    return int(value)


def read_json_array(file: Path) -> Iterator[tuple[int, Any]]:
    """(line number where it starts, element) for each element of the JSON array ``file`` holds, so an
    error about one entry can name its line; DatasetFileError for bad JSON or a document not an array."""
    text = _read_text(file)
    decoder = json.JSONDecoder()

    def skip(pos: int) -> int:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        return pos

    counted = [0, 1]  # [position, its line]: counted on from the last entry, not from the start

    def line_of(pos: int) -> int:
        counted[1] += text.count("\n", counted[0], pos)
        counted[0] = pos
        return counted[1]

    escapes = "\\u" in text  # only then can an entry hold a lone surrogate
    pos = skip(0)
    if not text.startswith("[", pos):
        raise DatasetFileError(f"{file}, line {line_of(pos)}: expected a JSON array of entries")
    pos = skip(pos + 1)
    if text.startswith("]", pos):
        return
    while True:
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise DatasetFileError(f"{file}, line {exc.lineno}: bad JSON: {exc.msg} (column {exc.colno})") from None
        except RecursionError:
            raise _too_deep(f"{file}, line {line_of(pos)}") from None
        line = line_of(pos)
        yield line, _checked(value, text[pos:end] if escapes else "", f"{file}, line {line}")
        pos = skip(end)
        if text.startswith("]", pos):
            if skip(pos + 1) != len(text):
                raise DatasetFileError(f"{file}, line {line_of(skip(pos + 1))}: extra data after the array")
            return
        if not text.startswith(",", pos):
            raise DatasetFileError(f"{file}, line {line_of(pos)}: bad JSON: expected ',' or ']' between entries")
        pos = skip(pos + 1)
