"""``bench micro``'s cells of SGLang's own messages, measured in SGLang's venv and read back here.

SGLang cannot be imported beside wirebench's codecs (it lives in a venv of its own, ``.venv-sglang``), so
its cells are measured by ``harness.micro.sglang_messages`` run with that venv's Python, which prints one
JSON line per cell; each becomes a ``MicroCell`` like the others, timed by the same loop on the same
seeded payloads, with the same memcpy reference (the caller's). A payload SGLang has no message for gets
an "unsupported" cell saying why; a venv that cannot run the module gets one error line per cell, with
the end of its stderr, never an exception out of the run.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from harness.micro.sglang_messages import MODES, OUTPUT_BATCHES, REQUESTS
from harness.micro.timing import MicroCell, Timing

ROOT = Path(__file__).resolve().parents[2]
SETUP_HINT = "scripts/setup.sh --with-sglang-cpu, or --sglang-python naming a venv with SGLang and wirebench"
# Why a payload has no SGLang cell: what SGLang sends instead.
NOT_SENT = {
    "text-550-packed": "SGLang's ids always travel as an int64 array: see text-550",
    "outputs-64-stats": "SGLang's outputs carry no scheduler state",
    "text-550-path": "the request path is timed for wirebench's server only",
}
NO_MM = "SGLang's multimodal inputs are not built here"


def codec_names() -> tuple[str, ...]:
    return MODES


def has_message(payload: str) -> bool:
    return payload in REQUESTS + OUTPUT_BATCHES


def why_not(payload: str) -> str:
    return NOT_SENT.get(payload, NO_MM)


def measure(
    python: str, codecs: Sequence[str], payloads: Sequence[str], min_iterations: int, min_time_s: float
) -> Iterator[MicroCell | dict[str, Any]]:
    """Each of ``codecs`` (SGLang's modes) on each payload, payload by payload, yielded as they arrive;
    first a dict of the versions the venv reports (absent if it could not start)."""
    order = [(codec, payload) for payload in payloads for codec in codecs]
    received: dict[tuple[str, str], MicroCell] = {}
    done = 0

    def ready() -> Iterator[MicroCell]:
        nonlocal done
        while done < len(order):
            codec, payload = order[done]
            if not has_message(payload):
                yield MicroCell(codec, payload, "unsupported", why_not(payload))
            elif (codec, payload) in received:
                yield received[(codec, payload)]
            else:
                return
            done += 1

    failure = ""
    timed = [p for p in payloads if has_message(p)]
    if timed:
        with tempfile.TemporaryFile("w+") as errors:
            words = [python, "-m", "harness.micro.sglang_messages", "--payload", ",".join(timed)]
            words += ["--codec", ",".join(codecs), "--min-iterations", str(min_iterations)]
            words += ["--min-time", str(min_time_s)]
            try:
                with subprocess.Popen(words, stdout=subprocess.PIPE, stderr=errors, text=True, cwd=ROOT) as proc:
                    assert proc.stdout is not None
                    for line in proc.stdout:
                        row = json.loads(line)
                        if row.get("kind") == "versions":
                            yield {k: v for k, v in row.items() if k != "kind"}
                        elif row.get("kind") == "cell":
                            cell = to_cell(row)
                            received[(cell.codec, cell.payload)] = cell
                            yield from ready()
                rc = proc.returncode
            except (OSError, json.JSONDecodeError) as exc:
                rc, failure = -1, f"{type(exc).__name__}: {exc}"
            if rc != 0 and not failure:
                errors.seek(0)
                tail = [ln for ln in errors.read().splitlines() if ln.strip()][-1:] or ["no message"]
                failure = f"SGLang's Python exited {rc}: {tail[0][:200]}"
    yield from ready()
    for codec, payload in order[done:]:
        if not has_message(payload):
            yield MicroCell(codec, payload, "unsupported", why_not(payload))
        else:
            yield received.get((codec, payload)) or MicroCell(
                codec, payload, "error", failure or "SGLang's Python sent no figures"
            )


def to_cell(row: dict[str, Any]) -> MicroCell:
    """One JSON line of ``harness.micro.sglang_messages`` as a cell."""
    if row["status"] != "ok":
        return MicroCell(row["codec"], row["payload"], row["status"], row.get("reason"))
    return MicroCell(
        row["codec"],
        row["payload"],
        "ok",
        None,
        Timing(**row["encode"]),
        Timing(**row["decode"]),
        wire_bytes=row["wire_bytes"],
        frames=row["frames"],
    )
