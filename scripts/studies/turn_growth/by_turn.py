"""How the codec's cost grows over a conversation: from the run files of a multi-turn ``bench run``, per
arm and turn, the median over rounds of each run's per-turn figures (``metadata.turns``: mean prompt
tokens, request bytes, TTFT, codec µs and codec + wire µs on the first-token path). README.md beside
this script has the question, the command and the result."""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

FIGURES = ("prompt_tokens_mean", "request_bytes_mean", "ttft_mean_ms", "codec_us_mean", "codec_wire_us_mean")


def by_turn(paths: list[Path]) -> dict[str, dict[int, dict[str, float]]]:
    """Arm → turn → figure → median over the arm's runs (rounds)."""
    seen: dict[str, dict[int, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for path in paths:
        doc = json.loads(path.read_text())
        arm = (doc.get("metadata") or {}).get("flags", {}).get("arm") or doc.get("codec")
        for row in (doc.get("metadata") or {}).get("turns") or ():
            for key in FIGURES:
                value = row.get(key)
                if isinstance(value, (int, float)):
                    seen[arm][row["turn"]][key].append(float(value))
    return {
        arm: {
            turn: {k: round(statistics.median(v), 1) for k, v in figures.items()} for turn, figures in sorted(t.items())
        }
        for arm, t in seen.items()
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("runs", nargs="+", type=Path, help="the run files (ARM-rROUND-*.json) of one bench run")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    result: dict[str, Any] = by_turn(args.runs)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for arm, turns in result.items():
        print(arm)
        for turn, f in turns.items():
            print(
                f"  turn {turn}: {f['prompt_tokens_mean']:7.0f} tokens {f['request_bytes_mean']:8.0f} B  "
                f"codec {f['codec_us_mean']:7.1f} µs  codec+wire {f['codec_wire_us_mean']:8.1f} µs  "
                f"TTFT {f['ttft_mean_ms']:6.1f} ms"
            )


if __name__ == "__main__":
    main()
