"""The seed step of scripts/gpu_check.sh, read back: figures per arm, verdicts, problems.

    python scripts/gpu_check_seed.py RESULT_DIR [--device cuda|cpu]

Reads the newest compare file in RESULT_DIR, its run files and any request traces, prints
a short summary and writes RESULT_DIR/summary.json. Exits 1 when the step did not run as it
should (no round completed, a run failed or lost requests, an engine on another device),
0 otherwise: the targets below are reported, not judged. Standard library only, so it runs in
whatever Python the GPU host has.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
from typing import Any

# The seed's figures (docs/seed.md): 1,000 prompts at 40 req/s served in 29.39 s; mean TPOT and
# median ITL bounds a GPU run should meet to be read beside it; and the GPU's idle time between
# steps, where the engine timed it with CUDA events (engine info ``device_time``).
TARGETS = {"duration": 29.4, "mean_tpot_ms": 30.0, "median_itl_ms": 22.0, "gpu_idle_per_step_ms": 0.5}
FIGURES = ("duration", "request_throughput", "mean_ttft_ms", "mean_tpot_ms", "median_itl_ms")
ENGINE_FIGURES = ("preemptions", "prefix_cache_hit_pct", "steps", "gpu_busy_ms", "gpu_idle_ms")


def load_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def step_ms(trace_paths: list[str]) -> dict[str, float]:
    """p50/p99 wall ms of the engine's steps ("step" slices) over the given Chrome traces."""
    durations: list[float] = []
    for path in trace_paths:
        try:
            doc = load_json(path)
        except (OSError, ValueError):
            continue
        events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
        durations += [e["dur"] / 1e3 for e in events if e.get("name") == "step" and e.get("ph") == "X" and "dur" in e]
    if not durations:
        return {}
    durations.sort()
    return {
        "steps_traced": len(durations),
        "step_p50_ms": round(durations[len(durations) // 2], 3),
        "step_p99_ms": round(durations[min(len(durations) - 1, int(len(durations) * 0.99))], 3),
    }


def arm_summary(folder: str, arm: str, runs: list[dict[str, Any]], device: str, bad: list[str]) -> dict[str, Any]:
    """Medians over the arm's completed rounds, and what went wrong in the others."""
    docs: list[dict[str, Any]] = []
    cut: list[dict[str, Any]] = []  # rounds cut by the time budget: shown only when none completed
    for run in runs:
        status = run.get("status")
        if status == "interrupted":
            if run.get("result_file"):
                cut.append(load_json(os.path.join(folder, run["result_file"])))
            continue
        if status != "ok":
            bad.append(f"{arm} round {run.get('round')}: {status} {run.get('message') or ''}".rstrip())
            continue
        doc = load_json(os.path.join(folder, run["result_file"]))
        engine = (doc.get("metadata") or {}).get("engine") or {}
        if str(engine.get("device", device)).split(":")[0] != device:
            bad.append(f"{arm}: the engine ran on {engine.get('device')}, not {device}")
        if doc.get("failed"):
            bad.append(f"{arm} round {run.get('round')}: {doc['failed']} requests failed")
        docs.append(doc)
    out: dict[str, Any] = {"rounds": len(docs)}
    if not docs:
        bad.append(f"{arm}: no round completed in the time given")
        if not cut:
            return out
        docs, out["interrupted_round_shown"] = cut, True  # what the cut round served, marked as such
    for key in FIGURES:
        out[key] = median([float(d[key]) for d in docs if isinstance(d.get(key), (int, float))])
    engines = [(d.get("metadata") or {}).get("engine") or {} for d in docs]
    for key in ENGINE_FIGURES:
        out[key] = median([float(e[key]) for e in engines if isinstance(e.get(key), (int, float))])
    graphs = engines[0].get("cuda_graphs") if engines else None  # the engine's info, sent as it started
    if isinstance(graphs, dict) and graphs.get("enabled"):
        out["cuda_graphs_captured"] = graphs.get("captured") or []
        if graphs.get("error"):
            out["cuda_graphs_error"] = graphs["error"]
    elif isinstance(graphs, str) and graphs:  # a run file's: the label, e.g. "4 batch sizes captured, up to 8"
        out["cuda_graphs"] = graphs
        for key in ("cuda_graph_replays", "cuda_graph_eager_steps"):  # the run's counts, where scraped
            counts = [float(e[key]) for e in engines if isinstance(e.get(key), (int, float))]
            if counts:
                out[key] = median(counts)
    if out.get("steps") and out.get("duration"):
        out["step_interval_ms"] = 1e3 * out["duration"] / out["steps"]  # the run's wall time a step
    if engines and engines[0].get("device_time") == "cuda-events" and out.get("steps"):
        out["gpu_idle_per_step_ms"] = (out.get("gpu_idle_ms") or 0.0) / out["steps"]
    out.update(step_ms(sorted(glob.glob(os.path.join(folder, f"trace*-{arm}-r*.json")))))
    if not out.get("interrupted_round_shown"):  # a cut round served part of the workload: no targets
        judged = {k: v for k, v in TARGETS.items() if k != "gpu_idle_per_step_ms" or k in out}  # timed on CUDA
        out["targets"] = {k: out.get(k) is not None and out[k] <= limit for k, limit in judged.items()}
    # What the targets are read against: the seed served its 1,000 prompts in 29.39 s.
    out["completed"] = median([float(d["completed"]) for d in docs if isinstance(d.get("completed"), (int, float))])
    return out


def fmt(value: Any, spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--device", default="cuda", help="where the engines must have run (default cuda)")
    args = parser.parse_args()
    bad: list[str] = []
    compares = sorted(glob.glob(os.path.join(args.folder, "compare-*.json")))
    if not compares:
        print(f"  seed problem: no compare file in {args.folder} (bench run did not finish a round)")
        return 1
    compare = load_json(compares[-1])
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for run in compare.get("runs", []):
        by_arm.setdefault(str(run.get("codec") or run.get("arm")), []).append(run)
    arms = {arm: arm_summary(args.folder, arm, runs, args.device, bad) for arm, runs in by_arm.items()}
    if not arms:
        bad.append("the compare file records no runs")
    for arm, s in arms.items():
        idle = ""
        if s.get("gpu_busy_ms") and s.get("gpu_idle_ms") is not None:
            share = f"{s['gpu_idle_ms'] / s['gpu_busy_ms']:.1%} of its busy time"
            if "gpu_idle_per_step_ms" in s:  # CUDA events on the GPU's stream
                idle = f", GPU idle between steps {s['gpu_idle_per_step_ms']:.3f} ms a step ({share})"
            else:
                idle = f", device thread idle {share}"
        steps = (
            f", step p50/p99 {fmt(s.get('step_p50_ms'))}/{fmt(s.get('step_p99_ms'))} ms" if "step_p50_ms" in s else ""
        )
        rounds = f"{s['rounds']} rounds" + (" (a cut round's figures)" if s.get("interrupted_round_shown") else "")
        print(
            f"  seed {arm}: {rounds}; served {fmt(s.get('request_throughput'))} req/s in "
            f"{fmt(s.get('duration'), '.1f')} s; TTFT mean {fmt(s.get('mean_ttft_ms'), '.1f')} ms, TPOT mean "
            f"{fmt(s.get('mean_tpot_ms'))} ms, ITL p50 {fmt(s.get('median_itl_ms'))} ms; preemptions "
            f"{fmt(s.get('preemptions'), '.0f')}, prefix-cache hits {fmt(s.get('prefix_cache_hit_pct'), '.1f')}%; "
            f"{fmt(s.get('step_interval_ms'))} ms of wall time a step{steps}{idle}"
        )
        if "cuda_graphs_captured" in s:
            sizes = s["cuda_graphs_captured"]
            shown = f"{len(sizes)} batch sizes, {sizes[0]} to {sizes[-1]} rows" if sizes else "no batch size"
            failed = f"; the capture failed: {s['cuda_graphs_error']}" if s.get("cuda_graphs_error") else ""
            print(f"    CUDA graphs (--cuda-graphs): decode steps captured for {shown}{failed}")
        elif "cuda_graphs" in s:
            counts = ""
            if "cuda_graph_replays" in s or "cuda_graph_eager_steps" in s:
                counts = (
                    f"; {fmt(s.get('cuda_graph_replays'), '.0f')} decode steps replayed a graph, "
                    f"{fmt(s.get('cuda_graph_eager_steps'), '.0f')} ran eagerly"
                )
            print(f"    CUDA graphs (--cuda-graphs): {s['cuda_graphs']}{counts}")
        if "targets" in s and args.device == "cuda":
            met = ", ".join(f"{k} ≤ {TARGETS[k]}: {'met' if ok else 'missed'}" for k, ok in s["targets"].items())
            print(f"    targets (the seed's): {met}")
    comparison = compare.get("comparison") or {}
    labels = {f.get("key"): f.get("label") for f in comparison.get("figures") or []}
    verdicts: dict[str, str] = {}
    for arm, figures in (comparison.get("verdicts") or {}).items():
        for key, v in figures.items():
            judged = "not judged" not in str(v.get("text"))  # secondaries count once the primary resolved
            if v.get("role") == "primary" or (key in ("mean_tpot_ms", "median_chunk_itl_ms") and judged):
                said = f"{labels.get(key, key)}{' (primary)' if v.get('role') == 'primary' else ''}: {v.get('text')}"
                verdicts[arm] = f"{verdicts[arm]}; {said}" if arm in verdicts else said
    for arm, text in verdicts.items():
        print(f"  seed verdict {arm} against {comparison.get('reference')}: {text}")
    for b in dict.fromkeys(bad):
        print(f"  seed problem: {b}")
    summary = {"compare_file": os.path.basename(compares[-1]), "arms": arms, "verdicts": verdicts, "problems": bad}
    with open(os.path.join(args.folder, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
