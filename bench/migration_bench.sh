#!/usr/bin/env bash
# Migration time against state bytes and link rate (docs/migration.md): a two-site job (one
# fusion-node per site, network namespaces, scripts/run-sites.sh) is paused after its first
# steps; then, for every link rate, the link between the sites is set to that rate
# (scripts/sites.sh shape) and one transformer block moves from site a to site b and back with
# `fusion-admin move`. Each move reports the state bytes it carried and its wall time (spawn,
# state transfer over the data channel, re-wiring); the table sets them against the time the
# bytes alone need at the link's rate.
#
#   bench/migration_bench.sh [--model char-small|gpt2] [--rates "1000 100 8"] [--build DIR] [--smoke]
#
# --smoke: char-small at 100 Mbit/s only (the ctest bench_smoke_migration_bench; skipped, 77,
# without root).
# char-small: configs/models/gpt-char-small.pbtxt (one block: 0.79 M parameters, 9.5 MB of
# state with the two Adam moments); gpt2: configs/models/gpt2-124m.pbtxt at batch 1 (one block:
# 7.1 M parameters, 85 MB), for which the first step alone takes minutes on a 2-core machine.
# Needs root (namespaces, tc). Prints a table on stdout; logs in a temporary directory.
set -Eeuo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
model=char-small rates="1000 100 8" build=$repo/build smoke=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --model) model=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --smoke) model=char-small rates=100 smoke=1; shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "migration_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case $model in
  char-small) file=configs/models/gpt-char-small.pbtxt layers=6 train=(--train.batch=16 --train.micro-batches=4) ;;
  gpt2) file=configs/models/gpt2-124m.pbtxt layers=12 train=(--train.batch=1 --train.micro-batches=1) ;;
  *) echo "migration_bench.sh: --model is char-small or gpt2, got '$model'" >&2; exit 2 ;;
esac
[[ $(id -u) -eq 0 ]] || { echo "migration_bench.sh: needs root (network namespaces and tc)" >&2; ((smoke)) && exit 77; exit 1; }
work=$(mktemp -d /tmp/fusion-migration-bench.XXXXXX)
tag=fmb port=$((20000 + RANDOM % 20000))
half=$((layers / 2)) block="h$((layers / 2 - 1)).*"
first=() second=()
for ((i = 0; i < half; i++)); do first+=("ops: \"h$i.*\""); done
for ((i = half; i < layers; i++)); do second+=("ops: \"h$i.*\""); done
cat >"$work/cluster.pbtxt" <<EOF
name: "migration-bench"
coordinator { host: "10.78.0.1" port: 7730 }
site { name: "a" }
site { name: "b" }
node { name: "a1" site: "a" device: "cpu" cpu_share: 0.9 }
node { name: "b1" site: "b" device: "cpu" cpu_share: 0.9 }
link { a: "a" b: "b" mbit: 1000 }
placement { policy: "explicit"
  assign { node: "a1" ops: "wte" ops: "wpe" ${first[*]} }
  assign { node: "b1" ${second[*]} ops: "lnf" ops: "lm_head" ops: "loss" } }
EOF
admin() { "$build/apps/fusion-admin" "127.0.0.1:$port" --security.certs="$work/certs" --json --timeout 900 -c "$1"; }
FUSION_BIN=$build/apps scripts/run-sites.sh --cluster "$work/cluster.pbtxt" --run configs/runs/char-small.ini \
  --tag "$tag" --subnet 10.78.0 --logs "$work" --certs "$work/certs" -- --model "$file" "${train[@]}" \
  --train.steps=100000 --train.eval-every=0 --output.checkpoint= --output.metrics="$work/metrics.jsonl" \
  --admin.port="$port" --compression.mode=none >"$work/run.log" 2>&1 &
run=$!
# Background jobs ignore SIGINT, and run-sites.sh waits for fusion-train: stop that one.
trap 'pkill -TERM -P $run -x fusion-train 2>/dev/null; wait $run 2>/dev/null || true' EXIT
echo "migration_bench: $model, moving $block between sites a and b; logs in $work" >&2
for _ in $(seq 3600); do
  step=$(admin status 2>/dev/null | python3 -c 'import json, sys; print(json.load(sys.stdin)["step"])' 2>/dev/null || true)
  [[ -n $step && $step -ge 2 ]] && break
  kill -0 $run 2>/dev/null || { echo "migration_bench: the run ended early, see $work/run.log" >&2; tail -5 "$work/run.log" >&2; exit 1; }
  sleep 1
done
admin pause >/dev/null
result=""
printf "%-8s %-7s %10s %10s %12s %14s\n" "Mbit/s" "move" "state MB" "seconds" "bytes-only s" "effective Mbit"
for rate in $rates; do
  scripts/sites.sh shape a b "$rate" --tag "$tag" >/dev/null
  for dir in "a1 b1" "b1 a1"; do
    set -- $dir
    reply=$(admin "move $block $2")
    python3 - "$reply" "$rate" "$1->$2" <<'PY'
import json, sys
r = json.loads(sys.argv[1]); rate = float(sys.argv[2])
b, s = r["state_bytes"], r["seconds"]
print("%-8g %-7s %10.1f %10.2f %12.2f %14.1f" % (rate, sys.argv[3], b / 1e6, s, b * 8 / rate / 1e6, b * 8 / s / 1e6))
PY
    result+=" mbit${rate}_$1_to_$2_seconds=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["seconds"])' "$reply")"
  done
done
echo "RESULT state_mb=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["state_bytes"] / 1e6)' "$reply")$result"
