#!/usr/bin/env bash
# Run the serving loop on CUDA for a few minutes, where a GPU exists; never pass falsely.
#   scripts/gpu_check.sh [--wheels DIR] [--only tests|checks|seed|all] [--seed-seconds S]
#                        [--seed-block-size N] [--seed-rounds R] [--dry-run-cpu] [PRESET]
#   (default preset: llama-8b, random weights)
#
# What runs (--only, default all):
#   tests   the tests that skip without a GPU (the varlen attention kernels against the torch
#           reference, captured CUDA graphs against eager steps, the cuda-ipc transport, the
#           overlapped loop's side-stream read-back against an immediate one), where
#           pytest is installed; else said and skipped
#   checks  the text and image workloads, pickle and msgspec-oob, a few minutes
#   seed    the seed's workload (docs/seed.md: 1,000 sonnet prompts at 40 req/s, 150 tokens out,
#           200-token shared prefix) on the real torch executor, bf16, prefix caching, 256
#           sequences, decode steps as CUDA graphs (--cuda-graphs), msgspec against pickle
#           (outputs msgspec in both, as in the seed's PR), in blocks of --seed-block-size
#           requests (default 1000: the arms take whole-workload
#           turns with both servers up); rounds start while the next one is expected to end
#           within --seed-seconds (default 300) of the step's start, at most --seed-rounds
#           (default 30); results and scripts/gpu_check_seed.py's summary in .../seed/
#   --dry-run-cpu (or WIREBENCH_GPU_CHECK_DRY_RUN=1): the seed step alone on the CPU, tiny
#           model, 16 prompts at 8 req/s, --seed-rounds rounds (default 1); no GPU is looked for
#
# Exit status:
#   0  the checks passed, or no GPU is visible on this machine at all (CI has none)
#   3  a GPU is visible (nvidia-smi -L lists one, or /dev/nvidia[0-9]* exists) but
#      torch cannot use it (CPU wheel, driver mismatch, no torch): the reason is printed
#   1  a check failed (a bench run failed, a codec was refused, or it did not run on cuda;
#      the seed step: no round finished, a run failed or lost requests)
#   2  usage error
# Python: $PYTHON, else .venv/bin/python if it exists, else python3. The project runs
# from this working tree (harness/ and codecs/ on PYTHONPATH; codecs/ is importable as
# `wirecodecs` through a symlink in a temp dir), so it need not be pip-installed.
# Results: results/gpu_check/<timestamp>/{text,image}/, server output in .../server.log;
# the seed step's compare and run files, server log, request traces and summary.json in .../seed/.
# Tests: WIREBENCH_NVIDIA_DEV_GLOB replaces the device-node glob; nvidia-smi is found on PATH;
# WIREBENCH_GPU_CHECK_RESULTS replaces results/gpu_check.
#
# Offline GPU host (system Python 3.11+ with a CUDA torch preinstalled, no network):
#   1. On a machine with network, same checkout, for the host's Python version:
#        scripts/gpu_wheels.sh --python-version 3.12 shared-wheels
#      (every dependency in pyproject.toml but torch, as wheels; ~67 MiB for 3.12; not committed)
#   2. Copy the checkout with shared-wheels/ to the GPU host; there:
#        PYTHON=python3.12 scripts/gpu_check.sh --wheels shared-wheels [PRESET]
#      which is, by hand:
#        python3.12 -m venv --system-site-packages .venv-gpu   # sees the system's CUDA torch
#        .venv-gpu/bin/python -m pip install --no-index --find-links shared-wheels \
#            'msgspec>=0.18' 'pyzmq>=25' 'pillow>=10' ...      # pyproject's dependencies but torch
#        PYTHON=.venv-gpu/bin/python scripts/gpu_check.sh [PRESET]
#      (a later run with --wheels reuses .venv-gpu unless PYTHON names another Python.)
set -euo pipefail
wheels=""
preset=llama-8b
only=all
seed_seconds=300
seed_block=1000
seed_rounds=""
dry_run=${WIREBENCH_GPU_CHECK_DRY_RUN:-0}
[ "$dry_run" = 0 ] || [ "$dry_run" = 1 ] || { echo "gpu_check: WIREBENCH_GPU_CHECK_DRY_RUN must be 0 or 1" >&2; exit 2; }
positive() {  # positive NAME VALUE: a whole number > 0, else a usage error
  [[ $2 =~ ^[0-9]+$ ]] && [ "$2" -gt 0 ] || { echo "gpu_check: $1 needs a whole number > 0, got '$2'" >&2; exit 2; }
}
while [ $# -gt 0 ]; do
  case $1 in
    --wheels) [ $# -ge 2 ] || { echo "gpu_check: --wheels needs a folder" >&2; exit 2; }
              wheels=$2; shift 2 ;;
    --only) [ $# -ge 2 ] || { echo "gpu_check: --only needs tests, checks, seed or all" >&2; exit 2; }
            case $2 in tests|checks|seed|all) only=$2 ;;
              *) echo "gpu_check: --only takes tests, checks, seed or all, not '$2'" >&2; exit 2 ;; esac
            shift 2 ;;
    --seed-seconds) [ $# -ge 2 ] || { echo "gpu_check: --seed-seconds needs a number" >&2; exit 2; }
                    positive --seed-seconds "$2"; seed_seconds=$2; shift 2 ;;
    --seed-block-size) [ $# -ge 2 ] || { echo "gpu_check: --seed-block-size needs a number" >&2; exit 2; }
                       positive --seed-block-size "$2"; seed_block=$2; shift 2 ;;
    --seed-rounds) [ $# -ge 2 ] || { echo "gpu_check: --seed-rounds needs a number" >&2; exit 2; }
                   positive --seed-rounds "$2"; seed_rounds=$2; shift 2 ;;
    --dry-run-cpu) dry_run=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu_check: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) preset=$1; shift ;;
  esac
