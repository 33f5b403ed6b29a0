#!/usr/bin/env bash
# Create .venv at the repo root and install wirebench into it (editable).
#   scripts/setup.sh          the tool
#   scripts/setup.sh --test   the tool plus the test dependencies
# A torch that already imports in .venv is kept. Otherwise TORCH_SPEC is
# installed first (default torch==2.13.0: the CPU wheel this machine kind keeps
# on local disk), so resolving "torch>=2.1" never pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extra=""
[ "${1:-}" = "--test" ] && extra="[test]"
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  "${pip[@]}" install "${TORCH_SPEC:-torch==2.13.0}"
fi
"${pip[@]}" install -e ".${extra}"
.venv/bin/python -c "import harness, wirecodecs, torch; print('wirebench ready: torch', torch.__version__)"
