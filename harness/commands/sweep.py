"""``bench sweep``: where do codecs cross?  Curves over payload size and request rate.

A sweep runs a grid over one or two axes for a set of codecs (the first is the
reference) and draws crossover curves:

- payload axis, one of ``--image-sides 64,256,1024`` (one RGB image of side x side
  pixels per request) or ``--prompt-lens 128,550,2048`` (prompt tokens);
- rate axis, ``--rates 5,10,20,40`` (requests per second).

Two parts, each saved in the sweep document and drawn in its own PNG:

**micro** (payload axis only): bench micro's measurement per codec x payload,
repeated ``--micro-repeat`` times with the codec order reversed every other
round. A round's *codec cost* is encode p50 + decode p50 (``harness.micro``);
its *delivery* is encode, send → receive in another process over the arm's
transport (``--transport``: zmq ipc or the shm arena), decode
(``harness.micro.delivery.measure`` p50; ``--no-delivery`` skips it);
the physical reference is one memcpy of the payload's bytes (bytes as bench
micro counts them). Drawn on log–log axes against payload bytes.

**e2e**: at every grid point, ``bench run`` as it is (``harness.experiment.flow``:
a fresh server per codec and round, rounds interleaved, order reversed every
other round; every run file saved under ``<result-dir>/sweep-<stamp>/<point>/``
with the point's compare file beside them). Drawn: TTFT p50, TTFT p99 and
TPOT mean against the request rate (the saturation knee) or the payload bytes.

Statistics: each absolute figure is the mean over rounds with a 95% t-interval
of the per-round values (``harness.analysis.sweep_stats.interval``). Each codec is judged against the
reference at every point with ``harness.analysis.stats`` (paired log ratios over rounds,
Holm over the point's table: for e2e, ``harness.analysis.verdicts.compare``'s whole
table as ``bench run`` judges it; for micro, codec cost and delivery of every
codec). A *crossing* is the first grid point (in axis order) where a codec's
verdict becomes "slower" or "faster" than the reference (Holm-adjusted); the
sweep says so in words under each plot, in the PNG's caption and in the JSON.

Sweep document (``kind: "sweep"``, its schema version in ``harness.analysis.documents``)::

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
VERDICT = ``harness.analysis.verdicts.verdict_dict``. ``--quick`` is a tiny preset for the
test suite (2 image sides x 2 codecs, sim executor, 6 requests, 2 e2e rounds).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from harness.analysis.documents import SWEEP_SCHEMA, jsonable, write_json
from harness.analysis.figures import E2E_FIGURES
from harness.analysis.sweep_grid import IMAGE_SIDE, PROMPT_LEN, REQUEST_RATE, Axis, grid, parse_values, payload_axis
from harness.analysis.sweep_plots import save_plots
from harness.analysis.sweep_stats import all_crossings
from harness.experiment.flags import add_experiment_arguments, experiment_from_args
from harness.experiment.sweep import MICRO_KINDS, default_delivery, micro_message, run_e2e_point, run_micro
from harness.loadgen.flags import flags_dict
from harness.loadgen.runner import BenchmarkError
from harness.loadgen.sysinfo import collect_sysinfo
from harness.micro.payloads import payload_nbytes

DESCRIPTION = """\
Find where codecs cross: a grid over payload size (--image-sides or
--prompt-lens) and/or request rate (--rates), the first codec the reference.
The micro part times each codec's cost and delivery against payload bytes; the
e2e part runs bench run at every grid point. Each part is drawn in a PNG, the
first point where a codec turns slower or faster than the reference is said
in words, and everything is saved in one sweep document."""

EPILOG = """\
examples:
  bench sweep --parts micro --codec pickle,msgspec-b64,msgspec-oob --image-sides 64,256,1024
  bench sweep --codec pickle,msgspec --rates 5,10,20,40 --repeat 3
  bench sweep --quick      (a tiny sweep, to see it work)

