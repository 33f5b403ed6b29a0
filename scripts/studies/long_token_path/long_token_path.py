"""``bench micro``'s ``text-550-path`` at a long prompt's length: pickle against the packed ids.

``text-550-path`` (``harness.micro.token_path``) times a prompt's ids from the tokenizer's output
to the engine's model input: enc = the ids in the form the codec takes + encode, dec = decode +
the scheduler's chunk, the step's token array and the staged int64 tensor. It is fixed at 550
tokens; production prompts are 7-12k tokens at the median and 27-39k at p90. This study runs
the same cell (``timing.measure_path_cell``) at each ``--tokens``, ``--runs`` times, codecs
interleaved within a run, and prints enc + dec p50 and pickle / packed per run; ``--out`` writes
every cell as JSON.

    .venv/bin/python scripts/studies/long_token_path/long_token_path.py --out long-token-path.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from harness.analysis.documents import write_json  # noqa: E402
from harness.micro import timing  # noqa: E402
from harness.micro.token_path import text_path  # noqa: E402

CODECS = ("pickle", "msgspec", "msgspec-packed")
PACKED = "msgspec-packed"


def cell_row(cell: timing.MicroCell, tokens: int, run: int) -> dict[str, Any]:
    """One measured cell as a flat JSON row (µs); a cell that did not run keeps its reason."""
    row: dict[str, Any] = {"tokens": tokens, "run": run, "codec": cell.codec, "status": cell.status}
    if cell.encode is None or cell.decode is None:
        return {**row, "reason": cell.reason}
    return {
        **row,
        "enc_p50_us": round(cell.encode.p50_us, 1),
        "dec_p50_us": round(cell.decode.p50_us, 1),
        "path_p50_us": round(cell.encode.p50_us + cell.decode.p50_us, 1),
        "wire_bytes": cell.wire_bytes,
    }


def one_run(tokens: int, run: int, codecs: list[str], min_time_s: float) -> list[dict[str, Any]]:
    path = text_path(tokens)
    return [
        cell_row(timing.measure_path_cell(c, f"text-{tokens}-path", path, 20, min_time_s), tokens, run) for c in codecs
    ]


def cells_line(rows: list[dict[str, Any]]) -> str:
    """'codec enc + dec µs' for each cell of a run that ran."""
    return ", ".join(f"{r['codec']} {r['enc_p50_us']} + {r['dec_p50_us']} µs" for r in rows if "enc_p50_us" in r)


def ratio_line(rows: list[dict[str, Any]]) -> str:
    """'pickle / packed N.NN×' for a run's rows, when both cells ran."""
    by_codec = {r["codec"]: r.get("path_p50_us") for r in rows}
    pickle, packed = by_codec.get("pickle"), by_codec.get(PACKED)
    return f"pickle / packed {pickle / packed:.2f}×" if pickle and packed else "pickle / packed: n/a"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", default="550,32768", help="prompt lengths, comma-separated (default %(default)s)")
    p.add_argument("--codecs", default=",".join(CODECS), help="codecs, comma-separated (default %(default)s)")
    p.add_argument("--runs", type=int, default=3, help="runs per length (default %(default)s)")
    p.add_argument("--min-time", type=float, default=0.5, help="seconds per timed loop (default %(default)s)")
    p.add_argument("--out", type=Path, help="write every cell as JSON here")
    args = p.parse_args(argv)
    codecs = args.codecs.split(",")
    rows: list[dict[str, Any]] = []
    with timing.one_torch_thread():
        meta = timing.run_metadata()  # inside: it records the one torch thread the cells ran with
        for tokens in (int(t) for t in args.tokens.split(",")):
            for run in range(1, args.runs + 1):
                got = one_run(tokens, run, codecs, args.min_time)
                print(f"{tokens} tokens, run {run}: {cells_line(got)}; {ratio_line(got)}", flush=True)
                rows += got
    if args.out:
        write_json(args.out, {"study": "long_token_path", "meta": meta, "cells": rows})
        print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
