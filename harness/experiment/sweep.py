"""The runs of a sweep: the micro part (codec cost and delivery per payload, interleaved rounds)
and the e2e part (the experiment flow at every grid point)."""

from __future__ import annotations

import os
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.analysis.figures import CODEC_FIGURES, E2E_FIGURES, MICRO_FIGURES
from harness.analysis.student_t import interval
from harness.analysis.sweep_grid import IMAGE_SIDE, PROMPT_LEN, REQUEST_RATE, Axis, point_label, point_slug
from harness.analysis.sweep_stats import judge_family
from harness.analysis.verdict_text import format_comparison
from harness.analysis.verdicts import comparison_dict
from harness.experiment.flow import prepare, run_experiment
from harness.experiment.settings import Experiment
from harness.loadgen.runner import BenchmarkError

MICRO_KINDS = ("image", "tensor-fp16", "tensor-fp32")


# (codec, payload name, message, iterations, transport) → delivery p50 µs, or a string saying why not.
DeliveryFn = Callable[[str, str, Any, int, str], "float | str"]


def default_delivery() -> DeliveryFn:
    """``harness.micro.delivery.measure``: its p50, or why there is none."""
    from harness.micro import delivery

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
    from harness.micro import payloads

    side = int(value)
    if axis.name == IMAGE_SIDE:
        if kind == "image":
            return f"image-{side}", payloads.image_request(side)
        import torch

        dtype = torch.float16 if kind == "tensor-fp16" else torch.float32
        return f"{kind}-{side}", payloads.tensor_request(dtype, side)
    if axis.name == PROMPT_LEN:
        req = payloads.text_request()
        rng = random.Random(payloads.SEED)
        req.prompt_token_ids = [rng.randrange(payloads.VOCAB - 1) for _ in range(side)]
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

    from harness.micro import payloads, timing

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    points = []
    try:
        for value in axis.values:
            payload, msg = micro_message(axis, value, kind)
            nbytes = payloads.payload_nbytes(msg)
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
            timing.time_memcpy(nbytes, 3, 0.0)
            for codec in codecs:
                timing.measure_cell(codec, payload, msg, 3, 0.0)
            for rnd in range(repeat):
                memcpy.append(timing.time_memcpy(nbytes, min_iterations, min_time_s).p50_us)
                order = list(zip(codecs, labels, transports or ["zmq"] * len(labels)))
                for codec, label, transport in order if rnd % 2 == 0 else order[::-1]:
                    row = per[label]
                    if row["status"] != "ok":
                        continue
                    cell = timing.measure_cell(codec, payload, msg, min_iterations, min_time_s)
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


def at_point(exp: Experiment, at: dict[str, float], folder: Path) -> Experiment:
    """The experiment of one grid point: its payload, its rate, its own result folder."""
    workload = exp.workload
    if IMAGE_SIDE in at:
        side = int(at[IMAGE_SIDE])
        workload = replace(workload, images_per_request=1, image_width=side, image_height=side)
    if PROMPT_LEN in at:
        workload = workload.with_options(sonnet_input_len=int(at[PROMPT_LEN]))  # --prompt-lens sets sonnet's
    point = replace(exp, workload=workload, plan=replace(exp.plan, result_dir=str(folder)))
    return point.at_rate(float(at[REQUEST_RATE])) if REQUEST_RATE in at else point


def run_e2e_point(
    exp: Experiment, axes: Sequence[Axis], at: dict[str, float], root: Path, base: Path
) -> tuple[dict[str, Any], bool]:
    """The experiment flow at one grid point, its files under ``root/<point>``: (point dict, interrupted).

    Paths in the point dict are relative to ``base`` (the sweep document's folder), so a results folder can move.
    """
    folder = root / point_slug(axes, at)
    point: dict[str, Any] = {
        "at": at,
        "label": point_label(axes, at),
        "folder": os.path.relpath(folder, base),
        "compare_file": None,
        "request_rate": None,
        "status": "ok",
        "message": "",
        "codecs": {},
        "compare": None,
    }
    print(f"\n========== sweep point {point['label']} ==========", flush=True)
    try:
        prepared = prepare(at_point(exp, at, folder))
    except (ValueError, BenchmarkError, OSError) as exc:
        point["status"], point["message"] = "error", str(exc)
        print(f"bench sweep: {point['label']}: error: {exc}", file=sys.stderr)
        return point, False
    result = run_experiment(prepared)
    if result is None:
        point["status"], point["message"] = "error", "the capacity probe for --request-rate auto failed"
        return point, False
    point["request_rate"] = result.rate_note
    print(format_comparison(result.arms, result.comparison))
    if result.experiment.plan.save_result and result.outcomes:
        path, doc = result.save("compare", folder, sweep_point=at)
        point["compare_file"] = os.path.relpath(path, base)
    else:
        doc = result.document(folder, sweep_point=at)
    point["compare"] = doc
    verdicts = comparison_dict(result.comparison)["verdicts"] if result.comparison is not None else {}
    shown = [*E2E_FIGURES, *CODEC_FIGURES]
    for arm in result.arms:
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
    if result.interrupted:
        point["status"] = "interrupted"
    return point, result.interrupted
