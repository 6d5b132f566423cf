#!/usr/bin/env bash
# What mutual TLS costs the main job: the README's multi-site run (configs/clusters/sites-3.pbtxt,
# configs/runs/char-sites.ini, scripts/run-sites.sh; network namespaces with shaped links as root,
# loopback otherwise) with TLS (the default) and in plaintext (--plaintext, security.mode=off), in
# the same session, rounds alternating the order. Prints tokens/s of each and the ratio
# TLS / plaintext (the issue's target: at least 0.95).
#
#   bench/tls_bench.sh [--steps 40] [--warmup 5] [--repeats 3] [--build build] [--loopback]
#
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
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "tls_bench: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d /tmp/fusion-tls-bench.XXXX)
cluster=configs/clusters/sites-3.pbtxt
"$build/apps/fusion-cluster" certs "$cluster" --out "$work/certs" >/dev/null
tokens_per_step=$((16 * 128))  # char-sites.ini: batch 16 of gpt-char-small's context 128

rate() {  # rate METRICS: tokens/s after the warm-up
  awk -v w="$warmup" -v t="$tokens_per_step" '
    /"elapsed_s"/ {
      match($0, /"step": *[0-9]+/); s = substr($0, RSTART, RLENGTH); sub(/.*: */, "", s)
      match($0, /"elapsed_s": *[0-9.]+/); e = substr($0, RSTART, RLENGTH); sub(/.*: */, "", e)
      s += 0; e += 0
      if (s == w) { s0 = s; e0 = e } last_s = s; last_e = e
    }
    END { if (last_e > e0 && e0 > 0) printf "%.1f\n", (last_s - s0) * t / (last_e - e0); else print "nan" }' "$1"
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
printf "TLS / plaintext: %s\n" "$(awk -v a="$tls" -v b="$plain" 'BEGIN { printf "%.3f", a / b }')"
echo "logs: $work"