done
if [ "$dry_run" = 1 ] && [ "$only" != seed ] && [ "$only" != all ]; then
  echo "gpu_check: --dry-run-cpu runs the seed step alone, not --only $only" >&2; exit 2
fi
if [ -n "$wheels" ]; then
  [ -d "$wheels" ] || { echo "gpu_check: no wheel folder $wheels" >&2; exit 2; }
  wheels=$(cd "$wheels" && pwd)
fi
cd "$(dirname "$0")/.."
repo=$(pwd)

# --- which Python -------------------------------------------------------------
if [ -n "$wheels" ]; then
  base=${PYTHON:-python3}
  where='import sys; print(sys.base_prefix)'
  if [ "$(.venv-gpu/bin/python -c "$where" 2>/dev/null)" != "$("$base" -c "$where")" ]; then
    # (Re)made from $base. Without ensurepip (Debian's python3-venv missing) it is made without pip.
    "$base" -m venv --clear --system-site-packages .venv-gpu \
      || "$base" -m venv --clear --system-site-packages --without-pip .venv-gpu
    echo '*' > .venv-gpu/.gitignore
  fi
  python=.venv-gpu/bin/python
  pip=("$python" -m pip)
  if ! "${pip[@]}" --version >/dev/null 2>&1; then
    pip_wheel=$(find "$wheels" -maxdepth 1 -name 'pip-*.whl' | head -n 1)
    [ -n "$pip_wheel" ] || { echo "gpu_check: .venv-gpu has no pip and $wheels has no pip wheel" >&2; exit 2; }
    pip=("$python" "$pip_wheel/pip")  # pip runs from its own wheel
  fi
  mapfile -t deps < <("$python" -c '
import re, tomllib
for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]:
    if re.split(r"[<>=!~;\[ ]", d)[0].lower() != "torch":
        print(d)')
  echo "gpu_check: installing ${deps[*]} from $wheels into .venv-gpu (no network)"
  "${pip[@]}" install --disable-pip-version-check -q --no-index --find-links "$wheels" "${deps[@]}"
elif [ -n "${PYTHON:-}" ]; then
  python=$PYTHON
elif [ -x .venv/bin/python ]; then
  python=.venv/bin/python
else
  python=python3
fi

if [ "$dry_run" = 1 ]; then  # the seed step's path on the CPU: no GPU is looked for
  echo "gpu_check: dry run on the CPU: the seed step alone, tiny sizes; no GPU looked for."
  only=seed
else  # (the GPU's detection and probe below, not indented: their heredocs are Python)

# --- is a GPU visible to the machine? ------------------------------------------
visible=""
smi_out=""
if command -v nvidia-smi >/dev/null 2>&1; then
  smi_out=$(nvidia-smi -L 2>&1) || true
  grep -q '^GPU [0-9]' <<<"$smi_out" && visible="nvidia-smi -L lists a GPU"
