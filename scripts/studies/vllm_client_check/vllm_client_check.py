#!/usr/bin/env python
"""Our client against the seed's own: vLLM 0.6.4's benchmark_serving.py on the seed preset's server.

    .venv/bin/python scripts/studies/vllm_client_check/vllm_client_check.py --vllm-benchmarks DIR --vllm-python PY \\
        [--seeds 21,22,23,24] [--out results/baselines/seed-10245-vllm-client.json]

DIR holds ``benchmark_serving.py`` and ``backend_request_func.py`` from vLLM's 0.6.4 source
release, unmodified (as it stood three days after the PR merged: the seed's command's client), and PY is
a Python with what they import (aiohttp, datasets, pillow, transformers with jinja2, tqdm, numpy); vLLM itself
must not be importable there, so the script falls back to its own helpers. Getting both:

    curl -O https://files.pythonhosted.org/packages/44/2f/6694c547202333dcbd2c2e08a7e1fc04f7db7dc44d32ba6fbd51a38bc10e/vllm-0.6.4.tar.gz
    echo "5d1452c44e6fde35084219a8396a79c77f1202a6fc69fdb966d15a1a8933b762  vllm-0.6.4.tar.gz" | sha256sum -c
    tar xzf vllm-0.6.4.tar.gz vllm-0.6.4/benchmarks          # DIR = vllm-0.6.4/benchmarks
    python3 -m venv /tmp/vb && /tmp/vb/bin/pip install aiohttp datasets jinja2 pillow transformers tqdm

For each seed, each client in turn (the first one alternating) drives a fresh ``bench serve`` with
the preset's engine and a trace file: the preset's workload settings, the same sonnet file and a HF copy
of the project's tokenizer whose chat template renders as the server's. From the server's trace it
takes when each request arrived (the vLLM client's one test request, sent first, left out), when its
first chunk was written, and when the engine's steps began; each client's figures are set beside
what the server saw in the same run. The two clients plan their own arrival schedules from the seed
(``bench load`` sends on an absolute schedule, benchmark_serving sleeps each gap after the last send),
so a run's arrival span is compared with its own client's plan.

Definitions differ where the clients do:
- TTFT: vLLM 0.6.4's client stops it at the first chunk whose text is not empty; the server writes a
  chunk per token, empty while a token's text is held back (part of a UTF-8 character) or special.
  ``empty_chunk_share`` is the share of the 150 tokens a vLLM run saw no text for, and
  ``ttft_late_from_empty_est_ms`` that share times the step interval: what such first chunks add to
  its mean TTFT if the first token is as likely to be empty as any (an estimate, not a measurement).
- TPOT: vLLM 0.6.4 counts a request's output tokens by re-tokenizing its text (calculate_metrics),
  which on the ``sim`` executor's random tokens gives more than the 150 sent. ``tpot`` for it is the
  sum of its gaps / 149 (first to last chunk with text); ours is (latency − TTFT) / 149, to the
  stream's end. ``tpot_retokenized`` is what benchmark_serving printed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[3]  # the repository (this file is in scripts/studies/NAME/)
sys.path.insert(0, str(ROOT))

from harness.experiment.presets import PRESETS, SEED_10245  # noqa: E402
from harness.experiment.server import ServerProcess  # noqa: E402
from harness.experiment.server_flags import server_flags  # noqa: E402
from harness.loadgen.sysinfo import git_revision  # noqa: E402
from harness.tokenizers.tokenizer import EMBEDDED_TOKENIZER, GENERATION_PROMPT, ROLE_MARKERS, load_tokenizer  # noqa: E402
from harness.wire.spans import FIRST_CHUNK_SLICE, PREPARE_SLICE, STEP_SLICE  # noqa: E402
from harness.workloads.datasets import EMBEDDED_SONNETS  # noqa: E402

VLLM_FILES = ("benchmark_serving.py", "backend_request_func.py")
FIGURES = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms")
PRESET = PRESETS[SEED_10245]


def hf_tokenizer_dir(where: Path) -> Path:
    """The project's tokenizer.json with a Jinja chat template that renders as ``apply_chat_template``."""
    tokenizer = load_tokenizer()
    (where / "tokenizer.json").write_bytes(EMBEDDED_TOKENIZER.read_bytes())
    # Every literal inside {{ }}: transformers' Jinja trims the newline after a block tag and at the end.
    markers = "".join(
        f"{{% {'if' if i == 0 else 'elif'} m['role'] == '{role}' %}}{{{{ {marker!r} }}}}"
        for i, (role, marker) in enumerate(ROLE_MARKERS.items())
    )
    newline = repr("\n")
    template = "{{ bos_token }}{% for m in messages %}" + markers + "{% endif %}"
    template += f"{{{{ {newline} + m['content'] + {newline} }}}}{{% endfor %}}{{{{ {GENERATION_PROMPT!r} }}}}"
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokenizer.bos_token,
        "chat_template": template,
        "model_max_length": 131072,
    }
    (where / "tokenizer_config.json").write_text(json.dumps(config))
    return where


