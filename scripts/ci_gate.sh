#!/usr/bin/env bash
# The benchmark gate of a pull request, run from the head checkout with the base checked out beside it:
#   scripts/ci_gate.sh BASE_CHECKOUT [OUT_DIR]
# Both checkouts must be set up (scripts/setup.sh in each). Two gates, one job:
#   1. latency: base and head serve as two arms of one interleaved experiment in blocks
#      (bench run --arm), judged by bench compare --gate on TTFT mean (exit 1 regression,
#      2 unusable, 3 cannot say);
#   2. instructions: the codecs' encode/decode counted under callgrind by each build,
#      head gated against base at 1% (bench micro --count instructions --baseline).
# The exit status is the first non-zero of the two. The recipe's size can be overridden for a
# quick rehearsal (tests/test_ci_workflow.py): WB_GATE_RUN_ARGS, WB_GATE_COUNT_ARGS.
set -uo pipefail
base=$(cd "$1" && pwd)
out=${2:-results/ci-gate}
head=$(pwd)
mkdir -p "$out"
run_args=${WB_GATE_RUN_ARGS:---executor sim --num-prompts 200 --block-size 20 --repeat 7}
count_args=${WB_GATE_COUNT_ARGS:---codec msgspec-oob --payload text-550,outputs-64}
summary=${GITHUB_STEP_SUMMARY:-$out/summary.md}

# shellcheck disable=SC2086  # the recipe is a list of flags
.venv/bin/bench run --arm base="--python $base/.venv/bin/python" --arm head="--python $head/.venv/bin/python" \
  $run_args --result-dir "$out/latency" --no-progress
latency=1
compare_file=$(ls -t "$out"/latency/compare-*.json 2>/dev/null | head -n 1)
if [ -n "$compare_file" ]; then
  .venv/bin/bench compare "$compare_file" --gate --markdown "$out/latency-gate.md" --json "$out/latency-gate.json"
  latency=$?
else
  echo "ci_gate: bench run wrote no compare file" >&2
  latency=2
fi

# shellcheck disable=SC2086
"$base/.venv/bin/bench" micro --count instructions $count_args --json "$out/instructions-base.json"
# shellcheck disable=SC2086
.venv/bin/bench micro --count instructions $count_args --json "$out/instructions-head.json" \
  --baseline "$out/instructions-base.json" --threshold-pct 1
instructions=$?

cat "$out/latency-gate.md" >>"$summary" 2>/dev/null || true
echo "ci_gate: latency gate exit $latency, instruction gate exit $instructions"
[ "$latency" -ne 0 ] && exit "$latency"
exit "$instructions"
