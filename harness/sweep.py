"""``bench sweep``: where do codecs cross?  Curves over payload size and request rate.

A sweep runs a grid over one or two axes for a set of codecs (the first is the
reference) and draws crossover curves:

- payload axis, one of ``--image-sides 64,256,1024`` (one RGB image of side x side
  pixels per request) or ``--prompt-lens 128,550,2048`` (prompt tokens);
- rate axis, ``--rates 5,10,20,40`` (requests per second).

Two parts, each saved in the sweep document and drawn in its own PNG:

**micro** (payload axis only): bench micro's measurement per codec x payload,
repeated ``--micro-repeat`` times with the codec order reversed every other
round. A round's *codec cost* is encode p50 + decode p50 (``micro.measure_cell``);
its *delivery* is encode, send → receive in another process over the arm's
transport (``--transport``: zmq ipc or the shm arena), decode
(``harness.delivery.measure`` p50; ``--no-delivery`` skips it);
the physical reference is one memcpy of the payload's bytes (``micro.time_memcpy``;
bytes as ``micro.payload_nbytes`` defines them). Drawn on log–log axes against
payload bytes.

**e2e**: at every grid point, ``bench run`` as it is (``bench_run.run_rounds``:
a fresh server per codec and round, rounds interleaved, order reversed every
other round; every run file saved under ``<result-dir>/sweep-<stamp>/<point>/``
with the point's compare file beside them). Drawn: TTFT p50, TTFT p99 and
TPOT mean against the request rate (the saturation knee) or the payload bytes.

Statistics: each absolute figure is the mean over rounds with a 95% t-interval
of the per-round values (``stats.t_ppf``). Each codec is judged against the
reference at every point with ``harness.stats`` (paired log ratios over rounds,
Holm over the point's table: for e2e, ``harness.compare.compare``'s whole
table as ``bench run`` judges it; for micro, codec cost and delivery of every
codec). A *crossing* is the first grid point (in axis order) where a codec's
verdict becomes "slower" or "faster" than the reference (Holm-adjusted); the
sweep says so in words under each plot, in the PNG's caption and in the JSON.

Sweep document (``kind: "sweep"``, ``schema_version`` 1)::

    {"kind": "sweep", "schema_version": 1, "created", "wall_s", "interrupted",
     "codecs": [labels], "reference": label, "margin_pct",
     "axes": [{"name": "image_side"|"prompt_len"|"request_rate", "label", "unit", "values"}],
     "payload_bytes": {"<payload value>": bytes},
     "micro": {"payload_kind", "repeat", "min_iterations", "min_time_s", "delivery",
               "figures": [{"key", "label"}],
               "points": [{"at": {axis: value}, "payload", "payload_bytes", "memcpy_us": INTERVAL,
                           "codecs": {label: {"status", "reason", "wire_bytes", "frames", "delivery_note",
                                              "figures": {key: INTERVAL}, "verdicts": {key: VERDICT}}}}]},
     "e2e": {"repeat", "figures": [...],
             "points": [{"at", "label", "folder", "compare_file" (both relative to the sweep document),
                         "request_rate" (bench run's rate note), "status", "message",
                         "codecs": {label: {"status", "message", "figures": {key: INTERVAL},
                                            "verdicts": {key: VERDICT}}},
                         "compare": <the point's compare document>}]},
     "crossings": [{"part", "codec", "figure", "label", "series", "verdict" (null: never), "at",
                    "change_pct", "ci_low_pct", "ci_high_pct", "verdicts": [{"at", "verdict"}], "text"}],
     "plots": [PNG file names], "metadata": {versions, machine, git, flags}}

INTERVAL = ``{"values", "n", "mean", "median", "sd", "ci_low", "ci_high", "gmean", "gci_low", "gci_high",
"confidence"}`` (``interval``: the t-interval of the per-round values, and of their logs around the geometric
mean, which the log–log plots draw);
VERDICT = ``harness.compare.verdict_dict``. ``--quick`` is a tiny preset for the
test suite (2 image sides x 2 codecs, sim executor, 6 requests, 2 e2e rounds).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import stats
from harness.compare import (
    CODEC_FIGURES,
    compare_document,
    comparison_dict,
    verdict_dict,
)
from harness.documents import jsonable, write_json
from harness.plots import arm_colors, pyplot
from harness.stats import Figure

SWEEP_SCHEMA = 1
CONFIDENCE = 0.95

IMAGE_SIDE, PROMPT_LEN, REQUEST_RATE = "image_side", "prompt_len", "request_rate"
AXIS_TEXT = {
    IMAGE_SIDE: ("image side", "px"),
    PROMPT_LEN: ("prompt length", "tokens"),
    REQUEST_RATE: ("request rate", "req/s"),
}
PAYLOAD_AXES = (IMAGE_SIDE, PROMPT_LEN)
MICRO_KINDS = ("image", "tensor-fp16", "tensor-fp32")

MICRO_FIGURES = (
    Figure("codec_us", "codec µs (encode + decode p50)"),
    Figure("delivery_us", "delivery µs (encode → ipc → decode, p50)"),
)
E2E_FIGURES = (
    Figure("median_ttft_ms", "TTFT p50"),
    Figure("p99_ttft_ms", "TTFT p99"),
    Figure("mean_tpot_ms", "TPOT mean"),
)
DEFAULT_CODECS = "pickle,msgspec-b64,msgspec-oob"

# --quick: flag → value, applied where the flag was left at its default.
QUICK: dict[str, Any] = {
    "image_sides": "64,128",
    "codec": "pickle,msgspec-oob",
    "repeat": 2,
    "num_prompts": 6,
    "sonnet_output_len": 8,
    "executor": "sim",
    "request_rate": 20.0,
    "warmup_requests": 1,
    "micro_repeat": 3,
    "micro_min_iterations": 20,
    "micro_min_time": 0.02,
    "delivery": False,
}


# --- axes ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Axis:
    name: str
    values: tuple[float, ...]

    @property
    def label(self) -> str:
        return AXIS_TEXT[self.name][0]

    @property
    def unit(self) -> str:
        return AXIS_TEXT[self.name][1]

    def text(self, value: float) -> str:
        """One point in words: "image 64 px", "prompt 550 tokens", "20 req/s"."""
        v = f"{value:g}"
        if self.name == IMAGE_SIDE:
            return f"image {v} px"
        if self.name == PROMPT_LEN:
            return f"prompt {v} tokens"
        return f"{v} req/s"

    def slug(self, value: float) -> str:
        return {IMAGE_SIDE: "image", PROMPT_LEN: "prompt", REQUEST_RATE: "rate"}[self.name] + f"-{value:g}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "label": self.label, "unit": self.unit, "values": list(self.values)}


def parse_values(text: str, what: str, integer: bool) -> tuple[float, ...]:
    """``64,128,256`` → ascending positive numbers (ValueError naming the flag otherwise)."""
    out: list[float] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = float(int(part)) if integer else float(part)
        except ValueError:
            raise ValueError(f"{what}: {part!r} is not a {'whole ' if integer else ''}number") from None
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{what}: values must be positive and finite, got {part}")
        out.append(value)
    if not out:
        raise ValueError(f"{what}: no value given")
    if len(set(out)) != len(out):
        raise ValueError(f"{what}: a value is repeated")
    return tuple(sorted(out))


def build_axes(args: argparse.Namespace) -> list[Axis]:
    """The payload axis (if any) first, then the rate axis (if any)."""
    axes = []
    if args.image_sides and args.prompt_lens:
        raise ValueError("--image-sides and --prompt-lens are both payload axes: give one of them")
    if args.image_sides:
        axes.append(Axis(IMAGE_SIDE, parse_values(args.image_sides, "--image-sides", True)))
    if args.prompt_lens:
        axes.append(Axis(PROMPT_LEN, parse_values(args.prompt_lens, "--prompt-lens", True)))
    if args.rates:
        axes.append(Axis(REQUEST_RATE, parse_values(args.rates, "--rates", False)))
    if not axes:
        raise ValueError("nothing to sweep: give --image-sides, --prompt-lens and/or --rates (or --quick)")
    return axes


def payload_axis(axes: Sequence[Axis]) -> Axis | None:
    return next((a for a in axes if a.name in PAYLOAD_AXES), None)


def rate_axis(axes: Sequence[Axis]) -> Axis | None:
    return next((a for a in axes if a.name == REQUEST_RATE), None)


def x_axis(axes: Sequence[Axis]) -> Axis:
    """The axis the e2e curves run along: the rate when there is one (the saturation knee), else the payload."""
    return rate_axis(axes) or axes[0]


def grid(axes: Sequence[Axis]) -> list[dict[str, float]]:
    points: list[dict[str, float]] = [{}]
    for axis in axes:
        points = [{**p, axis.name: v} for p in points for v in axis.values]
    return points


def point_label(axes: Sequence[Axis], at: dict[str, float]) -> str:
    return ", ".join(a.text(at[a.name]) for a in axes if a.name in at)


def point_slug(axes: Sequence[Axis], at: dict[str, float]) -> str:
    return "-".join(a.slug(at[a.name]) for a in axes if a.name in at)


# --- statistics ------------------------------------------------------------------------------------


def interval(values: Sequence[float], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """Mean of the per-round values with its t-interval (NaN bounds below two rounds).

    Also the geometric mean with the t-interval of the log values (``gmean``, ``gci_low``, ``gci_high``;
    NaN unless every value is positive): noise between rounds is multiplicative, and on log axes (where the
    plots draw it) that interval is symmetric and never reaches zero, as an arithmetic one with 3 rounds can.
    """
    xs = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    n = len(xs)
    t = stats.t_ppf(0.5 + confidence / 2, n - 1) if n > 1 else math.nan
    mean = math.fsum(xs) / n if n else math.nan
    sd = statistics.stdev(xs) if n > 1 else math.nan
    half = t * sd / math.sqrt(n) if n > 1 else math.nan
    gmean = g_low = g_high = math.nan
    if n and all(x > 0 for x in xs):
        logs = [math.log(x) for x in xs]
        centre = math.fsum(logs) / n
        gmean = math.exp(centre)
        if n > 1:
            g_half = t * statistics.stdev(logs) / math.sqrt(n)
            g_low, g_high = math.exp(centre - g_half), math.exp(centre + g_half)
    return {
        "values": xs,
        "n": n,
        "mean": mean,
        "median": statistics.median(xs) if n else math.nan,
        "sd": sd,
        "ci_low": mean - half,
        "ci_high": mean + half,
        "gmean": gmean,
        "gci_low": g_low,
        "gci_high": g_high,
        "confidence": confidence,
    }


def judge_family(
    ref: Mapping[str, Sequence[float]],
    others: Mapping[str, Mapping[str, Sequence[float]]],
    figures: Sequence[Figure],
    margin_pct: float,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Every (codec, figure) of one point against the reference, Holm over the point; verdict dicts.

    Rounds pair when both sides have one value per round (same length), else Welch.
    """
    keys: list[tuple[str, Figure]] = []
    family: list[stats.PairStats | None] = []
    for codec, values in others.items():
        for fig in figures:
            a, b = list(ref.get(fig.key) or ()), list(values.get(fig.key) or ())
            if not a and not b:  # not measured at all (delivery switched off): no verdict, not in the family
                continue
            keys.append((codec, fig))
            if not a or not b:
                family.append(None)
                continue
            paired = len(a) == len(b)
            family.append(stats.compare_arms(a, b, paired=paired, confidence=CONFIDENCE))
    if not family:
        return {}
    verdicts = stats.judge(family, higher_is_better=[f.higher_is_better for _, f in keys], margin_pct=margin_pct)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (codec, fig), verdict in zip(keys, verdicts, strict=True):
        out.setdefault(codec, {})[fig.key] = verdict_dict(verdict)
    return out


