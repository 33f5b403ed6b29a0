"""What a 131k vocabulary changes for the codecs: ``text-550`` with real token ids.

``bench micro``'s ``text-550`` carries 550 seeded random ids below 32,000 (every id fits in 2-3 bytes
of msgpack and pickle). This study times the same request with the ids a tokenizer gives for
550 tokens of the shipped sonnets: the embedded 4,096-token BPE's and tekken's (ids up to
131,071, some past 65,535). The prompt string and everything else stay text-550's, so the
differences are the ids'. Bytes on the wire and encode/decode medians per codec, printed as a
table and written as JSON.

    .venv/bin/python scripts/studies/tekken_ids/tekken_ids.py --out results/baselines/tekken-ids.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from harness.micro import payloads, timing  # noqa: E402
from harness.tokenizers.tokenizer import TextTokenizer, load_tokenizer  # noqa: E402

CODECS = ("pickle", "msgspec", "msgspec-packed")


def sonnet_request(tokenizer: TextTokenizer) -> Any:
    """text-550 with ``tokenizer``'s first 550 ids of the sonnets in place of its random ones."""
    text = (ROOT / "datasets" / "sonnets.txt").read_text(encoding="utf-8")
    ids = tokenizer.encode(text)[: payloads.PROMPT_TOKENS]
    req = payloads.text_request()
    req.prompt_token_ids = ids
    return req


def tokenizer_costs(tokenizer: TextTokenizer, min_time_s: float) -> dict[str, Any]:
    """Encoding 2 KiB of sonnets, and streaming its ids back one token per ``add`` (the frontend's
    detokenizer, as a stream of single-token steps sees it): medians of repeated loops."""
    text = (ROOT / "datasets" / "sonnets.txt").read_text(encoding="utf-8")[:2048]
    ids = tokenizer.encode(text)

    def stream() -> None:
        detok = tokenizer.incremental()
        for t in ids:
            detok.add([t])
        detok.flush()

    encode = timing.time_calls(lambda: tokenizer.encode(text), 20, min_time_s)
    streamed = timing.time_calls(stream, 20, min_time_s)
    return {
        "tokenizer": tokenizer.name,
        "vocab_size": tokenizer.vocab_size,
        "tokens": len(ids),
        "encode_us": round(encode.p50_us, 1),
        "stream_us_per_token": round(streamed.p50_us / len(ids), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--min-time", type=float, default=0.5, help="seconds per timed loop (default 0.5)")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    requests = {
        "text-550 (random ids < 32,000)": payloads.text_request(),
        "embedded BPE ids (< 4,096)": sonnet_request(load_tokenizer()),
        "tekken ids (< 131,072)": sonnet_request(load_tokenizer("tekken")),
    }
    rows: list[dict[str, Any]] = []
    for name, req in requests.items():
        ids = list(req.prompt_token_ids)
        share = sum(i > 65_535 for i in ids) / len(ids)
        for codec in CODECS:
            msg = payloads.packed(req) if codec == "msgspec-packed" else req
            cell = timing.measure_cell(codec, name, msg, 200, args.min_time)
            assert cell.encode and cell.decode, cell
            rows.append(
                {
                    "ids": name,
                    "max_id": max(ids),
                    "share_above_65535": round(share, 4),
                    "codec": codec,
                    "wire_bytes": cell.wire_bytes,
                    "encode_us": round(cell.encode.p50_us, 2),
                    "decode_us": round(cell.decode.p50_us, 2),
                }
            )
            req = requests[name]  # packed() changed the request in place: rebuild its list ids
            req.prompt_token_ids = ids
    print(f"{'ids':32} {'codec':15} {'bytes':>6} {'enc us':>7} {'dec us':>7}  ids > 65,535")
    for r in rows:
        print(
            f"{r['ids']:32} {r['codec']:15} {r['wire_bytes']:6d} {r['encode_us']:7.2f} {r['decode_us']:7.2f}"
            f"  {r['share_above_65535']:.1%}"
        )
    tokenizer_rows = [tokenizer_costs(tok, args.min_time) for tok in (load_tokenizer(), load_tokenizer("tekken"))]
    print(f"\n{'tokenizer':15} {'vocab':>7} {'tokens':>6} {'encode us':>9} {'stream us/token':>15}")
    for t in tokenizer_rows:
        print(
            f"{t['tokenizer']:15} {t['vocab_size']:7d} {t['tokens']:6d} {t['encode_us']:9.1f}"
            f" {t['stream_us_per_token']:15.2f}"
        )
    if args.out:
        doc = {
            "kind": "tekken-ids",
            "date": time.strftime("%Y-%m-%d"),
            "min_time_s": args.min_time,
            "rows": rows,
            "tokenizers": tokenizer_rows,
        }
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
