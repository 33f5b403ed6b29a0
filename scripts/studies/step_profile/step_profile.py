#!/usr/bin/env python
"""Ops dispatched, host syncs and wall time of real engine steps (scheduler + torch executor).

    .venv/bin/python scripts/studies/step_profile/step_profile.py --preset tiny --requests 64 --prompt-len 550

Three steps are measured, each as the scheduler builds it:
- prefill: ``--prefill-batch`` new requests' prompts in one step;
- decode: one token for each of ``--requests`` running requests;
- mixed: those decodes plus one new request's prompt (what most steps of a
  steady load look like).
Op and sync counts come from one step under ``harness.engine.opcount.OpCounter``;
times are medians over ``--iters`` steps without it. ``--stub-forward`` leaves out the
model's forward (fixed logits instead): what remains is the host's time.

``--forward-ms X`` measures instead the engine loop (``EngineCore``: schedule, launch, update)
over ``--iters`` decode steps of ``--requests`` requests, the forward stubbed to take X ms as a
GPU's would (a sleep on the device thread: the host is free meanwhile), in series and with one
step of overlap. In series the host's time per step is the step's wall time less X; overlapped,
the host time not hidden is the device thread's gap between one step's end and the next one's
start.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from harness.engine.config import EngineConfig
from harness.engine.core import EngineCore
from harness.engine.device import synchronize
from harness.engine.executor import TorchExecutor
from harness.engine.opcount import OpCounter
from harness.engine.scheduler import Scheduler
from harness.engine.step import SchedulerOutput
from harness.wire.messages import EngineCoreRequest, SamplingParams


def _request(i: int, prompt_len: int, max_tokens: int, vocab: int, params: dict) -> EngineCoreRequest:
    g = torch.Generator().manual_seed(i)
    ids = torch.randint(2, vocab, (prompt_len,), generator=g).tolist()
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **params)
    return EngineCoreRequest(f"r{i}", None, ids, sp, None, 0.0)


def _measure(
    name: str, build: Callable[[], SchedulerOutput], run: Callable[[SchedulerOutput], None], iters: int
) -> dict[str, Any]:
    sched = build()
    with OpCounter() as ops:
        run(sched)
    times = []
    for _ in range(iters):
        sched = build()
        t0 = time.perf_counter()
        run(sched)
        times.append(time.perf_counter() - t0)
    syncs = ", ".join(f"{k} x{v}" for k, v in ops.syncs.most_common()) or "none"
    ms = statistics.median(times) * 1e3 if times else float("nan")
    print(f"{name:<8} {sched.total_num_tokens:>6} tokens  {ops.num_ops:>6} ops  {ms:8.2f} ms   syncs: {syncs}")
    return {"tokens": sched.total_num_tokens, "ops": ops.num_ops, "median_ms": round(ms, 3), "syncs": syncs}


def _save(path: Path, label: str, args: dict[str, Any], steps: dict[str, Any]) -> None:
    """Add this run to ``path`` under ``label`` (a before/after pair lives in one file)."""
    doc: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"study": "step_profile"}
    doc.setdefault("runs", {})[label] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpus": os.cpu_count(), "torch": torch.__version__},
        "args": args,
        "steps": steps,
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")


def _stub_forward(ex: TorchExecutor, max_rows: int) -> None:
    """The model's forward as a slice of fixed logits: the step keeps its staging, embedding and sampling."""
    logits = torch.randn(max_rows, ex.model_config.vocab_size, generator=torch.Generator().manual_seed(0))
    logits = logits.to(ex.device)

    def forward_step(x: torch.Tensor, batch: object, rows: torch.Tensor | None = None) -> torch.Tensor:
        return logits[: x.shape[0] if rows is None else rows.shape[0]]

    ex.model.forward_step = forward_step  # type: ignore[method-assign]


def _sleeping_forward(ex: TorchExecutor, max_rows: int, forward_ms: float) -> None:
    """``_stub_forward`` that also takes ``forward_ms``, as a device's forward would, without the CPU."""
    _stub_forward(ex, max_rows)
    fixed = ex.model.forward_step

    def forward_step(x: torch.Tensor, batch: Any, rows: torch.Tensor | None = None) -> torch.Tensor:
        time.sleep(forward_ms / 1e3)
        return fixed(x, batch, rows)

    ex.model.forward_step = forward_step  # type: ignore[method-assign]


