#!/usr/bin/env bash
# Multi-process throughput: gpt-char-small (configs/runs/char-small.ini) trained in one process,
# then on 2 and 3 fusion-node processes on loopback (configs/clusters/local-2/3.pbtxt, started by
# scripts/run-sites.sh --loopback), in the same session. Reports tokens/s and the ratio to the
# one-process run, which is the cost of crossing processes (same machine, same cores). The
# fourth set-up is the 3-node run with its admin shell polled every 100 ms (one fusion-admin
# reading `status` from a pipe), whose ratio to the 3-node run is the admin shell's cost. Every
# multi-process set-up runs with mutual TLS (the default); the fifth is the 3-node run in
# plaintext (security.mode=off), whose ratio is what TLS costs.
#
#   bench/cluster_bench.sh [--steps 15] [--warmup 3] [--repeats 3] [--micro-batches 4]
#                          [--node-threads N] [--build build] [--smoke]
#
# --smoke: 2 steps after 1 warm-up, one round (the ctest bench_smoke_cluster_bench).
# Rounds alternate the order of the set-ups. tokens/s counts only the steps after the
# warm-up, from the elapsed_s of the JSON-lines metrics. The table shows medians over rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/bench_lib.sh
steps=15 warmup=3 repeats=3 micro=4 node_threads=0 build=${BUILD_DIR:-build}
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --micro-batches) micro=$2; shift 2 ;;
    --node-threads) node_threads=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --smoke) steps=2 warmup=1 repeats=1; smoke_note cluster_bench; shift ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "cluster_bench: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d /tmp/fusion-cluster-bench.XXXX)
# One set of certificates for every round (local-2's nodes are a subset of local-3's).
"$build/apps/fusion-cluster" certs configs/clusters/local-3.pbtxt --out "$work/certs" >/dev/null
total=$((steps + warmup))
common=(--config configs/runs/char-small.ini --steps "$total" --train.micro-batches="$micro" --train.eval-every=0
        --train.eval-batches=0 --output.sample-chars=0 --output.checkpoint="" --runtime.quiet)

# tokens/s over the steps after the warm-up, from a metrics file
rate() {
  python3 - "$1" "$warmup" <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "step"]
w = max(int(sys.argv[2]), 1)
if len(rows) <= w:
    sys.exit("cluster_bench: %s has %d step records, too few after the warm-up" % (sys.argv[1], len(rows)))
a, b = rows[w - 1], rows[-1]
print("%.1f" % ((b["step"] - a["step"]) * 16 * 128 / (b["elapsed_s"] - a["elapsed_s"])))
PY
}

run_setup() {  # run_setup NAME ROUND
  local m=$work/$1-$2.jsonl
  case $1 in
    one) "$build/apps/fusion-train" "${common[@]}" --output.metrics="$m" >"$work/$1-$2.log" 2>&1 ;;
    two|three|plain)
      local c=configs/clusters/local-2.pbtxt security=(--certs "$work/certs")
      [[ $1 != two ]] && c=configs/clusters/local-3.pbtxt
      [[ $1 == plain ]] && security=(--plaintext)
      FUSION_BIN=$build/apps scripts/run-sites.sh --loopback --cluster "$c" --run configs/runs/char-small.ini \
        "${security[@]}" --node-arg --runtime.threads="$node_threads" -- "${common[@]:2}" --output.metrics="$m" >"$work/$1-$2.log" 2>&1 ;;
    admin)
      local port=$((20000 + RANDOM % 20000)) polls=$work/$1-$2.polls
      # The shell connects once the admin port listens and polls until the run ends.
      ( for _ in $(seq 200); do
          (while sleep 0.1; do echo status; done) | "$build/apps/fusion-admin" "127.0.0.1:$port" --json \
            --security.certs="$work/certs" >>"$polls" 2>/dev/null \
            && break
          [[ -s $polls ]] && break
          sleep 0.1
        done ) &
      local poller=$!
      FUSION_BIN=$build/apps scripts/run-sites.sh --loopback --cluster configs/clusters/local-3.pbtxt \
        --run configs/runs/char-small.ini --certs "$work/certs" --node-arg --runtime.threads="$node_threads" -- "${common[@]:2}" \
        --admin.port="$port" --output.metrics="$m" >"$work/$1-$2.log" 2>&1
      kill "$poller" 2>/dev/null; pkill -P "$poller" 2>/dev/null || true; wait "$poller" 2>/dev/null || true
      echo "round $2: admin shell answered $(grep -c '"phase"' "$polls" 2>/dev/null || echo 0) status polls" >&2 ;;
  esac
  rate "$m"
}

setups=(one two three plain)
[[ -x $build/apps/fusion-admin ]] && setups+=(admin)
declare -A results=()
run_rounds "$repeats" "${setups[@]}"
one=$(median "${results[one]}")
echo
echo "gpt-char-small, batch 16 in $micro micro-batches, $steps steps after $warmup warm-up, median of $repeats rounds"
printf "%-34s %12s %8s\n" "set-up" "tokens/s" "ratio"
for s in "${setups[@]}"; do
  m=$(median "${results[$s]}")
  name=$s; [[ $s == one ]] && name="1 process (reference)"; [[ $s == two ]] && name="2 node processes + coordinator"
  [[ $s == three ]] && name="3 node processes + coordinator, TLS"
  [[ $s == plain ]] && name="3 nodes, plaintext (mode=off)"
  [[ $s == admin ]] && name="3 nodes, admin polled every 100 ms"
  printf "%-34s %12s %8s\n" "$name" "$m" "$(awk -v a="$m" -v b="$one" 'BEGIN { printf "%.2f", a / b }')"
done
printf "TLS cost: the TLS 3-node run makes %s of the plaintext run's tokens/s\n" \
  "$(awk -v a="$(median "${results[three]}")" -v b="$(median "${results[plain]}")" 'BEGIN { printf "%.3f", a / b }')"
if [[ -n ${results[admin]:-} ]]; then
  printf "admin polling cost: %s of the 3-node tokens/s\n" \
    "$(awk -v a="$(median "${results[admin]}")" -v b="$(median "${results[three]}")" 'BEGIN { printf "%.3f", a / b }')"
fi
result="RESULT"
for s in "${setups[@]}"; do result+=" ${s}_tokens_per_s=$(median "${results[$s]}")"; done
echo "$result"
echo "logs: $work"
