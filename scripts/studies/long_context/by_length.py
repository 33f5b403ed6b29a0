"""How the codec's cost grows with the prompt: from the run files of a ``bench run`` on a long-context
trace, per arm and prompt-length bucket, the requests' medians over every round: prompt tokens (the
server's count), codec µs and codec + wire µs on the first-token path, TTFT, and the codec's share of
TTFT. README.md beside this script has the question, the command and the result."""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

BUCKETS = ((0, 4_096), (4_096, 8_192), (8_192, 16_384), (16_384, 131_072))


def bucket_name(low: int, high: int) -> str:
    return f"{low // 1024}k-{high // 1024}k"


def by_length(paths: list[Path]) -> dict[str, dict[str, dict[str, float]]]:
    """Arm → bucket → figure → median over the arm's successful requests (every round)."""
    seen: dict[str, dict[str, list[dict[str, float]]]] = defaultdict(lambda: defaultdict(list))
    for path in paths:
        doc = json.loads(path.read_text())
        arm = (doc.get("metadata") or {}).get("flags", {}).get("arm") or doc["codec"]
        for rec in doc.get("records") or ():
            tokens, codec, wire = rec.get("prompt_tokens"), rec.get("codec_us"), rec.get("codec_wire_us")
            if not rec.get("success") or tokens is None or codec is None or wire is None:
                continue
            for low, high in BUCKETS:
                if low <= tokens < high:
                    seen[arm][bucket_name(low, high)].append(
                        {
                            "prompt_tokens": tokens,
                            "codec_us": codec,
                            "codec_wire_us": wire,
                            "ttft_ms": rec["ttft"] * 1e3,
                        }
                    )
    out: dict[str, dict[str, dict[str, float]]] = {}
    for arm, buckets in seen.items():
        out[arm] = {}
        for low, high in BUCKETS:
            rows = buckets.get(bucket_name(low, high), [])
            if not rows:
                continue
            figures = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            figures["codec_share_of_ttft_pct"] = statistics.median(r["codec_us"] / (r["ttft_ms"] * 10) for r in rows)
            out[arm][bucket_name(low, high)] = {"requests": len(rows), **{k: round(v, 2) for k, v in figures.items()}}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("runs", nargs="+", type=Path, help="the run files (ARM-rROUND-*.json) of one bench run")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    result: dict[str, Any] = by_length(args.runs)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for arm, buckets in result.items():
        print(arm)
        for name, f in buckets.items():
            print(
                f"  {name:9} n={f['requests']:3}  {f['prompt_tokens']:8,.0f} tokens  codec {f['codec_us']:8.1f} µs  "
                f"codec+wire {f['codec_wire_us']:8.1f} µs  TTFT {f['ttft_ms']:8.1f} ms  "
                f"codec {f['codec_share_of_ttft_pct']:.2f}% of TTFT"
            )


if __name__ == "__main__":
    main()
