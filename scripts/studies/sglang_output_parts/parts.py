"""Where SGLang's msgpack mode spends its time on a step's output batch, against pickle mode: the message
whole, the time stats' nested pickle, the msgpack of the rest, and in that the Python ext hooks each
token-id ``array('q')`` takes (two per request: ``decode_ids`` and ``output_ids``). Run with SGLang's Python
(.venv-sglang); README.md beside this script has the question, the command and the result."""

from __future__ import annotations

import argparse
import json
import pickle
from array import array
from pathlib import Path
from typing import Any

import msgspec
import sglang
import sglang.srt.managers.io_struct as io
from sglang.srt.observability import req_time_stats as time_stats

from harness.micro.sglang_messages import measure_cell, sglang_message
from harness.micro.timing import time_calls


def p50(fn: Any, iterations: int, seconds: float) -> float:
    return round(time_calls(fn, iterations, seconds).p50_us, 2)


def values(field: Any) -> list[Any]:
    """A field's value, or its items where it is a list."""
    return field if isinstance(field, list) else [field]


def as_list(field: Any) -> Any:
    """The field with each token-id array as a list of ints (what msgpack encodes without a hook)."""
    return [list(v) for v in field] if isinstance(field, list) else list(field)


def parts(payload: str, iterations: int, seconds: float) -> dict[str, Any]:
    """One payload's parts, µs (p50 of single calls, as bench micro times its cells)."""
    msg = sglang_message(payload, io, time_stats)
    out: dict[str, Any] = {}
    for mode in ("sglang-pickle", "sglang-msgspec"):
        cell = measure_cell(msg, mode, io, iterations, seconds)
        out[mode] = {"bytes": cell["wire_bytes"], "encode": round(cell["encode"]["p50_us"], 2)}
        out[mode]["decode"] = round(cell["decode"]["p50_us"], 2)
    stats = msg.time_stats
    nested = pickle.dumps(stats)
    out["nested pickle of the time stats"] = {
        "encode": p50(lambda: pickle.dumps(stats), iterations, seconds),
        "decode": p50(lambda: pickle.loads(nested), iterations, seconds),
    }
    rest = msgspec.structs.replace(msg, time_stats=None)
    packed = io.msgpack_encode(rest)
    out["msgpack of the rest"] = {
        "encode": p50(lambda: io.msgpack_encode(rest), iterations, seconds),
        "decode": p50(lambda: io.msgpack_decode(packed), iterations, seconds),
    }
    arrays = [v for f in rest.__struct_fields__ for v in values(getattr(rest, f)) if isinstance(v, array)]
    one = arrays[0]
    ext = io.enc_hook(one)
    data = memoryview(ext.data)  # as msgspec hands the hook its bytes
    hook_enc = time_calls(lambda: io.enc_hook(one), iterations, seconds).p50_us
    hook_dec = time_calls(lambda: io.ext_hook(ext.code, data), iterations, seconds).p50_us
    out["ext hooks of the arrays"] = {
        "arrays": len(arrays),
        "encode": round(len(arrays) * hook_enc, 2),
        "decode": round(len(arrays) * hook_dec, 2),
        "per array": {"encode": round(hook_enc, 3), "decode": round(hook_dec, 3)},
    }
    lists = {
        f: as_list(getattr(rest, f))
        for f in rest.__struct_fields__
        if any(isinstance(v, array) for v in values(getattr(rest, f)))
    }
    as_lists = msgspec.structs.replace(rest, **lists)
    out["msgpack of the rest, id arrays as int lists"] = {
        "encode": p50(lambda: io.msgpack_encode(as_lists), iterations, seconds)
    }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--payload", default="outputs-64,outputs-256", help="comma-separated bench micro payloads")
    p.add_argument("--min-iterations", type=int, default=200)
    p.add_argument("--min-time", type=float, default=0.5)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    result: dict[str, Any] = {"sglang": sglang.__version__, "unit": "µs, p50 of single calls", "payloads": {}}
    for payload in args.payload.split(","):
        result["payloads"][payload] = parts(payload, args.min_iterations, args.min_time)
        for name, figures in result["payloads"][payload].items():
            shown = {k: v for k, v in figures.items() if k != "per array"}
            print(f"{payload:12} {name:40} {shown}")
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