def server_view(trace: Path, drop_first: bool) -> dict[str, float]:
    """One run as the server saw it, from its trace: arrivals, first tokens, engine steps."""
    events = json.loads(trace.read_text())["traceEvents"]
    arrived = {e["args"]["request_id"]: e["ts"] for e in events if e["name"] == PREPARE_SLICE}
    first = {e["args"]["request_id"]: e["ts"] + e["dur"] for e in events if e["name"] == FIRST_CHUNK_SLICE}
    order = sorted(arrived, key=arrived.__getitem__)[1 if drop_first else 0 :]
    missing = [r for r in order if r not in first]
    if missing:
        raise RuntimeError(f"{len(missing)} requests arrived and wrote no first chunk in {trace}")
    ttft = np.array([first[r] - arrived[r] for r in order]) / 1e3
    starts = sorted(e["ts"] for e in events if e["name"] == STEP_SLICE and e["ts"] >= arrived[order[0]])
    return {
        "requests_arrived": len(order),
        "arrival_span_s": (arrived[order[-1]] - arrived[order[0]]) / 1e6,
        "server_ttft_mean_ms": float(ttft.mean()),
        "server_ttft_median_ms": float(np.median(ttft)),
        "server_step_interval_p50_ms": float(np.median(np.diff(starts)) / 1e3),
    }


def planned_span_s(client: str, seed: int, result: dict[str, Any]) -> float:
    """The arrival span the client planned: ours records it; benchmark_serving 0.6.4 draws its gaps
    from numpy's legacy generator seeded with --seed, which nothing else draws from before them."""
    if client == "ours":
        sends = [r["planned_send"] for r in result["records"]]
        return float(max(sends) - min(sends))
    gaps = np.random.RandomState(seed).gamma(1.0, 1.0 / PRESET["request_rate"], size=PRESET["num_prompts"] - 1)
    return float(gaps.sum())


def ours_command(base_url: str, seed: int, out: Path) -> list[str]:
    return (
        [sys.executable, "-m", "harness.cli", "load", "--base-url", base_url, "--dataset-name", "sonnet"]
        + workload_flags(seed)
        + ["--workers", str(PRESET["workers"]), "--no-progress"]
        + ["--result-dir", str(out.parent), "--result-filename", out.name]
    )


def workload_flags(seed: int) -> list[str]:
    flags = ["--num-prompts", str(PRESET["num_prompts"]), "--request-rate", str(PRESET["request_rate"])]
    for key in ("sonnet_input_len", "sonnet_output_len", "sonnet_prefix_len"):
        flags += [f"--{key.replace('_', '-')}", str(PRESET[key])]
    return flags + ["--seed", str(seed)]


def vllm_command(args: argparse.Namespace, base_url: str, model: str, seed: int, tok: Path, out: Path) -> list[str]:
    return (
        [args.vllm_python, "benchmark_serving.py", "--backend", "vllm", "--base-url", base_url]
        + ["--model", model, "--tokenizer", str(tok), "--dataset-name", "sonnet"]
        + ["--dataset-path", str(EMBEDDED_SONNETS), "--ignore-eos", "--disable-tqdm"]
        + workload_flags(seed)
        + ["--save-result", "--result-dir", str(out.parent), "--result-filename", out.name]
    )


def client_figures(client: str, result: dict[str, Any]) -> dict[str, float]:
    figures = {k: float(result[k]) for k in FIGURES if k in result}
    if client == "vllm":
        n = PRESET["sonnet_output_len"]
        figures["tpot"] = float(np.mean([sum(gaps) / (n - 1) for gaps in result["itls"]]) * 1e3)
        figures["tpot_retokenized"] = float(result["mean_tpot_ms"])
        figures["output_tokens_counted"] = int(result["total_output_tokens"])
        # A request's chunks with text: its gaps + 1 (the client reads each SSE line on its own).
        figures["empty_chunk_share"] = 1.0 - float(np.mean([len(gaps) + 1 for gaps in result["itls"]])) / n
    else:
        figures["tpot"] = float(result["mean_tpot_ms"])
    figures["completed"] = int(result["completed"])
    return figures