fi
dev_glob=${WIREBENCH_NVIDIA_DEV_GLOB:-/dev/nvidia[0-9]*}
mapfile -t dev_nodes < <(compgen -G "$dev_glob" || true)
if [ ${#dev_nodes[@]} -gt 0 ] && [ -z "$visible" ]; then
  visible="device node(s) ${dev_nodes[*]}"
fi

# --- can torch use it? (everything it says is kept: the reason is the point) ---------
read -r -d '' probe_py <<'PY' || true
import os, sys, warnings
print(f"python: {sys.executable} {sys.version.split()[0]}")
try:
    import torch
except Exception as exc:
    print(f"torch: not importable ({type(exc).__name__}: {exc})")
    print("reason: torch does not import in this Python")
    sys.exit(3)
cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
print(f"torch: {torch.__version__}, torch.version.cuda: {torch.version.cuda}, "
      f"CUDA_VISIBLE_DEVICES: {'(unset)' if cvd is None else repr(cvd)}")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    available = torch.cuda.is_available()
for w in caught:
    print(f"warning: {w.category.__name__}: {w.message}")
if not available:
    try:
        torch.cuda.init()
        reason = "torch.cuda.is_available() is False although torch.cuda.init() raised nothing"
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
    print(f"reason: {reason}")
    sys.exit(3)
try:  # a bf16 matmul: a build without kernels for this GPU's architecture fails here
    x = torch.ones(64, 64, device="cuda", dtype=torch.bfloat16)
    assert (x @ x).float().sum().item() == 64 ** 3
except Exception as exc:
    print(f"reason: a bf16 matmul on cuda failed: {type(exc).__name__}: {exc}")
    sys.exit(3)
p = torch.cuda.get_device_properties(0)
print(f"device: {p.name}, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}, "
      f"{torch.cuda.device_count()} visible to torch")
PY
probe=$("$python" -c "$probe_py" 2>&1) && probe_rc=0 || probe_rc=$?
if [ "$probe_rc" -ne 0 ] && [ "$probe_rc" -ne 3 ]; then
  probe+=$'\n'"reason: $python exited $probe_rc before torch was checked"
fi
report() {
  local line
  if [ -n "$smi_out" ]; then
    while IFS= read -r line; do echo "  nvidia-smi -L: $line"; done <<<"$smi_out"
  fi
  while IFS= read -r line; do echo "  $line"; done <<<"$probe"
}

if [ "$probe_rc" -ne 0 ]; then
  if [ -z "$visible" ]; then
    echo "gpu_check: no GPU visible on this machine (nvidia-smi lists none or is not on PATH; nothing matches $dev_glob); nothing was checked."
    exit 0
  fi
  echo "gpu_check: FAIL: a GPU is visible ($visible) but torch cannot use it."
  report
  if [ -n "$wheels" ]; then
    echo "  .venv-gpu uses the torch of $base's site-packages: point PYTHON at a Python with a CUDA torch."
  else
    echo "  Install a CUDA build of torch matching the driver, e.g."
    echo "  TORCH_SPEC=\"torch --index-url https://download.pytorch.org/whl/cu124\" scripts/setup.sh"
  fi
  exit 3
fi
echo "gpu_check: torch can use the GPU (${visible:-torch sees it; nvidia-smi and device nodes do not})."
report
fi  # dry run

# --- the checks: from this working tree, no install needed ---------------------------
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
ln -s "$repo/codecs" "$shim/wirecodecs"
export PYTHONPATH="$shim:$repo${PYTHONPATH:+:$PYTHONPATH}"
results_root=${WIREBENCH_GPU_CHECK_RESULTS:-results/gpu_check}
out=$results_root/$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
[ -f "$results_root/.gitignore" ] || echo '*' > "$results_root/.gitignore"
codecs=pickle,msgspec-oob
bench=("$python" -m harness.cli run --codec "$codecs" --device cuda --model-preset "$preset"
       --max-num-seqs 128 --server-log "$out/server.log" --no-progress)
failed=0
if [ "$only" = tests ] || [ "$only" = all ]; then
  gpu_tests=(tests/test_attention_varlen.py::test_the_cuda_kernel_equals_the_reference
             tests/test_cuda_graphs.py::test_captured_graphs_replay_the_eager_streams
             tests/test_e2e_mm_transports.py::test_cuda_ipc_serves_images
             tests/test_torch_overlap.py::test_cuda_side_stream_read_back_streams_what_an_immediate_read_does)
  if "$python" -c 'import pytest' 2>/dev/null; then
    echo "gpu_check: [tests] ${gpu_tests[*]}"
    "$python" -m pytest -q -p no:cacheprovider -rs "${gpu_tests[@]}" 2>&1 | tee "$out/gpu-tests.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
    ! grep -q "needs a CUDA GPU" "$out/gpu-tests.log" || { echo "gpu_check: [tests] skipped on a GPU"; failed=1; }
  else
    echo "gpu_check: [tests] skipped: pytest is not installed for $python"
  fi
fi
if [ "$only" = checks ] || [ "$only" = all ]; then
  echo "gpu_check: [1/2] text: 200 sonnet prompts at 20 req/s, pickle and msgspec-oob interleaved"
  "${bench[@]}" --num-prompts 200 --request-rate 20 --result-dir "$out/text" || failed=1
  echo "gpu_check: [2/2] image: 40 requests of one 336x336 image as bfloat16 pixel tensors, at 8 req/s"
  "${bench[@]}" --images-per-request 1 --image-width 336 --image-height 336 \
    --mm-payload tensor --mm-tensor-dtype bfloat16 --num-prompts 40 --request-rate 8 \
    --result-dir "$out/image" || failed=1
fi

# --- what ran where: result metadata (metadata["engine"] when present) and the server log ---
read -r -d '' summary_py <<'PY' || true
import glob, json, os, re, sys
out, bad = sys.argv[1], []
log = os.path.join(out, "server.log")
for line in open(log, errors="replace") if os.path.exists(log) else []:
    if line.startswith("wirebench serving") and "(engine:" in line:  # the engine's own account of itself
        engine_part = line.split("(engine:", 1)[1]
        fields = dict(re.findall(r"\b(codec|device|dtype|model_preset|num_params|torch_version)=([^,)]+)", engine_part))
        print("  server: " + ", ".join(f"{k}={v}" for k, v in fields.items()))
        if fields.get("device", "cuda").split(":")[0] != "cuda":
            bad.append(f"a server ran on {fields['device']}")
for workload in ("text", "image"):
    compares = sorted(glob.glob(os.path.join(out, workload, "compare-*.json")))
    runs = json.load(open(compares[-1])).get("runs", []) if compares else []
    if not runs:
        bad.append(f"{workload}: no runs recorded")
    for run in runs:
        name = f"{workload} {run.get('codec')}"
        if run.get("status") != "ok":
            bad.append(f"{name}: {run.get('status')} {run.get('message', '')}")
        doc = json.load(open(os.path.join(out, workload, run["result_file"]))) if run.get("result_file") else {}
        meta = doc.get("metadata") or {}
        engine = meta.get("engine") if isinstance(meta.get("engine"), dict) else {}
        shown = ", ".join(f"{k}={v}" for k, v in engine.items() if not isinstance(v, (dict, list)))
        print(f"  {name}: {run.get('status')}, {doc.get('completed', 'n/a')} completed, "
              f"{doc.get('failed', 'n/a')} failed, gpu {meta.get('gpu') or 'n/a'}, engine {shown or 'n/a'}")
        if str(engine.get("device", "cuda")).split(":")[0] != "cuda":
            bad.append(f"{name}: engine device {engine['device']}")
        if doc and (not doc.get("completed") or doc.get("failed")):
            bad.append(f"{name}: {doc.get('completed')} completed, {doc.get('failed')} failed")
for b in dict.fromkeys(bad):
    print(f"  problem: {b}")
sys.exit(1 if bad else 0)
PY
echo "gpu_check: results in $out"
if [ "$only" = checks ] || [ "$only" = all ]; then
  "$python" -c "$summary_py" "$out" || failed=1
  if [ "$failed" -ne 0 ]; then
    echo "gpu_check: FAIL (last lines of $out/server.log follow)"
    tail -n 20 "$out/server.log" 2>/dev/null || true
  fi
fi

# --- the seed's workload on the real engine (docs/gpu.md, docs/seed.md) -------------------
if [ "$only" = seed ] || [ "$only" = all ]; then
  seed_out=$out/seed
  mkdir -p "$seed_out"
  if [ "$dry_run" = 1 ]; then  # the same path, sized for a CPU and a test
    seed_model=(--device cpu --dtype float32 --model-preset tiny)
    seed_load=(--num-prompts 16 --request-rate 8 --sonnet-output-len 16)
    seed_rounds=${seed_rounds:-1}
    seed_block=16
  else
    seed_model=(--device cuda --dtype bfloat16 --model-preset "$preset" --cuda-graphs)
    seed_load=(--num-prompts 1000 --request-rate 40 --sonnet-output-len 150)
    seed_rounds=${seed_rounds:-30}  # a ceiling: rounds stop at the --seed-seconds budget
  fi
  # The seed's workload (bench run --preset seed-10245's workload flags) on the torch executor.
  # 256 sequences of ~660 tokens; 131,072 KV tokens (16 GiB for llama-8b) hold them with the
  # 200-token prefix cached once, and keep both arms' engines (all up for a round) on an 80 GB card.
  seed_cmd=("$python" -m harness.cli run --codec msgspec,pickle --output-codec msgspec
            --dataset-name sonnet --sonnet-input-len 516 --sonnet-prefix-len 200 "${seed_load[@]}"
            --executor torch "${seed_model[@]}" --prefix-caching --max-num-seqs 256
            --max-num-batched-tokens 2048 --max-model-len 1024 --kv-cache-tokens 131072
            --block-size "$seed_block" --repeat "$seed_rounds"
            --result-dir "$seed_out" --server-log "$seed_out/server.log"
            --trace-file "$seed_out/trace.json" --no-progress)
  echo "gpu_check: [seed] msgspec against pickle on the seed's workload (${seed_load[*]}), blocks of" \
    "$seed_block, rounds while they fit in ${seed_seconds}s"
  printf '%q ' "${seed_cmd[@]}" > "$seed_out/command.txt"; echo >> "$seed_out/command.txt"
  # A round starts only if the rounds so far say it ends within the budget: Ctrl-C (SIGINT) to
  # bench run between rounds keeps what finished. timeout cuts a first round that runs 3 minutes
  # past the budget (an engine far slower than the load), keeping what it served, so the whole
  # step stays inside a lent device's 10 minutes a command.
  pidfile=$seed_out/.bench.pid
  set +e  # bench run's own status, not the pipeline's, decides below
  timeout -s INT -k 60 $((seed_seconds + 180)) \
    bash -c 'echo $$ > "$0"; exec "$@"' "$pidfile" "${seed_cmd[@]}" 2>&1 \
    | { started=$SECONDS; last=$SECONDS; longest=0
        while IFS= read -r line; do
          printf '%s\n' "$line"
          if [[ $line =~ ^\[round\ ([0-9]+)/ ]] && [ "${BASH_REMATCH[1]}" -gt 1 ]; then
            took=$((SECONDS - last)); last=$SECONDS
            [ "$took" -gt "$longest" ] && longest=$took
            if [ $((SECONDS - started + longest)) -gt "$seed_seconds" ]; then
              echo "gpu_check: [seed] round ${BASH_REMATCH[1]} would end past ${seed_seconds}s" \
                "(longest round ${longest}s): stopping after $((BASH_REMATCH[1] - 1)) rounds"
              kill -INT "$(cat "$pidfile")" 2>/dev/null || true
            fi
          fi
        done; }
  seed_rc=${PIPESTATUS[0]}
  set -e
  rm -f "$pidfile"
  echo "gpu_check: [seed] bench run exited $seed_rc; results in $seed_out"
  [ "$dry_run" = 1 ] && want=cpu || want=cuda
  "$python" "$repo/scripts/gpu_check_seed.py" "$seed_out" --device "$want" || failed=1
fi

if [ "$failed" -ne 0 ]; then
  echo "gpu_check: FAIL"
  exit 1
fi
case $only in
  checks) echo "gpu_check: PASS: text and image workloads on cuda, both codecs." ;;
  seed) echo "gpu_check: PASS: the seed's workload ran on ${want:-cuda}, both codecs." ;;
  all) echo "gpu_check: PASS: text and image workloads and the seed's workload on cuda, both codecs." ;;
esac
