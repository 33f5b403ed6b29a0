"""bench sweep (harness/commands/sweep.py, experiment/sweep.py, analysis/sweep_*.py): axes, intervals,
crossings in words, the micro part, the plots, and one tiny end-to-end sweep (real servers, sim executor).

No timing is asserted: synthetic per-round values go through the project's own
statistics (``sweep_stats.judge_family`` → ``harness.analysis.stats``), and the measured parts
are only checked for shape.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from scipy import stats as scipy_stats

from harness.analysis import sweep_grid, sweep_plots, sweep_stats
from harness.analysis.documents import SWEEP_SCHEMA, write_json
from harness.analysis.figures import E2E_FIGURES, MICRO_FIGURES
from harness.analysis.student_t import interval
from harness.analysis.sweep_grid import IMAGE_SIDE, REQUEST_RATE, Axis
from harness.cli import build_parser
from harness.commands import sweep
from harness.experiment import sweep as sweep_runs

PNG = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ a synthetic sweep document


def _rounds(rng: random.Random, mean: float, n: int = 4, noise: float = 0.01) -> list[float]:
    return [mean * math.exp(rng.gauss(0.0, noise)) for _ in range(n)]


def synthetic_sweep(two_axes: bool = False, seed: int = 1) -> dict[str, Any]:
    """A sweep document as bench sweep writes it, from made-up per-round values judged by harness.analysis.stats.

    Codec cost: msgspec-b64 ~3x pickle everywhere; msgspec-oob like pickle at small images, half of it from
    1024 px. End to end: msgspec-oob's TTFT p50 drops 20% at 1024 px; the rest is unchanged.
    """
    rng = random.Random(seed)
    sides = (64.0, 256.0, 1024.0)
    axes = [Axis(IMAGE_SIDE, sides)] + ([Axis(REQUEST_RATE, (5.0, 10.0))] if two_axes else [])
    labels = ["pickle", "msgspec-b64", "msgspec-oob"]
    payload_bytes = {f"{s:g}": int(s * s * 3 + 6000) for s in sides}
    micro_points = []
    for side in sides:
        nbytes = payload_bytes[f"{side:g}"]
        base = 50 + nbytes / 1500
        means = {"pickle": base, "msgspec-b64": 3 * base, "msgspec-oob": base * (0.5 if side >= 1024 else 1.0)}
        values = {
            c: {f.key: _rounds(rng, m * (1.5 if f.key == "delivery_us" else 1)) for f in MICRO_FIGURES}
            for c, m in means.items()
        }
        verdicts = sweep_stats.judge_family(values["pickle"], {c: values[c] for c in labels[1:]}, MICRO_FIGURES, 5.0)
        micro_points.append(
            {
                "at": {IMAGE_SIDE: side},
                "payload": f"image-{side:g}",
                "payload_bytes": nbytes,
                "memcpy_us": interval(_rounds(rng, nbytes / 20000)),
                "codecs": {
                    c: {
                        "status": "ok",
                        "reason": None,
                        "figures": {k: interval(v) for k, v in values[c].items()},
                        "verdicts": verdicts.get(c, {}),
                    }
                    for c in labels
                },
            }
        )
    e2e_points = []
    for at in sweep_grid.grid(axes):
        rate = at.get(REQUEST_RATE, 5.0)
        values = {}
        for c in labels:
            drop = 0.8 if c == "msgspec-oob" and at[IMAGE_SIDE] >= 1024 else 1.0
            values[c] = {
                "median_ttft_ms": _rounds(rng, 20 * rate * drop),
                "p99_ttft_ms": _rounds(rng, 40 * rate),
                "mean_tpot_ms": _rounds(rng, 3.0),
            }
        verdicts = sweep_stats.judge_family(values["pickle"], {c: values[c] for c in labels[1:]}, E2E_FIGURES, 5.0)
        e2e_points.append(
            {
                "at": at,
                "label": sweep_grid.point_label(axes, at),
                "status": "ok",
                "codecs": {
                    c: {
                        "status": "ok",
                        "figures": {k: interval(v) for k, v in values[c].items()},
                        "verdicts": verdicts.get(c, {}),
                    }
                    for c in labels
                },
            }
        )
    doc: dict[str, Any] = {
        "kind": "sweep",
        "schema_version": SWEEP_SCHEMA,
        "codecs": labels,
        "reference": "pickle",
        "margin_pct": 5.0,
        "axes": [a.to_dict() for a in axes],
        "payload_bytes": payload_bytes,
        "micro": {
            "payload_kind": "image",
            "repeat": 4,
            "min_iterations": 50,
            "min_time_s": 0.1,
            "delivery": True,
            "points": micro_points,
        },
        "e2e": {"repeat": 4, "points": e2e_points},
        "wall_s": 12.5,
        "metadata": {"python": "3.11", "flags": {"codec": ",".join(labels)}},
    }
    doc["crossings"] = sweep_stats.all_crossings(doc)
    return doc


# ------------------------------------------------------------------ axes, statistics, the preset


def test_axis_values_parse_sorted_and_checked() -> None:
    assert sweep_grid.parse_values("256, 64,1024", "--image-sides", True) == (64.0, 256.0, 1024.0)
    for bad in ("", "0", "64,x", "64,64", "-5", "inf"):
        with pytest.raises(ValueError):
            sweep_grid.parse_values(bad, "--rates", False)
    with pytest.raises(ValueError, match="whole number"):
        sweep_grid.parse_values("1.5", "--image-sides", True)


def test_axes_and_grid() -> None:
    args = build_parser(["sweep"])[0].parse_args(["sweep", "--image-sides", "64,128", "--rates", "5,10,20"])
    axes = sweep.build_axes(args)
    assert [a.name for a in axes] == [IMAGE_SIDE, REQUEST_RATE]
    assert sweep_grid.x_axis(axes).name == REQUEST_RATE  # e2e curves run along the rate: the saturation knee
    points = sweep_grid.grid(axes)
    assert len(points) == 6 and points[0] == {IMAGE_SIDE: 64.0, REQUEST_RATE: 5.0}
    assert sweep_grid.point_slug(axes, points[-1]) == "image-128-rate-20"
    for argv in (["sweep"], ["sweep", "--image-sides", "64", "--prompt-lens", "100"]):
        with pytest.raises(ValueError):
            sweep.build_axes(build_parser(argv)[0].parse_args(argv))


def test_help_prints(capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--image-sides" in out and "--quick" in out and "--micro-repeat" in out


def test_interval_is_the_t_interval_of_the_rounds() -> None:
    got = interval([1.0, 2.0, 3.0])
    assert got["mean"] == pytest.approx(2.0) and got["sd"] == pytest.approx(1.0)
    low, high = scipy_stats.t.interval(0.95, 2, loc=2.0, scale=1.0 / math.sqrt(3))
    assert (got["ci_low"], got["ci_high"]) == pytest.approx((low, high), rel=1e-9)
    logs = [0.0, math.log(2.0), math.log(3.0)]
    g_low, g_high = scipy_stats.t.interval(
        0.95, 2, loc=math.fsum(logs) / 3, scale=statistics.stdev(logs) / math.sqrt(3)
    )
    assert got["gmean"] == pytest.approx(6 ** (1 / 3))
    assert (got["gci_low"], got["gci_high"]) == pytest.approx((math.exp(g_low), math.exp(g_high)), rel=1e-9)
    one = interval([5.0, math.nan])
    assert one["n"] == 1 and math.isnan(one["ci_low"])


def test_quick_fills_only_the_flags_not_given() -> None:
    argv = ["sweep", "--quick", "--codec", sweep.DEFAULT_CODECS, "--repeat", "3"]
    args = build_parser(argv)[0].parse_args(argv)
    # --codec given equal to its default still counts as given.
    assert args.codec == sweep.DEFAULT_CODECS and args.repeat == 3
    assert args.num_prompts == 6 and args.executor == "sim"
    assert [a.values for a in sweep.build_axes(args)] == [(64.0, 128.0)]  # --quick's image sides
    argv = ["sweep", "--quick", "--rates", "5,10"]
    args = build_parser(argv)[0].parse_args(argv)
    assert [a.name for a in sweep.build_axes(args)] == [REQUEST_RATE] and args.codec == "pickle,msgspec-oob"
    argv = ["sweep", "--rates", "5,10"]
    args = build_parser(argv)[0].parse_args(argv)
    assert args.codec == sweep.DEFAULT_CODECS and args.repeat == 1  # no preset without --quick


# ------------------------------------------------------------------ crossings


def test_crossings_name_the_first_point_with_a_verdict() -> None:
    doc = synthetic_sweep()
    by = {(c["part"], c["codec"], c["figure"]): c for c in doc["crossings"]}
    b64 = by[("micro", "msgspec-b64", "codec_us")]
    assert b64["verdict"] == "slower" and b64["at"] == {IMAGE_SIDE: 64.0}
    assert "slower than pickle from the first point, image 64 px" in b64["text"]
    oob = by[("micro", "msgspec-oob", "codec_us")]
    assert oob["verdict"] == "faster" and oob["at"] == {IMAGE_SIDE: 1024.0}
    assert "becomes faster than pickle at image 1024 px (3.15 MB)" in oob["text"]
    assert "before: image 64 px equivalent, image 256 px equivalent" in oob["text"]
    ttft = by[("e2e", "msgspec-oob", "median_ttft_ms")]
    assert ttft["verdict"] == "faster" and ttft["change_pct"] == pytest.approx(-20, abs=3)
    tpot = by[("e2e", "msgspec-oob", "mean_tpot_ms")]
    assert tpot["verdict"] is None and tpot["text"].startswith("msgspec-oob, TPOT mean: no verdict against pickle")
    assert "pickle" not in {c["codec"] for c in doc["crossings"]}  # the reference is not judged against itself
    summary = sweep.format_crossings(doc)
    assert oob["text"] in summary and ttft["text"] in summary


def test_crossings_skip_points_a_codec_cannot_carry() -> None:
    doc = synthetic_sweep()
    for point in doc["micro"]["points"][:2]:
        point["codecs"]["msgspec-oob"] = {"status": "unsupported", "reason": "cannot carry X", "verdicts": {}}
    (oob,) = [c for c in sweep_stats.all_crossings(doc) if c["codec"] == "msgspec-oob" and c["figure"] == "codec_us"]
    assert oob["verdict"] == "faster" and "unsupported" in oob["text"]


# ------------------------------------------------------------------ the micro part, in process


@pytest.mark.slow
def test_micro_part_measures_rounds_and_judges(tmp_path: Path) -> None:
    calls: list[tuple[str, str]] = []

    def fake_delivery(codec: str, payload: str, msg: Any, iterations: int, transport: str) -> float | str:
        calls.append((codec, payload))
        return "unsupported: no" if codec == "msgspec-b64" else 100.0 + len(calls)

    axis = Axis(IMAGE_SIDE, (16.0, 32.0))
    part = sweep_runs.run_micro(
        ["pickle", "msgspec-b64", "msgspec"],
        ["pickle", "msgspec-b64", "msgspec"],
        axis,
        kind="image",
        repeat=3,
        min_iterations=5,
        min_time_s=0.0,
        margin_pct=5.0,
        delivery=fake_delivery,
        log=lambda _line: None,
    )
    assert [p["payload"] for p in part["points"]] == ["image-16", "image-32"]
    point = part["points"][1]
    assert point["payload_bytes"] == 32 * 32 * 3 + 8 * (550 + 576) + len("cmpl-") + 34 + 2048
    assert point["memcpy_us"]["n"] == 3
    pickle_row, b64_row, msgspec_row = (point["codecs"][c] for c in ("pickle", "msgspec-b64", "msgspec"))
    assert msgspec_row["status"] == "unsupported" and "cannot carry" in msgspec_row["reason"]
    assert pickle_row["figures"]["codec_us"]["n"] == 3 and pickle_row["figures"]["delivery_us"]["n"] == 3
    assert b64_row["figures"]["delivery_us"]["n"] == 0 and b64_row["delivery_note"].startswith("unsupported")
    assert set(b64_row["verdicts"]) == {"codec_us", "delivery_us"}
    assert b64_row["verdicts"]["delivery_us"]["verdict"] == "not comparable"
    assert ("msgspec", "image-16") not in calls  # an unsupported codec is not delivered either
    json.dumps(part, allow_nan=True)  # plain data


# ------------------------------------------------------------------ plots


def test_plots_carry_the_crossings_and_replot_from_a_saved_document(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    doc = synthetic_sweep()
    fig = sweep_plots.draw_e2e(doc)
    assert fig is not None
    assert len([ax for ax in fig.axes if ax.get_title()]) == 3  # TTFT p50, TTFT p99, TPOT mean
    caption = "\n".join(t.get_text() for t in fig.texts).replace("\n    ", " ")
    assert "ring: a verdict against pickle" in caption
    for crossing in (c for c in doc["crossings"] if c["part"] == "e2e"):
        assert crossing["text"] in caption
    plt.close(fig)
    # Two axes: one row per image side, the curves along the rate; drawn from the JSON as saved (NaN → null).
    path = write_json(tmp_path / "sweep-x.json", synthetic_sweep(two_axes=True))
    saved = json.loads(path.read_text())
    assert [c["text"] for c in sweep_stats.all_crossings(saved)] == [c["text"] for c in saved["crossings"]]
    written = sweep_plots.save_plots(saved, tmp_path / "sweep-x")
    assert [p.name for p in written] == ["sweep-x-micro.png", "sweep-x-e2e.png"]
    assert all(p.read_bytes().startswith(PNG) for p in written)


# ------------------------------------------------------------------ end to end


@pytest.mark.slow
def test_quick_sweep_end_to_end(tmp_path: Path) -> None:
    """bench sweep --quick (one e2e round to keep the suite short: 2 sides x 2 codecs = 4 servers)."""
    cmd = [sys.executable, "-m", "harness.cli", "sweep", "--quick", "--repeat", "1", "--result-dir", str(tmp_path)]
    done = subprocess.run([*cmd, "--no-progress"], capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (path,) = tmp_path.glob("sweep-*.json")
    doc = json.loads(path.read_text())
    assert doc["kind"] == "sweep" and doc["schema_version"] == 1
    assert doc["codecs"] == ["pickle", "msgspec-oob"] and doc["reference"] == "pickle"
    assert doc["axes"] == [{"name": "image_side", "label": "image side", "unit": "px", "values": [64.0, 128.0]}]
    assert [p["payload"] for p in doc["micro"]["points"]] == ["image-64", "image-128"]
    assert all(p["codecs"]["msgspec-oob"]["figures"]["codec_us"]["n"] == 3 for p in doc["micro"]["points"])
    points = doc["e2e"]["points"]
    assert [p["at"] for p in points] == [{"image_side": 64.0}, {"image_side": 128.0}]
    for point in points:
        assert point["status"] == "ok", point["message"]
        compare_file = tmp_path / point["compare_file"]
        assert compare_file.is_file() and point["compare"]["kind"] == "compare"
        assert [r["status"] for r in point["compare"]["runs"]] == ["ok", "ok"]
        for run in point["compare"]["runs"]:
            run_doc = json.loads((compare_file.parent / run["result_file"]).read_text())
            assert (
                run_doc["completed"] == 6 and run_doc["metadata"]["flags"]["image_width"] == point["at"]["image_side"]
            )
        figures = point["codecs"]["msgspec-oob"]["figures"]["median_ttft_ms"]
        assert figures["n"] == 1 and figures["mean"] > 0
    assert {c["part"] for c in doc["crossings"]} == {"micro", "e2e"}
    assert doc["plots"] == [f"{path.stem}-micro.png", f"{path.stem}-e2e.png"]
    assert all((tmp_path / name).read_bytes().startswith(PNG) for name in doc["plots"])
    assert "Sweep: where codecs cross the reference" in done.stdout and "wall time" in done.stdout
    for c in doc["crossings"]:
        assert c["text"] in done.stdout
    # The report takes the sweep and a point's compare file.
    from harness.analysis.html_report import build_report

    text = build_report([str(path), str(tmp_path / points[0]["compare_file"])])
    assert 'id="sweeps"' in text and text.count("data:image/png;base64,") >= 5
