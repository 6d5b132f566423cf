#!/usr/bin/env bash
# ctest plot_metrics: scripts/plot.sh draws a metrics file with step, eval and compression records
# into a PNG (and names what it marked), and refuses a missing file and a file without steps.
#
#   tests/scripts/plot_test.sh SOURCE_DIR
set -uo pipefail
src=${1:?usage: plot_test.sh SOURCE_DIR}
work=$(mktemp -d /tmp/fusion-plot-test.XXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

m=$work/run.jsonl
for s in $(seq 1 40); do
  printf '{"type": "step", "step": %d, "loss": %s, "lr": 0.001, "grad_norm": 1.0, "tokens_per_s": %s, "step_s": 0.5, "predicted_step_s": 0.45, "elapsed_s": %s, "time": "x", "edges": []}\n' \
    "$s" "$(awk -v s="$s" 'BEGIN { print 4 / (1 + s / 10) }')" "$((4000 + s))" "$((s / 2))" >>"$m"
  ((s % 20 == 0)) && printf '{"type": "eval", "step": %d, "val_loss": 2.5, "time": "x"}\n' "$s" >>"$m"
  ((s == 25)) && printf '{"type": "compression", "step": 25, "link": "a1->b1", "keep_before": 1, "keep_after": 0.1, "mbit": 8, "dense_bytes": 1000, "budget_s": 0.1}\n' >>"$m"
done
out=$("$src/scripts/plot.sh" "$m" 2>&1) || fail "plot.sh failed: $out"
[[ $out == *"40 steps, 1 compression changes"* ]] || fail "summary: $out"
[[ -s $work/run.png ]] || fail "no $work/run.png"
[[ $(head -c 8 "$work/run.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || fail "run.png is not a PNG"

"$src/scripts/plot.sh" "$work/missing.jsonl" >"$work/err" 2>&1; rc=$?
[[ $rc == 2 && $(cat "$work/err") == *"missing.jsonl: no such file"* ]] || fail "missing file: rc $rc, $(cat "$work/err")"
echo '{"type": "eval", "step": 1, "val_loss": 2.5}' >"$work/no-steps.jsonl"
"$src/scripts/plot.sh" "$work/no-steps.jsonl" "$work/x.png" >"$work/err" 2>&1; rc=$?
[[ $rc == 2 && $(cat "$work/err") == *"holds no step records"* ]] || fail "no steps: rc $rc, $(cat "$work/err")"
echo "PASS: plot.sh drew 40 steps with a compression mark and refused 2 bad inputs"