def one_run(args: argparse.Namespace, client: str, seed: int, work: Path, tok: Path) -> dict[str, Any]:
    trace, out = work / f"trace-{client}-{seed}.json", work / f"{client}-{seed}.json"
    flags = [*server_flags(PRESET, seed), "--trace-file", str(trace)]
    server = ServerProcess(PRESET["codec"], flags, str(work / f"server-{client}-{seed}.log"))
    try:
        base_url = server.wait_ready(timeout=120)
        if client == "ours":
            cmd, cwd = ours_command(base_url, seed, out), ROOT
        else:
            model = served_model(base_url)
            cmd, cwd = vllm_command(args, base_url, model, seed, tok, out), Path(args.vllm_benchmarks)
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{client} seed {seed} failed: {done.stderr[-2000:]}")
    finally:
        code = server.stop()
    if code != 0:
        raise RuntimeError(f"bench serve ended with {code}: {''.join(server.lines[-5:])}")
    row: dict[str, Any] = {"client": client, "seed": seed}
    result = json.loads(out.read_text())
    row.update(client_figures(client, result))
    row["planned_span_s"] = planned_span_s(client, seed, result)
    row.update(server_view(trace, drop_first=client == "vllm"))
    if client == "vllm":
        row["ttft_late_from_empty_est_ms"] = row["empty_chunk_share"] * row["server_step_interval_p50_ms"]
    print(json.dumps(row), flush=True)
    return row


def served_model(base_url: str) -> str:
    """The model name the server lists: benchmark_serving sends it with every request."""
    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=5) as reply:
        return str(json.load(reply)["data"][0]["id"])


def provenance(args: argparse.Namespace) -> dict[str, Any]:
    """What the figures depend on beyond the script: the client's files, its transformers, our commit."""
    folder = Path(args.vllm_benchmarks)
    transformers = subprocess.run(
        [args.vllm_python, "-c", "import transformers; print(transformers.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return {
        "vllm_client_sha256": {f: hashlib.sha256((folder / f).read_bytes()).hexdigest() for f in VLLM_FILES},
        "vllm_client_transformers": transformers,
        "wirebench_commit": (git_revision() or {}).get("commit"),
    }


def compare(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per client, what it read beyond what the server saw in the same run, and its arrival stretch."""
    out: dict[str, Any] = {}
    for client in ("ours", "vllm"):
        runs = [r for r in rows if r["client"] == client]
        out[client] = {
            "ttft_mean_minus_server_ms": [round(r["mean_ttft_ms"] - r["server_ttft_mean_ms"], 2) for r in runs],
            "ttft_median_minus_server_ms": [round(r["median_ttft_ms"] - r["server_ttft_median_ms"], 2) for r in runs],
            "itl_median_minus_step_interval_ms": [
                round(r["median_itl_ms"] - r["server_step_interval_p50_ms"], 2) for r in runs
            ],
            "arrival_span_over_planned_pct": [
                round(100 * (r["arrival_span_s"] / r["planned_span_s"] - 1), 2) for r in runs
            ],
            "arrival_rate_delivered_per_s": [round((r["requests_arrived"] - 1) / r["arrival_span_s"], 2) for r in runs],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-benchmarks", required=True, help="folder with vLLM 0.6.4's benchmark_serving.py")
    parser.add_argument("--vllm-python", required=True, help="a Python with its imports, without vllm")
    parser.add_argument("--seeds", default="21,22,23,24")
    parser.add_argument("--out", default=str(ROOT / "results" / "baselines" / "seed-10245-vllm-client.json"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="wb-vllm-client-") as tmp:
        work = Path(tmp)
        tok = hf_tokenizer_dir(Path(tempfile.mkdtemp(dir=tmp)))
        for i, seed in enumerate(int(s) for s in args.seeds.split(",")):
            order = ("ours", "vllm") if i % 2 == 0 else ("vllm", "ours")
            rows += [one_run(args, client, seed, work, tok) for client in order]
    result = {
        "command": "scripts/studies/vllm_client_check/vllm_client_check.py " + " ".join(sys.argv[1:]),
        "vllm_client": "vLLM 0.6.4 sdist benchmarks/benchmark_serving.py, unmodified",
        **provenance(args),
        "preset": SEED_10245,
        "runs": rows,
        "comparison": compare(rows),
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["comparison"], indent=1))


if __name__ == "__main__":
    main()