# --- micro part -----------------------------------------------------------------------------------

# (codec, payload name, message, iterations, transport) → delivery p50 µs, or a string saying why not.
DeliveryFn = Callable[[str, str, Any, int, str], "float | str"]


def default_delivery() -> DeliveryFn:
    """``harness.delivery.measure``: its p50, or why there is none."""
    from harness import delivery

    def run(codec: str, payload: str, msg: Any, iterations: int, transport: str) -> float | str:
        try:
            result = delivery.measure(codec, transport, payload, msg, iterations=iterations)
        except Exception as exc:  # e.g. no room in /dev/shm for the arena: the curve is left out, nothing more
            return f"{type(exc).__name__}: {exc}"
        if result.status != "ok":
            return f"{result.status}: {result.reason}"
        return float(result.p50_us)

    return run


def micro_message(axis: Axis, value: float, kind: str = "image") -> tuple[str, Any]:
    """(payload name, message) of one payload-axis value, built from bench micro's payload helpers."""
    from harness import micro

    side = int(value)
    if axis.name == IMAGE_SIDE:
        if kind == "image":
            return f"image-{side}", micro.image_request(side)
        import torch

        dtype = torch.float16 if kind == "tensor-fp16" else torch.float32
        return f"{kind}-{side}", micro.tensor_request(dtype, side)
    if axis.name == PROMPT_LEN:
        req = micro.text_request()
        rng = random.Random(micro.SEED)
        req.prompt_token_ids = [rng.randrange(micro.VOCAB - 1) for _ in range(side)]
        return f"text-{side}", req
    raise ValueError(f"{axis.name} is not a payload axis")


