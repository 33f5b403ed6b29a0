#!/usr/bin/env bash
# Lint, format and type checks (fast; CI runs them before the tests).
#   scripts/check.sh          check only
#   scripts/check.sh --fix    let ruff fix what it can and reformat, then check
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
if [ "${1:-}" = "--fix" ]; then
  "$bin/ruff" check --fix .
  "$bin/ruff" format .
fi
"$bin/ruff" check .
"$bin/ruff" format --check .
# The import package wirecodecs is the folder codecs/ (mapped at install time):
# mypy finds it through a symlink under that name.
types=$(mktemp -d)
trap 'rm -rf "$types"' EXIT
ln -s "$PWD/codecs" "$types/wirecodecs"
MYPYPATH="$types" "$bin/mypy" harness scripts tests "$types/wirecodecs"