exit codes: 0 done; 1 a point failed; 2 bad flags; 130 interrupted by Ctrl-C,
143 by SIGTERM (what finished is saved)."""


DEFAULT_CODECS = "pickle,msgspec-b64,msgspec-oob"
QUICK_IMAGE_SIDES = "64,128"  # --quick's axis when no axis is given
# --quick: the defaults it sets (harness.cli applies them before parsing, so flags given win).
QUICK: dict[str, Any] = {
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
PRESETS = {"--quick": QUICK}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_experiment_arguments(
        p,
        codec_default=DEFAULT_CODECS,
        codec_help="comma-separated codecs, the first is the reference (default %(default)s); as bench run's --codec",
        rate_help="requests per second, 'inf', or 'auto' (bench run's default: half the capacity a probe measures, "
        "probed at every grid point); a --rates axis sets it per point",
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
        help="micro: also time delivery (encode → ZeroMQ ipc → decode in another process) (default yes)",
    )
    g.add_argument(
        "--quick",
        action="store_true",
        help=f"tiny preset for tests: image sides {QUICK_IMAGE_SIDES} (when no axis is given), "
        + ", ".join(f"{k}={v}" for k, v in QUICK.items())
        + " (flags given win)",
    )


def build_axes(args: argparse.Namespace) -> list[Axis]:
    """The payload axis (if any) first, then the rate axis (if any)."""
    axes = []
    image_sides = args.image_sides
    if args.quick and not (image_sides or args.prompt_lens or args.rates):
        image_sides = QUICK_IMAGE_SIDES
    if image_sides and args.prompt_lens:
        raise ValueError("--image-sides and --prompt-lens are both payload axes: give one of them")
    if image_sides:
        axes.append(Axis(IMAGE_SIDE, parse_values(image_sides, "--image-sides", True)))
    if args.prompt_lens:
        axes.append(Axis(PROMPT_LEN, parse_values(args.prompt_lens, "--prompt-lens", True)))
    if args.rates:
        axes.append(Axis(REQUEST_RATE, parse_values(args.rates, "--rates", False)))
    if not axes:
        raise ValueError("nothing to sweep: give --image-sides, --prompt-lens and/or --rates (or --quick)")
    return axes


def parse_parts(text: str) -> set[str]:
    parts = {p.strip() for p in text.split(",") if p.strip()}
    bad = parts - {"micro", "e2e"}
    if bad or not parts:
        raise ValueError(f"--parts: expected micro and/or e2e, got {text!r}")
    return parts


def main(args: argparse.Namespace) -> int:
    try:
        axes = build_axes(args)
        parts = parse_parts(args.parts)
        if payload_axis(axes) is None and parts == {"micro"}:
            raise ValueError("the micro part needs a payload axis (--image-sides or --prompt-lens)")
        if payload_axis(axes) is None:
            parts.discard("micro")
        exp = experiment_from_args(args)
        for flag, value in (("--repeat", args.repeat), ("--micro-repeat", args.micro_repeat)):
            if value < 1:
                raise ValueError(f"{flag} must be >= 1")
        if args.micro_min_iterations < 1 or not args.micro_min_time >= 0:
            raise ValueError("--micro-min-iterations must be >= 1 and --micro-min-time >= 0")
        if "e2e" in parts:
            exp.check()
    except (ValueError, BenchmarkError) as exc:
        print(f"bench sweep: error: {exc}", file=sys.stderr)
        return 2

    started = time.monotonic()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = Path(args.result_dir)
    json_path = root / f"sweep-{stamp}.json"
    labels = [a.label for a in exp.arms]
    pax = payload_axis(axes)
    payload_bytes: dict[str, int] = {}
    if pax is not None:
        for value in pax.values:
            payload_bytes[f"{value:g}"] = payload_nbytes(micro_message(pax, value, args.micro_payload)[1])
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
        "metadata": {**collect_sysinfo(), "flags": flags_dict(args)},
    }

    def save() -> None:
        doc["wall_s"] = time.monotonic() - started
        write_json(json_path, doc, indent=1)

    interrupted = False
    try:
        if "micro" in parts and pax is not None:
            print(f"bench sweep: micro part over {pax.label} {', '.join(f'{v:g}' for v in pax.values)}", flush=True)
            doc["micro"] = run_micro(
                [a.codec for a in exp.arms],
                labels,
                pax,
                kind=args.micro_payload,
                repeat=args.micro_repeat,
                min_iterations=args.micro_min_iterations,
                min_time_s=args.micro_min_time,
                margin_pct=args.margin_pct,
                delivery=default_delivery() if args.delivery else None,
                transports=[a.transport for a in exp.arms],
            )
            save()
        if "e2e" in parts:
            doc["e2e"] = {"repeat": args.repeat, "figures": [{"key": f.key, "label": f.label} for f in E2E_FIGURES]}
            doc["e2e"]["points"] = []
            folder = root / f"sweep-{stamp}"
            for at in grid(axes):
                point, interrupted = run_e2e_point(exp, axes, at, folder, root)
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
    print(format_crossings(doc))
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


def format_crossings(doc: dict[str, Any]) -> str:
    """The crossings in words, part by part (what the captions say)."""
    lines = ["", "=" * 20 + " Sweep: where codecs cross the reference " + "=" * 20]
    for part, title in (("micro", "codec cost and delivery (bench micro)"), ("e2e", "end to end (bench run)")):
        entries = [c for c in doc.get("crossings") or () if c["part"] == part]
        if not entries and not doc.get(part):
            continue
        lines.append(f"{title}:")
        lines += [f"  {c['text']}" for c in entries] or ["  (nothing to compare)"]
    return "\n".join(lines)