def run_micro(
    codecs: Sequence[str],
    labels: Sequence[str],
    axis: Axis,
    *,
    kind: str,
    repeat: int,
    min_iterations: int,
    min_time_s: float,
    margin_pct: float,
    delivery: DeliveryFn | None,
    transports: Sequence[str] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The micro part: per payload value, ``repeat`` interleaved rounds of every codec (delivery over
    each label's transport, ``zmq`` when none are given)."""
    import torch

    from harness import micro

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    points = []
    try:
        for value in axis.values:
            payload, msg = micro_message(axis, value, kind)
            nbytes = micro.payload_nbytes(msg)
            memcpy: list[float] = []
            per: dict[str, dict[str, Any]] = {
                label: {
                    "status": "ok",
                    "reason": None,
                    "wire_bytes": None,
                    "frames": None,
                    "codec_us": [],
                    "delivery_us": [],
                }
                for label in labels
            }
            # An untimed pass first: the first calls on a new payload size pay for fresh pages and
            # allocator growth (a first round of a 3 MB image measured twice the later ones here).
            micro.time_memcpy(nbytes, 3, 0.0)
            for codec in codecs:
                micro.measure_cell(codec, payload, msg, 3, 0.0)
            for rnd in range(repeat):
                memcpy.append(micro.time_memcpy(nbytes, min_iterations, min_time_s).p50_us)
                order = list(zip(codecs, labels, transports or ["zmq"] * len(labels)))
                for codec, label, transport in order if rnd % 2 == 0 else order[::-1]:
                    row = per[label]
                    if row["status"] != "ok":
                        continue
                    cell = micro.measure_cell(codec, payload, msg, min_iterations, min_time_s)
                    if cell.status != "ok" or cell.encode is None or cell.decode is None:
                        row["status"], row["reason"] = cell.status, cell.reason
                        continue
                    row["wire_bytes"], row["frames"] = cell.wire_bytes, cell.frames
                    row["codec_us"].append(cell.encode.p50_us + cell.decode.p50_us)
                    if delivery is not None:
                        got = delivery(codec, payload, msg, max(10, min_iterations), transport)
                        if isinstance(got, float):
                            row["delivery_us"].append(got)
                        else:
                            row.setdefault("delivery_note", got)
            log(_micro_line(axis.text(value), nbytes, memcpy, per))
            ref = per[labels[0]]
            ref_values = {f.key: ref[f.key] for f in MICRO_FIGURES} if ref["status"] == "ok" else {}
            others = {
                label: {f.key: per[label][f.key] for f in MICRO_FIGURES}
                for label in labels[1:]
                if per[label]["status"] == "ok"
            }
            verdicts = judge_family(ref_values, others, MICRO_FIGURES, margin_pct) if ref_values else {}
            points.append(
                {
                    "at": {axis.name: value},
                    "payload": payload,
                    "payload_bytes": nbytes,
                    "memcpy_us": interval(memcpy),
                    "codecs": {
                        label: {
                            "status": row["status"],
                            "reason": row["reason"],
                            "wire_bytes": row["wire_bytes"],
                            "frames": row["frames"],
                            "delivery_note": row.get("delivery_note"),
                            "figures": {f.key: interval(row[f.key]) for f in MICRO_FIGURES},
                            "verdicts": verdicts.get(label, {}),
                        }
                        for label, row in per.items()
                    },
                }
            )
    finally:
        torch.set_num_threads(threads)
    return {
        "payload_kind": kind if axis.name == IMAGE_SIDE else "text",
        "repeat": repeat,
        "min_iterations": min_iterations,
        "min_time_s": min_time_s,
        "delivery": delivery is not None,
        "figures": [{"key": f.key, "label": f.label} for f in MICRO_FIGURES],
        "points": points,
    }


def _micro_line(where: str, nbytes: int, memcpy: list[float], per: dict[str, dict[str, Any]]) -> str:
    parts = [f"[micro] {where} ({nbytes:,} B): memcpy {statistics.median(memcpy):,.1f} µs"]
    for label, row in per.items():
        if row["status"] != "ok":
            parts.append(f"{label} {row['status']}")
            continue
        text = f"{label} {statistics.median(row['codec_us']):,.1f} µs"
        if row["delivery_us"]:
            text += f" (delivery {statistics.median(row['delivery_us']):,.1f})"
        parts.append(text)
    return "; ".join(parts)


# --- e2e part -------------------------------------------------------------------------------------


def point_args(args: argparse.Namespace, at: dict[str, float], folder: Path) -> argparse.Namespace:
    """bench run's flags for one grid point: its payload, its rate, its own result folder."""
    out = argparse.Namespace(**vars(args))
    if IMAGE_SIDE in at:
        side = int(at[IMAGE_SIDE])
        out.images_per_request, out.image_width, out.image_height = 1, side, side
    if PROMPT_LEN in at:
        out.sonnet_input_len = int(at[PROMPT_LEN])
    if REQUEST_RATE in at:
        out.request_rate = float(at[REQUEST_RATE])
    from harness.bench_run import chat_for_images

    chat_for_images(out)
    out.result_dir = str(folder)
    return out


def run_e2e_point(
    arms: list[Any], args: argparse.Namespace, axes: Sequence[Axis], at: dict[str, float], root: Path, base: Path
) -> tuple[dict[str, Any], bool]:
    """bench run at one grid point, its files under ``root/<point>``: (point dict, interrupted).

    Paths in the point dict are relative to ``base`` (the sweep document's folder), so a results folder can move.
    """
    from harness import bench_run
    from harness.loadgen.cli import check_endpoint, flags_dict, load_workload
    from harness.loadgen.runner import BenchmarkError, LoadSettings

    slug = point_slug(axes, at)
    folder = root / slug
    pargs = point_args(args, at, folder)
    point: dict[str, Any] = {
        "at": at,
        "label": point_label(axes, at),
        "folder": _relative(folder, base),
        "compare_file": None,
        "request_rate": None,
        "status": "ok",
        "message": "",
        "codecs": {},
        "compare": None,
    }
    print(f"\n========== sweep point {point['label']} ==========", flush=True)
    try:
        LoadSettings.from_args(argparse.Namespace(**{**vars(pargs), "request_rate": math.inf}))
        workload, tokenizer_id = load_workload(pargs)
        check_endpoint(workload, pargs.endpoint)
    except (ValueError, BenchmarkError, OSError) as exc:
        point["status"], point["message"] = "error", str(exc)
        print(f"bench sweep: {point['label']}: error: {exc}", file=sys.stderr)
        return point, False
    rate_note = bench_run.resolve_rate(arms, pargs, workload, tokenizer_id)
    if rate_note is None:
        point["status"], point["message"] = "error", "the capacity probe for --request-rate auto failed"
        return point, False
    point["request_rate"] = rate_note
    outcomes, interrupted = bench_run.run_rounds(arms, pargs, workload, tokenizer_id)
    arm_list, order = bench_run.build_arms(outcomes, arms)
    comparison, full = bench_run.judge_arms(arm_list, args.margin_pct)
    print(bench_run.format_report(arm_list, comparison))
    metadata = {"flags": _clean_flags(flags_dict(pargs)), "request_rate": rate_note, "sweep_point": at}
    doc = compare_document(full, folder=folder, metadata=metadata, repeat=pargs.repeat, order=order)
    if pargs.save_result and outcomes:
        path = folder / f"compare-{time.strftime('%Y%m%d-%H%M%S')}.json"
        write_json(path, doc, indent=2)
        point["compare_file"] = _relative(path, base)
    point["compare"] = doc
    verdicts = comparison_dict(comparison)["verdicts"] if comparison is not None else {}
    shown = [*E2E_FIGURES, *CODEC_FIGURES]
    for arm in arm_list:
        if arm.measured:
            status = "ok"
        else:  # unsupported (the codec cannot carry the payload), error, or not run (interrupted before it)
            status = next((r.status for r in arm.runs), "not run")
        point["codecs"][arm.label] = {
            "status": status,
            "message": next((r.message for r in arm.runs if r.message), ""),
            "figures": {f.key: interval(arm.values(f.key)) for f in shown},
            "verdicts": verdicts.get(arm.label, {}),
        }
    if interrupted:
        point["status"] = "interrupted"
    return point, interrupted


def _relative(path: Path, base: Path) -> str:
    return os.path.relpath(path, base)


def _clean_flags(flags: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in flags.items() if not k.startswith("sweep_")}


# --- crossings ------------------------------------------------------------------------------------


def _fmt_pct(v: dict[str, Any]) -> str:
    def p(x: Any) -> str:
        return f"{x:+.1f}%" if isinstance(x, (int, float)) and math.isfinite(x) else "?"

    return f"{p(v.get('change_pct'))} [{p(v.get('ci_low_pct'))}, {p(v.get('ci_high_pct'))}]"


def _where(axis: Axis, value: float, payload_bytes: dict[str, int]) -> str:
    text = axis.text(value)
    nbytes = payload_bytes.get(f"{value:g}")
    return f"{text} ({human_bytes(nbytes)})" if nbytes and axis.name in PAYLOAD_AXES else text


def human_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def find_crossings(
    points: Sequence[dict[str, Any]],
    *,
    part: str,
    labels: Sequence[str],
    figures: Sequence[Figure],
    along: Axis,
    series: Axis | None,
    payload_bytes: dict[str, int] | None = None,
) -> list[dict[str, Any]]:
    """Per codec x figure (x series), the first point along ``along`` where the verdict becomes slower/faster."""
    payload_bytes = payload_bytes or {}
    ref = labels[0]
    out = []
    series_values: list[float | None] = list(series.values) if series is not None else [None]
    for sv in series_values:
        line = [p for p in points if series is None or p["at"].get(series.name) == sv]
        line.sort(key=lambda p: p["at"][along.name])
        for label in labels[1:]:
            for fig in figures:
                seq: list[tuple[dict[str, Any], dict[str, Any] | None, str]] = []
                for p in line:
                    row = p["codecs"].get(label) or {}
                    verdict = (row.get("verdicts") or {}).get(fig.key)
                    if row.get("status") not in (None, "ok"):
                        seq.append((p, None, str(row.get("status"))))
                    else:
                        seq.append((p, verdict, (verdict or {}).get("verdict", "not measured")))
                entry = _crossing_entry(part, label, ref, fig, along, series, sv, seq, payload_bytes)
                if entry is not None:
                    out.append(entry)
    return out


def _crossing_entry(
    part: str,
    label: str,
    ref: str,
    fig: Figure,
    along: Axis,
    series: Axis | None,
    sv: float | None,
    seq: list[tuple[dict[str, Any], dict[str, Any] | None, str]],
    payload_bytes: dict[str, int],
) -> dict[str, Any] | None:
    if not seq:
        return None
    if all(v is None for _, v, _ in seq):
        return None  # never measured for this codec (unsupported everywhere, or the figure switched off)
    head = f"{label}, {fig.label}" + (f" at {series.text(sv)}" if series is not None and sv is not None else "")
    words = [w for _, _, w in seq]
    first = None
    for i, (p, v, w) in enumerate(seq):
        if w in ("slower", "faster"):
            first = (i, p, v, w)
            break
    span = f"{along.text(seq[0][0]['at'][along.name])} – {along.text(seq[-1][0]['at'][along.name])}"
    entry: dict[str, Any] = {
        "part": part,
        "codec": label,
        "figure": fig.key,
        "label": fig.label,
        "series": {series.name: sv} if series is not None and sv is not None else None,
        "verdict": None,
        "at": None,
        "change_pct": None,
        "ci_low_pct": None,
        "ci_high_pct": None,
        "verdicts": [{"at": p["at"], "verdict": w} for p, _, w in seq],
    }
    if first is None:
        counts: dict[str, int] = {}
        for w in words:
            counts[w] = counts.get(w, 0) + 1
        tally = ", ".join(f"{w} at {n} point{'s' if n > 1 else ''}" for w, n in counts.items())
        entry["text"] = f"{head}: no verdict against {ref} over {span} ({tally})"
        return entry
    i, p, v, w = first
    value = p["at"][along.name]
    assert v is not None
    where = _where(along, value, payload_bytes)
    if i == 0:
        text = f"{head}: {w} than {ref} from the first point, {where}, on: {_fmt_pct(v)}"
    else:
        before = ", ".join(f"{along.text(q['at'][along.name])} {ww}" for q, _, ww in seq[:i] if ww is not None)
        text = f"{head}: becomes {w} than {ref} at {where}: {_fmt_pct(v)} (before: {before})"
    after = seq[i + 1 :]
    if any(ww != w for _, _, ww in after):  # every later point, so a gap of "inconclusive" shows
        text += " (later: " + ", ".join(f"{along.text(q['at'][along.name])} {ww}" for q, _, ww in after) + ")"
    entry.update(
        {
            "verdict": w,
            "at": p["at"],
            "change_pct": v.get("change_pct"),
            "ci_low_pct": v.get("ci_low_pct"),
            "ci_high_pct": v.get("ci_high_pct"),
            "text": text,
        }
    )
    return entry


def all_crossings(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The crossings of both parts of a sweep document."""
    axes = [Axis(a["name"], tuple(a["values"])) for a in doc["axes"]]
    labels = doc["codecs"]
    if len(labels) < 2:
        return []
    payload_bytes = doc.get("payload_bytes") or {}
    out = []
    pax = payload_axis(axes)
    micro = doc.get("micro")
    if micro and pax is not None:
        out += find_crossings(
            micro["points"],
            part="micro",
            labels=labels,
            figures=MICRO_FIGURES,
            along=pax,
            series=None,
            payload_bytes=payload_bytes,
        )
    e2e = doc.get("e2e")
    if e2e:
        along = x_axis(axes)
        series = next((a for a in axes if a is not along), None)
        out += find_crossings(
            [p for p in e2e["points"] if p.get("codecs")],
            part="e2e",
            labels=labels,
            figures=E2E_FIGURES,
            along=along,
            series=series,
            payload_bytes=payload_bytes,
        )
    return out


# --- plots ----------------------------------------------------------------------------------------

# Inches per caption line at 8 pt, and characters per inch of figure width.
_LINE_IN = 0.145
_CHARS_PER_IN = 15


def _caption(lines: Sequence[str], width_in: float) -> str:
    wrapped: list[str] = []
    for line in lines:
        wrapped += textwrap.wrap(line, width=int(width_in * _CHARS_PER_IN), subsequent_indent="    ") or [""]
    return "\n".join(wrapped)


def fig_width(ncols: int) -> float:
    return max(7.5, 5.2 * ncols + 0.6)


def _figure(ncols: int, nrows: int, caption: str) -> tuple[Any, Any, tuple[float, float, float, float]]:
    """A figure with its caption at the bottom; lay it out with ``fig.tight_layout(rect=rect)`` once drawn."""
    plt = pyplot()
    width = fig_width(ncols)
    cap_h = (caption.count("\n") + 1) * _LINE_IN + 0.25 if caption else 0.0
    height = 4.0 * nrows + 0.7 + cap_h
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False)
    if caption:
        fig.text(0.01, 0.01, caption, ha="left", va="bottom", fontsize=8, family="monospace")
    return fig, axes, (0.0, (cap_h + 0.05) / height, 1.0, 1.0)


def _curve(
    ax: Any,
    points: Sequence[dict[str, Any]],
    label: str,
    key: str,
    x_of: Callable[[dict[str, Any]], float],
    color: Any,
    geometric: bool = False,
) -> bool:
    """One codec's means with t-interval error bars; a ring marks a verdict (slower or faster). False if empty.

    ``geometric`` (log y axes): the geometric mean and the t-interval of the log values.
    """
    names = ("gmean", "gci_low", "gci_high") if geometric else ("mean", "ci_low", "ci_high")
    xs, ys, lo, hi, rx, ry = [], [], [], [], [], []
    for p in sorted(points, key=x_of):
        row = p["codecs"].get(label) or {}
        if row.get("status", "ok") != "ok":
            continue
        fig = (row.get("figures") or {}).get(key) or {}
        mean = _finite(fig.get(names[0], fig.get("mean")))
        if mean is None or mean <= 0:
            continue
        low, high = _finite(fig.get(names[1])), _finite(fig.get(names[2]))
        xs.append(x_of(p))
        ys.append(mean)
        lo.append(max(0.0, mean - low) if low is not None else 0.0)
        hi.append(max(0.0, high - mean) if high is not None else 0.0)
        verdict = ((row.get("verdicts") or {}).get(key) or {}).get("verdict")
        if verdict in ("slower", "faster"):
            rx.append(xs[-1])
            ry.append(mean)
    if not xs:
        return False
    ax.errorbar(xs, ys, yerr=[lo, hi], fmt="-o", ms=4, capsize=3, color=color, label=label)
    if rx:
        ax.scatter(rx, ry, s=140, facecolors="none", edgecolors=color, linewidths=1.6)
    return True


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _top_labels(ax: Any, xs: Sequence[float], texts: Sequence[str]) -> None:
    from matplotlib.ticker import NullLocator

    sec = ax.secondary_xaxis("top")
    sec.set_xticks(list(xs), labels=list(texts))
    sec.xaxis.set_minor_locator(NullLocator())
    sec.tick_params(labelsize=7)


def _bytes_ticks(ax: Any, xs: Sequence[float]) -> None:
    """Ticks at the points' payload bytes (a log axis over less than a decade has no major tick)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.xaxis.set_major_locator(FixedLocator(sorted(set(xs))))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: human_bytes(x)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.tick_params(axis="x", labelsize=8)


def _short(axis: Axis, value: float) -> str:
    return f"{value:g}" + {IMAGE_SIDE: "px", PROMPT_LEN: "tok", REQUEST_RATE: "/s"}[axis.name]


def caption_for(doc: dict[str, Any], part: str) -> list[str]:
    ref = doc.get("reference", "the first codec")
    lines = [c["text"] for c in doc.get("crossings") or () if c["part"] == part]
    note = (
        f"Points: mean over rounds, bars: {CONFIDENCE:.0%} t-interval of the per-round values (on log axes: "
        f"geometric mean, t-interval of the logs); ring: a verdict against {ref} (Holm-adjusted p < 0.05 "
        "on the paired log ratios)."
    )
    return [note, *lines] if lines else [note, f"(one codec only: nothing to compare with {ref})"]


def draw_micro(doc: dict[str, Any]) -> Any | None:
    """Codec cost (and delivery) against payload bytes, log–log, with the memcpy line; None without micro points."""
    micro = doc.get("micro")
    if not micro or not micro.get("points"):
        return None
    axes_ = [Axis(a["name"], tuple(a["values"])) for a in doc["axes"]]
    pax = payload_axis(axes_)
    assert pax is not None
    points = sorted(micro["points"], key=lambda p: p["payload_bytes"])
    keys = [
        f
        for f in MICRO_FIGURES
        if any(((r.get("figures") or {}).get(f.key) or {}).get("n") for p in points for r in p["codecs"].values())
    ] or [MICRO_FIGURES[0]]
    ncols = len(keys)
    fig, grid_, rect = _figure(ncols, 1, _caption(caption_for(doc, "micro"), fig_width(ncols)))
    colors = arm_colors(doc["codecs"])
    xs = [p["payload_bytes"] for p in points]
    for ax, f in zip(grid_[0], keys, strict=True):
        ax.plot(xs, [p["memcpy_us"]["mean"] for p in points], "k--", lw=1.2, label="one memcpy of the same bytes")
        for label in doc["codecs"]:
            _curve(ax, points, label, f.key, lambda p: p["payload_bytes"], colors[label], geometric=True)
        ax.set_xscale("log")
        ax.set_yscale("log")
        _bytes_ticks(ax, xs)
        ax.set_xlabel("payload bytes per message")
        ax.set_ylabel("µs per message")
        ax.set_title(f.label, fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7)
        _top_labels(ax, xs, [_short(pax, p["at"][pax.name]) for p in points])
    kind = micro.get("payload_kind", "")
    fig.suptitle(
        f"bench sweep, micro: {kind} payloads, {micro.get('repeat')} interleaved rounds per point\n"
        f"(≥{micro.get('min_iterations')} calls and {micro.get('min_time_s')} s per measurement)",
        fontsize=10,
    )
    fig.tight_layout(rect=rect)
    return fig


def draw_e2e(doc: dict[str, Any]) -> Any | None:
    """TTFT p50/p99 and TPOT mean per codec along the rate (or payload) axis; one row per other-axis value."""
    e2e = doc.get("e2e")
    points = [p for p in (e2e or {}).get("points") or () if p.get("codecs")]
    if not points:
        return None
    axes_ = [Axis(a["name"], tuple(a["values"])) for a in doc["axes"]]
    along = x_axis(axes_)
    series = next((a for a in axes_ if a is not along), None)
    rows: list[float | None] = list(series.values) if series is not None else [None]
    payload_bytes = doc.get("payload_bytes") or {}
    ncols = len(E2E_FIGURES)
    fig, grid_, rect = _figure(ncols, len(rows), _caption(caption_for(doc, "e2e"), fig_width(ncols)))
    colors = arm_colors(doc["codecs"])
    by_payload = along.name in PAYLOAD_AXES

    def x_of(p: dict[str, Any]) -> float:
        value = float(p["at"][along.name])
        return float(payload_bytes.get(f"{value:g}", value)) if by_payload else value

    for r, sv in enumerate(rows):
        line = [p for p in points if series is None or p["at"].get(series.name) == sv]
        for c, f in enumerate(E2E_FIGURES):
            ax = grid_[r][c]
            means = [
                _finite(((p["codecs"][lb].get("figures") or {}).get(f.key) or {}).get("mean"))
                for p in line
                for lb in p["codecs"]
            ]
            finite = [m for m in means if m is not None and m > 0]
            log_y = bool(finite) and max(finite) / min(finite) > 20  # a knee spans decades
            for label in doc["codecs"]:
                _curve(ax, line, label, f.key, x_of, colors[label], geometric=log_y)
            if log_y:
                ax.set_yscale("log")
            ax.set_title(
                f.label + (f" — {series.text(sv)}" if series is not None and sv is not None else ""), fontsize=10
            )
            ax.set_ylabel("ms")
            ax.grid(True, which="both", alpha=0.25)
            if by_payload:
                ax.set_xscale("log")
                _bytes_ticks(ax, [x_of(p) for p in line])
                ax.set_xlabel("payload bytes per request")
                ordered = sorted(line, key=x_of)
                _top_labels(ax, [x_of(p) for p in ordered], [_short(along, p["at"][along.name]) for p in ordered])
            else:
                ax.set_xlabel(f"{along.label} ({along.unit})")
            if r == 0 and c == 0:
                ax.legend(fontsize=7)
    repeat = (e2e or {}).get("repeat")
    fig.suptitle(f"bench sweep, end to end: {repeat} interleaved rounds per point and codec", fontsize=10)
    fig.tight_layout(rect=rect)
    return fig


def save_plots(doc: dict[str, Any], stem: Path) -> list[Path]:
    """``<stem>-micro.png`` and ``<stem>-e2e.png`` (those that have points)."""
    plt = pyplot()
    written = []
    for part, draw in (("micro", draw_micro), ("e2e", draw_e2e)):
        fig = draw(doc)
        if fig is None:
            continue
        path = stem.with_name(f"{stem.name}-{part}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


# --- command --------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    from harness import bench_run

    bench_run.add_arguments(p)  # every bench run flag: workload, server, load, --repeat, --margin-pct
    p.set_defaults(codec=DEFAULT_CODECS)
    p._option_string_actions[
        "--codec"
    ].help = f"comma-separated codecs, the first is the reference (default {DEFAULT_CODECS}); as bench run's --codec"
    p._option_string_actions["--request-rate"].help = (
        "requests per second, 'inf', or 'auto' (bench run's default: half the capacity a probe measures, "
        "probed at every grid point); a --rates axis sets it per point"
    )
    g = p.add_argument_group("sweep axes and parts")
    g.add_argument("--image-sides", metavar="S,S,...", help="payload axis: one RGB image of S x S pixels per request")
    g.add_argument("--prompt-lens", metavar="N,N,...", help="payload axis: prompt tokens (--sonnet-input-len)")
    g.add_argument("--rates", metavar="R,R,...", help="rate axis: requests per second (finite)")
    g.add_argument(
        "--parts",
        default="micro,e2e",
        help="micro (codec cost vs payload bytes, payload axis only) and/or e2e (bench run per point); default both",
    )
    g.add_argument(
        "--micro-payload",
        choices=MICRO_KINDS,
        default="image",
        help="what the micro part sends per image side: the PIL image or a pixel tensor (default image)",
    )
    g.add_argument("--micro-repeat", type=int, default=5, help="interleaved rounds per micro point (default 5)")
    g.add_argument("--micro-min-iterations", type=int, default=50, help="calls per micro measurement (default 50)")
    g.add_argument(
        "--micro-min-time", type=float, default=0.1, metavar="S", help="seconds per micro measurement (default 0.1)"
    )
    g.add_argument(
        "--delivery",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="micro: also time delivery (encode → ZeroMQ ipc → decode in another process) where "
        "harness.delivery is there (default yes)",
    )
    g.add_argument(
        "--quick",
        action="store_true",
        help="tiny preset for tests: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()) + " (flags given win)",
    )
    for action in p._actions:  # --quick leaves alone what the command line sets
        if action.dest in QUICK:
            action.__class__ = _noting(type(action))


def _noting(base: type[argparse.Action]) -> type[argparse.Action]:
    """A subclass of an argparse action that notes, in ``sweep_explicit``, that the flag was given."""

    def call(self: argparse.Action, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        given = getattr(namespace, "sweep_explicit", None) or set()
        given.add(self.dest)
        namespace.sweep_explicit = given
        base.__call__(self, parser, namespace, values, option_string)

    return type(f"Noting{base.__name__}", (base,), {"__call__": call})


def apply_quick(args: argparse.Namespace) -> None:
    """--quick: the preset's values for the flags the command line did not give (no sides when an axis is given)."""
    given = getattr(args, "sweep_explicit", None) or set()
    axes_given = args.image_sides or args.prompt_lens or args.rates
    for key, value in QUICK.items():
        if key == "image_sides" and axes_given:
            continue
        if key not in given:
            setattr(args, key, value)


def parse_parts(text: str) -> set[str]:
    parts = {p.strip() for p in text.split(",") if p.strip()}
    bad = parts - {"micro", "e2e"}
    if bad or not parts:
        raise ValueError(f"--parts: expected micro and/or e2e, got {text!r}")
    return parts


def main(args: argparse.Namespace) -> int:
    from harness import bench_run
    from harness.loadgen.cli import flags_dict
    from harness.loadgen.runner import BenchmarkError
    from harness.loadgen.sysinfo import collect_sysinfo

    try:
        if args.quick:
            apply_quick(args)
        axes = build_axes(args)
        parts = parse_parts(args.parts)
        if payload_axis(axes) is None and parts == {"micro"}:
            raise ValueError("the micro part needs a payload axis (--image-sides or --prompt-lens)")
        if payload_axis(axes) is None:
            parts.discard("micro")
        arms = bench_run.parse_arms(args.codec, args.transport)
        args.extra_flags = bench_run.parse_arm_flags(args.arm_flags, arms)
        for flag, value in (("--repeat", args.repeat), ("--micro-repeat", args.micro_repeat)):
            if value < 1:
                raise ValueError(f"{flag} must be >= 1")
        if args.micro_min_iterations < 1 or not args.micro_min_time >= 0:
            raise ValueError("--micro-min-iterations must be >= 1 and --micro-min-time >= 0")
        if "e2e" in parts:
            bench_run.check_run_flags(args)
    except (ValueError, BenchmarkError) as exc:
        print(f"bench sweep: error: {exc}", file=sys.stderr)
        return 2

    started = time.monotonic()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = Path(args.result_dir)
    json_path = root / f"sweep-{stamp}.json"
    labels = [a.label for a in arms]
    pax = payload_axis(axes)
    payload_bytes: dict[str, int] = {}
    if pax is not None:
        from harness import micro

        for value in pax.values:
            payload_bytes[f"{value:g}"] = micro.payload_nbytes(micro_message(pax, value, args.micro_payload)[1])
    flags = {k: v for k, v in flags_dict(args).items() if k not in ("sweep_explicit", "extra_flags")}
    doc: dict[str, Any] = {
        "kind": "sweep",
        "schema_version": SWEEP_SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": "bench sweep " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "bench sweep",
        "codecs": labels,
        "reference": labels[0],
        "margin_pct": args.margin_pct,
        "axes": [a.to_dict() for a in axes],
        "payload_bytes": payload_bytes,
        "micro": None,
        "e2e": None,
        "crossings": [],
        "plots": [],
        "interrupted": False,
        "wall_s": None,
        "metadata": {**collect_sysinfo(), "flags": flags},
    }

    def save() -> None:
        doc["wall_s"] = time.monotonic() - started
        write_json(json_path, doc, indent=1)

    interrupted = False
    try:
        if "micro" in parts and pax is not None:
            print(f"bench sweep: micro part over {pax.label} {', '.join(f'{v:g}' for v in pax.values)}", flush=True)
            doc["micro"] = run_micro(
                [a.codec for a in arms],
                labels,
                pax,
                kind=args.micro_payload,
                repeat=args.micro_repeat,
                min_iterations=args.micro_min_iterations,
                min_time_s=args.micro_min_time,
                margin_pct=args.margin_pct,
                delivery=default_delivery() if args.delivery else None,
                transports=[a.transport for a in arms],
            )
            save()
        if "e2e" in parts:
            doc["e2e"] = {"repeat": args.repeat, "figures": [{"key": f.key, "label": f.label} for f in E2E_FIGURES]}
            doc["e2e"]["points"] = []
            folder = root / f"sweep-{stamp}"
            for at in grid(axes):
                point, interrupted = run_e2e_point(arms, args, axes, at, folder, root)
                doc["e2e"]["points"].append(point)
                save()
                if interrupted:
                    break
    except KeyboardInterrupt:
        interrupted = True
    doc["interrupted"] = interrupted
    doc["crossings"] = all_crossings(doc)
    doc["plots"] = [p.name for p in save_plots(jsonable(doc), root / f"sweep-{stamp}")]
    save()
    print(format_summary(doc))
    print(f"Sweep saved to {json_path}" + "".join(f"\nPlot saved to {root / name}" for name in doc["plots"]))
    print(f"bench sweep: wall time {doc['wall_s']:.1f} s", flush=True)
    if interrupted:
        return 130
    failed = any(
        p.get("status") == "error"
        or any(r.get("status") in ("failures", "error") for r in (p.get("compare") or {}).get("runs", ()))
        for p in (doc["e2e"] or {}).get("points", ())
    )
    return 1 if failed else 0


def format_summary(doc: dict[str, Any]) -> str:
    """The crossings in words, part by part (what the captions say)."""
    lines = ["", "=" * 20 + " Sweep: where codecs cross the reference " + "=" * 20]
    for part, title in (("micro", "codec cost and delivery (bench micro)"), ("e2e", "end to end (bench run)")):
        entries = [c for c in doc.get("crossings") or () if c["part"] == part]
        if not entries and not doc.get(part):
            continue
        lines.append(f"{title}:")
        lines += [f"  {c['text']}" for c in entries] or ["  (nothing to compare)"]
    return "\n".join(lines)
