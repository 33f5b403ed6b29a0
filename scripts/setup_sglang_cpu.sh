#!/usr/bin/env bash
# .venv-sglang: SGLang's CPU path in a venv of its own, the second real server under test (docs/sglang.md).
# Called by scripts/setup.sh --with-sglang-cpu; wirebench's .venv and .venv-vllm are untouched.
#   - the CPU build of torch first, then every package that depends on torch with --no-deps (sglang,
#     torchvision, xgrammar, compressed-tensors), so nothing can resolve a CUDA build: sglang's own metadata
#     pins torch==2.14.1 (CUDA here, several GB) and some twenty CUDA-only packages;
#   - then the packages SGLang's imports and its server need on the CPU, pinned, found by starting the server
#     until it served; a constraint file holds torch at the CPU build while pip resolves their own needs;
#   - wirebench itself, editable and --no-deps, and a .pth line that runs harness/sglang_hook/startup.py at
#     every start of this venv's Python: the CPU stand-ins (harness/sglang_hook/cpu_standins.py) and, with
#     WIREBENCH_SGLANG_SPANS=DIR only, the timing of SGLang's inter-process messages;
#   - the default model to serve, made offline (harness/vllm_plugin/model.py, with this venv's Python).
# pip check would then list sglang's requirements left out on purpose (CUDA kernels, torch==2.14.1, ...):
# the installs run with --no-warn-conflicts, and the check after them says those in one line and prints
# anything else as pip says it.
# Rerun: quick when the pins, sglang and the hook are already in place (a stamp of the pins in the venv).
# WIREBENCH_SGLANG_VENV names another folder; WIREBENCH_SETUP_DRY_RUN=1 prints the commands instead.
set -euo pipefail
cd "$(dirname "$0")/.."
SGLANG_VERSION=0.5.23
python=${PYTHON:-python3}
venv=${WIREBENCH_SGLANG_VENV:-.venv-sglang}
# Depend on torch: installed with --no-deps (sglang's own pins where it has them).
TORCH_DEPENDENT=("sglang==$SGLANG_VERSION" torchvision==0.28.0 xgrammar==0.2.7 compressed-tensors==0.18.0)
# What SGLang imports at start and its server needs, on the CPU (sglang's pins where it has them).
PACKAGES=(
  transformers==5.19.0 tokenizers==0.23.2 sentencepiece==0.2.1 mistral_common==1.13.1
  apache-tvm-ffi==0.1.11 triton==3.9.0 numpy==2.3.5 msgspec==0.23.0 pyzmq==27.3.0 orjson==3.13.0
  pybase64==1.5.1 psutil==7.2.2 requests==2.34.2 packaging==26.4 pillow==13.0.0 tqdm==4.70.1
  ipython==9.19.1 pydantic==2.14.4 aiohttp==3.14.5 huggingface_hub==1.33.0 dill==0.4.1 gguf==0.19.0
  uvicorn==0.55.0 uvloop==0.23.0 fastapi==0.165.0 python-multipart==0.0.34 openai==2.8.0
  partial-json-parser==0.2.1.1.post7 setproctitle==1.3.8 einops==0.8.2 jsonschema==4.26.0
  soundfile==0.13.1 loguru==0.7.3
)
CPU_TORCH="torch==2.13.0+cpu"
HOOK_PTH="wirebench_sglang_hook.pth"
run() {
  if [ -n "${WIREBENCH_SETUP_DRY_RUN:-}" ]; then echo "+ $*"; else "$@"; fi
}
stamp="$venv/wirebench-sglang.stamp"
pins="$CPU_TORCH ${TORCH_DEPENDENT[*]} ${PACKAGES[*]} $HOOK_PTH"
installed() {
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$pins" ] || return 1
  "$venv/bin/python" - "$SGLANG_VERSION" <<'PY' >/dev/null 2>&1
import importlib.metadata as m, sys
import torch, harness.sglang_hook.startup  # the hook, from this checkout
sys.exit(m.version("sglang") != sys.argv[1] or "+cpu" not in torch.__version__)
PY
}
# pip check, sglang's requirements left out on purpose in one line; always 0, as pip's own warning is.
check() {
  local said others
  said=$("$venv/bin/python" -m pip check 2>&1 || true)
  others=$(grep -v -e "^sglang $SGLANG_VERSION " -e "^wirebench " -e "^No broken" <<<"$said" || true)
  echo "setup: sglang's CUDA-only and optional requirements are left out of $venv on purpose" \
    "($(grep -c "^sglang $SGLANG_VERSION " <<<"$said" || true) named by pip check; docs/sglang.md)," \
    "and wirebench's own (installed --no-deps: only its hook runs there)"
  [ -z "$others" ] || sed 's/^/setup: pip check: /' <<<"$others"
}
if [ -z "${WIREBENCH_SETUP_DRY_RUN:-}" ] && installed; then
  echo "setup: $venv has sglang $SGLANG_VERSION (CPU torch) and the wirebench hook"
else
  [ -x "$venv/bin/python" ] || run "$python" -m venv "$venv"
  pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
  # The CPU wheel: this workplace keeps it on local disk; elsewhere PyTorch's CPU index serves it.
  run "${pip[@]}" install "$CPU_TORCH" --retries 1 --extra-index-url https://download.pytorch.org/whl/cpu
  constraint="$venv/wirebench-torch-constraint.txt"
  run sh -c "echo '$CPU_TORCH' > '$constraint'"
  run "${pip[@]}" install --no-warn-conflicts --no-deps "${TORCH_DEPENDENT[@]}"
  run "${pip[@]}" install --no-warn-conflicts -c "$constraint" "${PACKAGES[@]}"
  run "${pip[@]}" install --no-warn-conflicts --no-deps -e .
  site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" 2>/dev/null ||
    echo "$venv/lib/site-packages")  # a dry run before the venv exists
  run sh -c "echo 'import harness.sglang_hook.startup' > '$site/$HOOK_PTH'"
  not_cpu="'setup: $venv has torch ' + torch.__version__ + ', not the CPU build: remove $venv and run setup again'"
  run "$venv/bin/python" -c "import torch, sys; sys.exit(0 if '+cpu' in torch.__version__ else $not_cpu)"
  [ -n "${WIREBENCH_SETUP_DRY_RUN:-}" ] || check
  run sh -c "echo '$pins' > '$stamp'"
fi
run "$venv/bin/python" -m harness.vllm_plugin.model "$venv/wirebench-models/tiny-wirebench" --preset tiny