def _loop(cfg: EngineConfig, a: argparse.Namespace, overlapped: bool) -> dict[str, Any]:
    """Decode steps of ``--requests`` requests through the engine loop, the forward taking --forward-ms."""
    cfg = dataclasses.replace(cfg, async_scheduling=overlapped, overlap_on_cpu=True)  # the forward only sleeps
    core = EngineCore(cfg)
    assert isinstance(core.executor, TorchExecutor) and core.overlapped is overlapped
    _sleeping_forward(core.executor, cfg.max_num_batched_tokens, a.forward_ms)
    for i in range(a.requests):
        sp = {"temperature": a.temperature, **({"seed": i} if a.seeded else {})}
        core.add_request(_request(i, a.prompt_len, 900, a.vocab, sp))
    while core.scheduler.num_waiting or (core.last_step is None or core.last_step.prefills):
        core.step()
    for _ in range(3):  # two steps in flight settle
        core.step()
    walls, spans = [], []
    for _ in range(a.iters):
        t0 = time.perf_counter()
        core.step()
        walls.append((time.perf_counter() - t0) * 1e3)
        if core.device_span is not None:
            spans.append(core.device_span)
    out: dict[str, Any] = {"decode_rows": core.last_step.total_num_tokens if core.last_step else 0}
    if overlapped:
        gaps = [(b[0] - a_[1]) / 1e6 for a_, b in zip(spans, spans[1:], strict=False)]
        out |= {
            "not_hidden_ms_median": round(statistics.median(gaps), 3),
            "not_hidden_ms_mean": round(statistics.mean(gaps), 3),
            "not_hidden_ms_p90": round(sorted(gaps)[int(0.9 * (len(gaps) - 1))], 3),
            "step_wall_ms_median": round(statistics.median(walls), 3),
        }
        print(
            f"overlapped  {out['decode_rows']} rows: host time not hidden per step median "
            f"{out['not_hidden_ms_median']:.3f} ms, mean {out['not_hidden_ms_mean']:.3f}, "
            f"p90 {out['not_hidden_ms_p90']:.3f} (step {out['step_wall_ms_median']:.2f} ms)"
        )
    else:
        host = [w - a.forward_ms for w in walls]
        out |= {
            "host_ms_median": round(statistics.median(host), 3),
            "host_ms_mean": round(statistics.mean(host), 3),
            "step_wall_ms_median": round(statistics.median(walls), 3),
        }
        print(
            f"in series   {out['decode_rows']} rows: host time per step median {out['host_ms_median']:.3f} ms, "
            f"mean {out['host_ms_mean']:.3f} (step {out['step_wall_ms_median']:.2f} ms)"
        )
    core.executor.device_thread.stop()
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--requests", type=int, default=64, help="running requests in the decode step")
    p.add_argument("--prefill-batch", type=int, default=4, help="new requests prefilled in the prefill step")
    p.add_argument("--prompt-len", type=int, default=550)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seeded", action="store_true", help="every request has its own sampling seed")
    p.add_argument("--compile", action="store_true")
    p.add_argument(
        "--stub-forward",
        action="store_true",
        help="replace the model's forward with fixed random logits: what is left is the host's step time",
    )
    p.add_argument(
        "--forward-ms",
        type=float,
        help="measure the engine loop in series and overlapped instead, the forward stubbed to take this long",
    )
    p.add_argument("--out", type=Path, help="also write the step times to this JSON file, under --label")
    p.add_argument("--label", default="run", help="the run's name in --out (e.g. before, after)")
    a = p.parse_args(argv)
    cfg = EngineConfig(
        model_preset=a.preset,
        device=a.device,
        dtype=a.dtype,
        vocab_size=a.vocab,
        num_threads=a.threads,
        max_num_seqs=a.requests + a.prefill_batch * (a.iters + 2) + 2,
        max_num_batched_tokens=max(a.prompt_len * a.prefill_batch, a.prompt_len * 4) + a.requests + 1,
        max_model_len=a.prompt_len + 1000,
        kv_cache_tokens=(a.requests + a.prefill_batch * (a.iters + 2) + 2) * (a.prompt_len + 1000),
        long_prefill_token_threshold=a.prompt_len,
    )
    if a.compile:  # a field since the GPU-path work; set after construction so older trees still run this script
        cfg.compile = True
    if a.forward_ms is not None:
        print(f"{a.preset}, {a.requests} decoding, forward stubbed to {a.forward_ms} ms, {a.iters} steps")
        loops = {"series": _loop(cfg, a, False), "overlapped": _loop(cfg, a, True)}
        if a.out:
            _save(a.out, a.label, {k: v for k, v in vars(a).items() if k not in ("out", "label")}, loops)
        return
    ex = TorchExecutor(cfg)
    if a.stub_forward:
        _stub_forward(ex, cfg.max_num_batched_tokens)
    print(
        f"{a.preset} on {ex.device} ({ex.dtype}, {torch.get_num_threads()} threads), torch {torch.__version__}, "
        f"{a.requests} decoding, prompts of {a.prompt_len}"
    )
    params: dict = {"temperature": a.temperature}
    counter = iter(range(10**9))

    def run(s: SchedulerOutput) -> None:
        ex.execute(s)
        synchronize(ex.device)

    # The prefill step: --prefill-batch fresh requests alone.
    def prefill_step() -> SchedulerOutput:
        sch = Scheduler(cfg)
        for _ in range(a.prefill_batch):
            i = next(counter)
            sp = dict(params, seed=i) if a.seeded else params
            sch.add_request(_request(i, a.prompt_len, 900, a.vocab, sp))
        out = sch.schedule()
        prefill_step.last = (sch, out)  # type: ignore[attr-defined]
        return out

    steps = {"prefill": _measure("prefill", prefill_step, run, a.iters)}

    # Bring --requests requests into decode.
    sch = Scheduler(cfg)
    for _ in range(a.requests):
        i = next(counter)
        sp = dict(params, seed=i) if a.seeded else params
        sch.add_request(_request(i, a.prompt_len, 900, a.vocab, sp))
    while True:
        out = sch.schedule()
        res = ex.execute(out)
        sch.update_from_output(out, res)
        if not out.prefills:
            break

    def decode_step() -> SchedulerOutput:
        out = sch.schedule()
        decode_step.pending = out  # type: ignore[attr-defined]
        return out

    def run_decode(s: SchedulerOutput) -> None:
        sch.update_from_output(s, ex.execute(s))
        synchronize(ex.device)

    steps["decode"] = _measure("decode", decode_step, run_decode, a.iters)

    def mixed_step() -> SchedulerOutput:
        i = next(counter)
        sp = dict(params, seed=i) if a.seeded else params
        sch.add_request(_request(i, a.prompt_len, 900, a.vocab, sp))
        return sch.schedule()

    steps["mixed"] = _measure("mixed", mixed_step, run_decode, a.iters)
    if a.out:
        _save(a.out, a.label, {k: v for k, v in vars(a).items() if k not in ("out", "label")}, steps)


if __name__ == "__main__":
    main()
