#!/usr/bin/env bash
# Download every dependency in pyproject.toml but torch (and their dependencies, and
# pip) as wheels for another machine's Python, for an offline GPU host:
#   scripts/gpu_wheels.sh [--python-version 3.12] [--platform TAG ...] [DIR]
# DIR defaults to shared-wheels/ (it gets a .gitignore of '*': wheels are not committed).
# Platform tags default to manylinux (glibc) 2.5 up to 2.28, x86_64: the host needs
# glibc >= 2.28 for wheels built only for 2.28 (any current distribution has it); pass
# --platform manylinux2014_x86_64 alone for an older one. Then, on the GPU host:
#   PYTHON=python3.12 scripts/gpu_check.sh --wheels DIR     (see the top of gpu_check.sh)
# Python that runs pip here: $PYTHON, else .venv/bin/python if it exists, else python3.
set -euo pipefail
version=3.12
platforms=()
dir=""
while [ $# -gt 0 ]; do
  case $1 in
    --python-version) version=${2:?--python-version needs a version, e.g. 3.12}; shift 2 ;;
    --platform) platforms+=("--platform" "${2:?--platform needs a tag}"); shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu_wheels: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) dir=$1; shift ;;
  esac
done
[ -z "$dir" ] || dir=$(mkdir -p "$dir" && cd "$dir" && pwd)
cd "$(dirname "$0")/.."
dir=${dir:-$(pwd)/shared-wheels}
if [ ${#platforms[@]} -eq 0 ]; then
  for minor in $(seq 28 -1 5); do platforms+=("--platform" "manylinux_2_${minor}_x86_64"); done
  platforms+=("--platform" "manylinux2014_x86_64")
fi
if [ -n "${PYTHON:-}" ]; then python=$PYTHON
elif [ -x .venv/bin/python ]; then python=.venv/bin/python
else python=python3
fi
mapfile -t deps < <("$python" -c '
import re, tomllib
for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]:
    if re.split(r"[<>=!~;\[ ]", d)[0].lower() != "torch":
        print(d)')
mkdir -p "$dir"
[ -f "$dir/.gitignore" ] || echo '*' > "$dir/.gitignore"
echo "gpu_wheels: ${deps[*]} pip -> $dir (CPython $version)"
"$python" -m pip download --disable-pip-version-check -q --only-binary=:all: \
  --implementation cp --python-version "$version" "${platforms[@]}" -d "$dir" "${deps[@]}" pip
echo "gpu_wheels: $(find "$dir" -maxdepth 1 -name '*.whl' | wc -l) wheels, $(du -sh "$dir" | cut -f1) in $dir"
