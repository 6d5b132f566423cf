#!/usr/bin/env bash
# What mutual TLS costs the main job: the README's multi-site run (configs/clusters/sites-3.pbtxt,
# configs/runs/char-sites.ini, scripts/run-sites.sh; network namespaces with shaped links as root,
# loopback otherwise) with TLS (the default) and in plaintext (--plaintext, security.mode=off), in
# the same session, rounds alternating the order. Prints tokens/s of each and the ratio
# TLS / plaintext (the issue's target: at least 0.95).
#
#   bench/tls_bench.sh [--steps 40] [--warmup 5] [--repeats 3] [--build build] [--loopback] [--smoke]
#
# --smoke: 2 steps after 1 warm-up, one round, on loopback (the ctest bench_smoke_tls_bench).
# tokens/s counts the steps after the warm-up, from the elapsed_s of the JSON-lines metrics;
# evaluation, sampling and checkpoints are off so that only training steps are timed.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/bench_lib.sh
steps=40 warmup=5 repeats=3 build=${BUILD_DIR:-build} where=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --loopback) where=(--loopback); shift ;;
    --smoke) steps=2 warmup=1 repeats=1 where=(--loopback); smoke_note tls_bench; shift ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "tls_bench: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d /tmp/fusion-tls-bench.XXXX)
cluster=configs/clusters/sites-3.pbtxt
"$build/apps/fusion-cluster" certs "$cluster" --out "$work/certs" >/dev/null
tokens_per_step=$((16 * 128))  # char-sites.ini: batch 16 of gpt-char-small's context 128

rate() {  # rate METRICS: tokens/s after the warm-up, from the step records read as JSON
  python3 - "$1" "$warmup" "$tokens_per_step" <<'PY'
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "step"]
w, t = int(sys.argv[2]), int(sys.argv[3])
if len(steps) <= max(w, 1):
    sys.exit("tls_bench: %s has %d step records, too few after %d warm-up steps" % (sys.argv[1], len(steps), w))
a, b = steps[max(w, 1) - 1], steps[-1]
print("%.1f" % ((b["step"] - a["step"]) * t / (b["elapsed_s"] - a["elapsed_s"])))
PY
}

run_setup() {  # run_setup tls|plain ROUND
  local m=$work/$1-$2.jsonl security=(--certs "$work/certs")
  [[ $1 == plain ]] && security=(--plaintext)
  FUSION_BIN=$build/apps scripts/run-sites.sh "${where[@]}" --cluster "$cluster" --run configs/runs/char-sites.ini \
    --logs "$work/logs-$1-$2" "${security[@]}" -- --train.steps="$((steps + warmup))" --train.eval-every=0 \
    --train.eval-batches=0 --output.sample-chars=0 --output.checkpoint="" --output.metrics="$m" --runtime.quiet \
    >"$work/$1-$2.log" 2>&1 || { echo "tls_bench: the $1 run failed, see $work/$1-$2.log" >&2; exit 1; }
  rate "$m"
}

declare -A results=()
run_rounds "$repeats" tls plain
tls=$(median "${results[tls]}") plain=$(median "${results[plain]}")
echo
echo "main job (sites-3, gpt-char-small, batch 16), $steps steps after $warmup warm-up, median of $repeats rounds"
printf "%-28s %12s\n" "set-up" "tokens/s"
printf "%-28s %12s\n" "mutual TLS (default)" "$tls" "plaintext (mode=off)" "$plain"
ratio=$(awk -v a="$tls" -v b="$plain" 'BEGIN { printf "%.3f", a / b }')
printf "TLS / plaintext: %s\n" "$ratio"
echo "RESULT tls_tokens_per_s=$tls plaintext_tokens_per_s=$plain ratio=$ratio"
echo "logs: $work"
