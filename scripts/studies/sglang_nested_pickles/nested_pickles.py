"""Where SGLang's msgpack mode spends its serialization time: per process, per message type, the socket
calls' encode (send) or decode (receive) and the nested pickles (``wrap`` / ``unwrap``) the hook timed,
median and mean µs and count, from the hook's folders of one ``bench run --server sglang`` (its
``sglang-spans/ARM-*`` folders). README.md beside this script has the question and the result."""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.processes.jsonl_records import read_rows
from harness.sglang_hook.records import SEND, UNWRAP, WRAP


def call_us(row: list[Any]) -> float:
    """The row's codec time: a send's encode, a receive's decode, a wrap or unwrap whole (µs)."""
    start, middle, end = row[3], row[4], row[5]
    if row[0] == SEND:
        return (middle - start) / 1e3
    return (end - (start if row[0] in (WRAP, UNWRAP) else middle)) / 1e3


def summarise(folder: Path, least: int) -> dict[str, Any]:
    """One server's folder: role → "kind message type" → count, median and mean µs."""
    found: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    ipc = None
    for path in sorted(folder.glob("*.jsonl")):
        rows, _ = read_rows(path)
        meta = rows[0][1]
        ipc = meta.get("ipc", ipc)
        for row in rows[1:]:
            found[meta["role"]][f"{row[0]} {row[1]}"].append(call_us(row))
    out: dict[str, Any] = {"ipc": ipc, "roles": {}}
    for role, calls in sorted(found.items()):
        out["roles"][role] = {
            name: {"n": len(v), "median_us": round(statistics.median(v), 1), "mean_us": round(statistics.mean(v), 1)}
            for name, v in sorted(calls.items())
            if len(v) >= least
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("folders", nargs="+", type=Path, help="the hook's folders, one per arm's server")
    p.add_argument("--least", type=int, default=20, help="leave out calls seen fewer times (control messages)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    result = {folder.name.rsplit("-", 1)[0]: summarise(folder, args.least) for folder in args.folders}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for arm, summary in result.items():
        print(f"{arm} ({summary['ipc']})")
        for role, calls in summary["roles"].items():
            for name, s in calls.items():
                print(f"  {role:12} {name:38} n={s['n']:6}  median {s['median_us']:7.1f}  mean {s['mean_us']:7.1f} µs")


if __name__ == "__main__":
    main()
