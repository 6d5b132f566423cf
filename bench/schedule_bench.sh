#!/usr/bin/env bash
# Pipeline schedules: peak resident memory per node and tokens/s of gpt-char-small
# (configs/runs/char-small.ini) on 4 fusion-node processes on loopback (4 pipeline stages,
# placement even), under train.schedule=gpipe and =1f1b, in the same session. 1F1B holds at most
# (stages - position) micro-batches of activations per stage where GPipe may hold all of them, so
# with 8 micro-batches the first stages should need far less memory (issue 30 wants 1f1b <= 60%
# of gpipe). Peak RSS is each node process's maximum resident set (GNU time %M), tokens/s counts
# the steps after the warm-up.
#
#   bench/schedule_bench.sh [--steps 6] [--warmup 2] [--batch 64] [--micro-batches 8]
#                           [--repeats 1] [--port 7790] [--build build] [--smoke]
#
# --smoke: 2 steps after 1 warm-up, batch 16 (the numbers only show that it runs).
# Rounds alternate the order of the schedules; the table shows per node the median over rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/bench_lib.sh
steps=6 warmup=2 batch=64 micro=8 repeats=1 port=7790 build=${BUILD_DIR:-build}
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --micro-batches) micro=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --smoke) steps=2 warmup=1 batch=16 repeats=1; smoke_note schedule_bench; shift ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "schedule_bench: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
[[ -x /usr/bin/time ]] || { echo "schedule_bench: needs GNU time (/usr/bin/time, Debian package time)" >&2; exit 1; }
work=$(mktemp -d /tmp/fusion-schedule-bench.XXXX)
nodes=(n0 n1 n2 n3)
cluster=$work/local-4.pbtxt
{
  echo "name: \"local-4\""
  echo "coordinator { host: \"127.0.0.1\" port: $port }"
  for n in "${nodes[@]}"; do echo "site { name: \"s$n\" }"; done
  for n in "${nodes[@]}"; do echo "node { name: \"$n\" site: \"s$n\" device: \"cpu\" }"; done
  echo "placement { policy: \"even\" }"
} >"$cluster"
"$build/apps/fusion-cluster" certs "$cluster" --out "$work/certs" >/dev/null
total=$((steps + warmup))

run_schedule() {  # run_schedule SCHEDULE ROUND: node peak RSS in $work/SCHEDULE-ROUND-NODE.rss
  local tag=$1-$2 pids=()
  "$build/apps/fusion-train" --config configs/runs/char-small.ini --cluster "$cluster" --steps "$total" \
    --train.batch="$batch" --train.micro-batches="$micro" --train.schedule="$1" --train.eval-every=0 \
    --train.eval-batches=0 --output.sample-chars=0 --output.checkpoint="" --runtime.quiet \
    --scheduler.enabled=false --security.certs="$work/certs" --output.metrics="$work/$tag.jsonl" \
    >"$work/$tag.log" 2>&1 &
  local train=$!
  for n in "${nodes[@]}"; do
    /usr/bin/time -f %M -o "$work/$tag-$n.rss" "$build/apps/fusion-node" --config configs/nodes/site-a.ini \
      --node.name="$n" --node.coordinator="127.0.0.1:$port" --security.certs="$work/certs" \
      >"$work/$tag-$n.log" 2>&1 &
    pids+=($!)
  done
  local rc=0
  wait "$train" || rc=$?
  for p in "${pids[@]}"; do wait "$p" || true; done
  if [[ $rc -ne 0 ]]; then
    echo "schedule_bench: the $1 run failed (exit $rc); its log:" >&2
    tail -20 "$work/$tag.log" >&2
    exit 1
  fi
}

rate() {  # tokens/s after the warm-up, from a metrics file
  python3 - "$1" "$warmup" "$batch" <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "step"]
w, batch = max(int(sys.argv[2]), 1), int(sys.argv[3])
if len(rows) <= w:
    sys.exit("schedule_bench: %s has %d step records, too few after the warm-up" % (sys.argv[1], len(rows)))
a, b = rows[w - 1], rows[-1]
print("%.1f" % ((b["step"] - a["step"]) * batch * 128 / (b["elapsed_s"] - a["elapsed_s"])))
PY
}

for ((r = 1; r <= repeats; r++)); do
  if ((r % 2)); then order=(gpipe 1f1b); else order=(1f1b gpipe); fi
  for s in "${order[@]}"; do run_schedule "$s" "$r"; done
done

median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo "gpt-char-small, batch $batch = $micro micro-batches, 4 stages on loopback, $steps steps after $warmup warm-up, $repeats round(s)"
printf "%-6s %14s %14s %8s\n" node "gpipe MiB" "1f1b MiB" ratio
worst=0
for n in "${nodes[@]}"; do
  g=$(for ((r = 1; r <= repeats; r++)); do cat "$work/gpipe-$r-$n.rss"; done | median)
  f=$(for ((r = 1; r <= repeats; r++)); do cat "$work/1f1b-$r-$n.rss"; done | median)
  ratio=$(awk -v f="$f" -v g="$g" 'BEGIN {printf "%.2f", f / g}')
  printf "%-6s %14.1f %14.1f %8s\n" "$n" "$(awk -v k="$g" 'BEGIN {print k / 1024}')" \
    "$(awk -v k="$f" 'BEGIN {print k / 1024}')" "$ratio"
  worst=$(awk -v a="$worst" -v b="$ratio" 'BEGIN {print (b > a) ? b : a}')
done
tg=$(for ((r = 1; r <= repeats; r++)); do rate "$work/gpipe-$r.jsonl"; done | median)
tf=$(for ((r = 1; r <= repeats; r++)); do rate "$work/1f1b-$r.jsonl"; done | median)
printf "%-6s %14s %14s %8s\n" "tok/s" "$tg" "$tf" "$(awk -v f="$tf" -v g="$tg" 'BEGIN {printf "%.2f", f / g}')"
echo "RESULT max_rss_ratio_1f1b_over_gpipe=$worst tokens_per_s_gpipe=$tg tokens_per_s_1f1b=$tf"
rm -rf "$work"
