#!/usr/bin/env python
"""The modelled GPU's idle time between engine steps, in series and with one step of overlap.

    .venv/bin/python scripts/studies/overlap/overlap.py --out results/baselines/overlap-sim.json

Two measurements, each in series (``--no-async-scheduling``) and overlapped (the default):

- decode: ``--batch`` requests decoding on the ``llama8b-h100`` step model, the engine core driven
  in this process (no sockets, no frontend): per step, the modelled GPU's idle gap before it (the
  host time not overlapped with the forward), its busy time, and the host's own time;
- serve: ``bench run`` at ``--rate`` req/s (one arm each way, interleaved with ``--arm-flags``):
  the GPU idle share each run file records (``metadata.engine.gpu_idle_ms / gpu_busy_ms``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.engine import device_thread
from harness.engine.config import EngineConfig
from harness.engine.core import EngineCore
from harness.wire.messages import EngineCoreRequest, SamplingParams


class _Probe:
    """Time the host spends blocked in StepHandle.wait (the rest of a step is its own work), and each
    step's modelled start and end as the device hands it back."""

    blocked_ns = 0
    spans: list[tuple[int, int]] = []

    @classmethod
    def install(cls) -> None:
        plain_wait, plain_finish = device_thread.StepHandle.wait, device_thread.StepHandle._finish

        def wait(self: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return plain_wait(self)
            finally:
                cls.blocked_ns += time.perf_counter_ns() - t0

        def finish(self: Any, result: Any, error: Any, start_ns: int, end_ns: int) -> None:
            cls.spans.append((start_ns, end_ns))
            plain_finish(self, result, error, start_ns, end_ns)

        device_thread.StepHandle.wait = wait  # type: ignore[method-assign]
        device_thread.StepHandle._finish = finish  # type: ignore[method-assign]


def decode(batch: int, steps: int, prompt_len: int, overlapped: bool) -> dict[str, Any]:
    cfg = EngineConfig(
        executor="sim",
        sim_step_model="llama8b-h100",
        async_scheduling=overlapped,
        vocab_size=4096,
        max_num_seqs=max(1024, batch),
        max_num_batched_tokens=2048,
        max_model_len=prompt_len + steps + 2048,  # decodes start while later prompts still fill
    )
    core = EngineCore(cfg)
    for i in range(batch):
        prompt = [(7 * i + j) % 4000 + 2 for j in range(prompt_len)]
        sp = SamplingParams(max_tokens=steps + 2000, ignore_eos=True)
        assert core.add_request(EngineCoreRequest(f"r{i}", None, prompt, sp, None, 0.0)) is None
    while core.last_step is None or core.last_step.prefills:  # every prompt in, then decodes only
        core.step()
    for _ in range(3):
        core.step()
    stats = core.device_stats()
    assert stats is not None
    before = stats.as_dict()
    blocked0, t0 = _Probe.blocked_ns, time.perf_counter_ns()
    _Probe.spans.clear()
    for _ in range(steps):
        core.step()
        assert core.last_step is not None and len(core.last_step.decodes) == batch and not core.last_step.prefills
    wall = time.perf_counter_ns() - t0
    blocked = _Probe.blocked_ns - blocked0
    after = stats.as_dict()
    d = {k: after[k] - before[k] for k in after}
    spans = sorted(_Probe.spans)
    gaps = sorted((b[0] - a[1]) / 1e6 for a, b in zip(spans, spans[1:]))
    return {
        "mode": "overlapped" if overlapped else "series",
        "batch": batch,
        "steps": d["steps"],
        "gpu_busy_ms_per_step": round(d["busy_ns"] / d["steps"] / 1e6, 3),
        "gpu_idle_ms_per_step": round(d["idle_ns"] / max(d["gaps"], 1) / 1e6, 3),
        "gpu_idle_ms_median_gap": round(statistics.median(gaps), 3),
        "gpu_idle_ms_p90_gap": round(gaps[int(0.9 * (len(gaps) - 1))], 3),
        "gpu_idle_share_of_busy": round(d["idle_ns"] / d["busy_ns"], 4),
        "host_ms_per_step": round((wall - blocked) / steps / 1e6, 3),
        "wall_ms_per_step": round(wall / steps / 1e6, 3),
        "sim_thread_late_ms_per_step": round(d["late_ns"] / d["steps"] / 1e6, 3),
    }


def serve(rate: float, prompts: int, repeat: int) -> list[dict[str, Any]]:
    """Both loops under ``bench run`` (sonnet, the seed's lengths and limits): each run file's GPU figures.

    Arm ``msgspec`` runs overlapped (the default), ``msgspec#2`` in series.
    """
    with tempfile.TemporaryDirectory(prefix="overlap-") as tmp:
        cmd = [
            *(sys.executable, "-m", "harness.cli", "run", "--codec", "msgspec,msgspec"),
            *("--arm-flags", "msgspec#2=--no-async-scheduling", "--repeat", str(repeat)),
            *("--executor", "sim", "--sim-step-model", "llama8b-h100", "--request-rate", str(rate)),
            *("--num-prompts", str(prompts), "--max-num-seqs", "1024", "--max-num-batched-tokens", "2048"),
            *("--sonnet-input-len", "516", "--sonnet-output-len", "150", "--sonnet-prefix-len", "200"),
            *("--workers", "2", "--no-progress", "--result-dir", tmp),
        ]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        out = []
        for path in sorted(Path(tmp).rglob("*.json")):
            doc = json.loads(path.read_text())
            meta = doc.get("metadata") if isinstance(doc, dict) else None
            engine = (meta or {}).get("engine") or {}
            if "gpu_busy_ms" not in engine:
                continue
            busy, idle = float(engine["gpu_busy_ms"]), float(engine["gpu_idle_ms"])
            out.append(
                {
                    "mode": "series" if path.name.startswith("msgspec#2") else "overlapped",
                    "file": path.name,
                    "gpu_busy_ms": round(busy, 1),
                    "gpu_idle_ms": round(idle, 1),
                    "gpu_idle_share_of_busy": round(idle / busy, 4),
                    "steps": engine.get("steps"),
                    **{k: _round(doc.get(k)) for k in SERVE_METRICS},
                    "client_limited": (doc.get("client") or {}).get("limited"),
                }
            )
        return out


SERVE_METRICS = ("request_throughput", "mean_ttft_ms", "median_ttft_ms", "mean_itl_ms", "median_itl_ms")


def _round(x: Any) -> Any:
    return round(x, 2) if isinstance(x, float) else x


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--prompt-len", type=int, default=550)
    p.add_argument("--rate", type=float, default=40.0)
    p.add_argument("--num-prompts", type=int, default=400)
    p.add_argument("--repeat", type=int, default=1, help="bench run rounds")
    p.add_argument("--decode-repeat", type=int, default=3, help="decode runs each way, alternating")
    p.add_argument("--no-serve", action="store_true", help="the decode measurement only")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    _Probe.install()
    rows = [
        decode(a.batch, a.steps, a.prompt_len, overlapped)
        for _ in range(a.decode_repeat)
        for overlapped in (False, True)
    ]
    for r in rows:
        print(json.dumps(r))
    result: dict[str, Any] = {
        "study": "overlap",
        "date": time.strftime("%Y-%m-%d"),
        "condition": "2-core VM, busy",
        "step_model": "llama8b-h100",
        # Medians over the runs each way.
        "decode": {
            mode: {
                k: statistics.median(r[k] for r in rows if r["mode"] == mode)
                for k in rows[0]
                if k not in ("mode", "batch", "steps")
            }
            for mode in ("series", "overlapped")
        },
        "decode_batch": a.batch,
        "decode_steps": a.steps,
        "decode_runs": rows,
    }
    if not a.no_serve:
        result["serve"] = {"rate": a.rate, "num_prompts": a.num_prompts, "runs": serve(a.rate, a.num_prompts, a.repeat)}
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
