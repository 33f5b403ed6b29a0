#!/usr/bin/env bash
# Run the serving loop on CUDA for about a minute, where a GPU exists.
#   scripts/gpu_check.sh [PRESET]      (default preset: llama-8b, random weights; see harness/model.py)
# Where no CUDA device is visible it says so plainly and exits 0: CI has no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
preset=${1:-llama-8b}
if ! "$python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: no CUDA GPU visible to torch here; nothing was checked."
  exit 0
fi
"$python" -c "import torch; print('gpu_check: torch', torch.__version__, 'on', torch.cuda.get_device_name(0))"
# Two codecs interleaved on the sonnet workload, ~1 minute in all.
exec "$python" -m harness.cli run --codec pickle,msgspec-oob --device cuda --model-preset "$preset" \
  --num-prompts 300 --request-rate 20 --max-num-seqs 128 --result-dir results/gpu_check
