#!/usr/bin/env bash
# What peer-held snapshots cost (recovery.snapshot-every, docs/recovery.md): gpt-char-small
# (configs/runs/char-small.ini) on 3 fusion-node processes on loopback (configs/clusters/local-3.pbtxt,
# one node per site, so every node's ops stream their state to the next site's node; started by
# scripts/run-sites.sh --loopback, mutual TLS), in the same session: without snapshots, with a
# snapshot every 10 steps and with one every step. Reports tokens/s and the ratio to the run
# without snapshots, and the state bytes a snapshot streams (from the metrics' run record:
# parameters x 3 x 4 bytes with Adam's two moments).
#
#   bench/snapshot_bench.sh [--steps 20] [--warmup 3] [--repeats 3] [--micro-batches 4]
#                           [--node-threads N] [--build build] [--smoke]
#
# --smoke: 2 steps after 1 warm-up, one round (the ctest bench_smoke_snapshot_bench).
# Rounds alternate the order of the set-ups. tokens/s counts only the steps after the warm-up,
# from the elapsed_s of the JSON-lines metrics. The table shows medians over rounds. Every run
# has recovery.mode=auto and no checkpoint, as a run relying on snapshots would.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/bench_lib.sh
steps=20 warmup=3 repeats=3 micro=4 node_threads=0 build=${BUILD_DIR:-build}
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --micro-batches) micro=$2; shift 2 ;;
    --node-threads) node_threads=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --smoke) steps=2 warmup=1 repeats=1; smoke_note snapshot_bench; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "snapshot_bench: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d /tmp/fusion-snapshot-bench.XXXX)
"$build/apps/fusion-cluster" certs configs/clusters/local-3.pbtxt --out "$work/certs" >/dev/null
total=$((steps + warmup))
common=(--steps "$total" --train.micro-batches="$micro" --train.eval-every=0 --train.eval-batches=0
        --output.sample-chars=0 --output.checkpoint="" --recovery.mode=auto --runtime.quiet)

# tokens/s over the steps after the warm-up, from a metrics file
rate() {
  python3 - "$1" "$warmup" <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "step"]
w = max(int(sys.argv[2]), 1)
if len(rows) <= w:
    sys.exit("snapshot_bench: %s has %d step records, too few after the warm-up" % (sys.argv[1], len(rows)))
a, b = rows[w - 1], rows[-1]
print("%.1f" % ((b["step"] - a["step"]) * 16 * 128 / (b["elapsed_s"] - a["elapsed_s"])))
PY
}

run_setup() {  # run_setup NAME ROUND
  local m=$work/$1-$2.jsonl every=${1#every}
  [[ $1 == none ]] && every=0
  FUSION_BIN=$build/apps scripts/run-sites.sh --loopback --cluster configs/clusters/local-3.pbtxt \
    --run configs/runs/char-small.ini --certs "$work/certs" --node-arg --runtime.threads="$node_threads" -- \
    "${common[@]}" --recovery.snapshot-every="$every" --output.metrics="$m" >"$work/$1-$2.log" 2>&1
  if [[ $every != 0 ]] && ! grep -q "peer snapshots every $every step" "$work/$1-$2.log"; then
    echo "snapshot_bench: the run with snapshot-every=$every made no snapshot holders, see $work/$1-$2.log" >&2
    exit 1
  fi
  rate "$m"
}

setups=(none every10 every1)
declare -A results=()
run_rounds "$repeats" "${setups[@]}"
state_mb=$(python3 - "$work/none-1.jsonl" <<'PY'
import json, sys
run = next(r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "run")
print("%.1f" % (run["parameters"] * 3 * 4 / 1e6))
PY
)
none=$(median "${results[none]}")
echo
echo "gpt-char-small on 3 loopback nodes (TLS), batch 16 in $micro micro-batches, $steps steps after $warmup warm-up,"
echo "median of $repeats rounds; a snapshot streams $state_mb MB of state (all ops, each to the next site)"
printf "%-34s %12s %8s\n" "set-up" "tokens/s" "ratio"
for s in "${setups[@]}"; do
  m=$(median "${results[$s]}")
  case $s in
    none) name="no snapshots (reference)" ;;
    every10) name="recovery.snapshot-every=10" ;;
    every1) name="recovery.snapshot-every=1" ;;
  esac
  printf "%-34s %12s %8s\n" "$name" "$m" "$(awk -v a="$m" -v b="$none" 'BEGIN { printf "%.3f", a / b }')"
done
result="RESULT state_mb=$state_mb"
for s in "${setups[@]}"; do result+=" ${s}_tokens_per_s=$(median "${results[$s]}")"; done
echo "$result"
echo "logs: $work"
