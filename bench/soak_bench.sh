#!/usr/bin/env bash
# Memory soak: a long one-process training run whose resident set (VmRSS) is sampled while it
# runs, to show that it stays flat once warmed up (no leak, no allocator growth, no history
# that grows with the run).
#
#   bench/soak_bench.sh [--steps 1000] [--warmup W] [--window R] [--every 1] [--limit 5]
#                       [--config configs/runs/char-small.ini] [--build build] [--out DIR]
#                       [--analyze RSS_CSV] [--smoke] [-- EXTRA fusion-train ARGS]
#
# --smoke: 60 steps of configs/runs/char-tiny.ini (unless --config is given), RSS every 0.2 s,
# limit 50%: what the ctest bench_smoke_soak_bench runs; it only shows that the script works.
# The reference command (gpt-char-small, 1,000 steps, about 8 minutes on 2 quiet cores):
#
#   bench/soak_bench.sh --steps 1000
#
# fusion-train runs the config as it is (evaluation and checkpoint every 100 steps included;
# checkpoint and metrics go to the output directory) with --train.steps=STEPS. Every EVERY
# seconds the script appends "elapsed_s,step,rss_kib" to DIR/rss.csv (step: the last step the
# metrics file reports). The first W steps are warm-up: the allocator and OpenBLAS reach their
# working set, the first evaluation and checkpoint allocate theirs. The next R steps are the
# reference window; its highest RSS is the reference, so that both sides of the comparison hold
# the same periodic work (an evaluation, a checkpoint) and the rise and fall of activations
# within a step. W and R default to 10% of the run, or to the config's eval-every or
# checkpoint-every when that is longer and under half the run (100 and 100 for the reference
# command). Growth is the highest RSS after the reference window against the reference; PASS
# when it is at most LIMIT percent (exit status 0; FAIL: 1). --analyze prints the table of an
# earlier run's rss.csv (give the same --steps) without training. RSS is far less sensitive to
# other load than time, but run the reference command on a quiet machine anyway.
set -euo pipefail
cd "$(dirname "$0")/.."

steps=1000 warmup="" window="" every=1 limit=5 config=configs/runs/char-small.ini build=${BUILD_DIR:-build} out=""
analyze="" smoke=0 config_given=0
extra=()
usage() { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; }
need_value() { [[ $# -ge 2 && -n "$2" ]] || { echo "soak_bench: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) need_value "$@"; steps=$2; shift 2 ;;
    --warmup) need_value "$@"; warmup=$2; shift 2 ;;
    --window) need_value "$@"; window=$2; shift 2 ;;
    --every) need_value "$@"; every=$2; shift 2 ;;
    --limit) need_value "$@"; limit=$2; shift 2 ;;
    --config) need_value "$@"; config=$2; config_given=1; shift 2 ;;
    --build) need_value "$@"; build=$2; shift 2 ;;
    --out) need_value "$@"; out=$2; shift 2 ;;
    --smoke) smoke=1; shift ;;
    --analyze) need_value "$@"; analyze=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "soak_bench: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
if ((smoke)); then
  steps=60 every=0.02 limit=50 warmup=10 window=15
  ((config_given)) || config=configs/runs/char-tiny.ini
fi
[[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "soak_bench: --steps wants a positive integer, got '$steps'" >&2; exit 2; }
[[ -f $config ]] || { echo "soak_bench: config $config not found" >&2; exit 1; }
# The first evaluation and checkpoint allocate what they keep (evaluation batches, checkpoint
# buffers): they belong to the warm-up, and the reference window must hold the next ones.
source bench/bench_lib.sh  # ini_get
period=$(( steps / 10 > 0 ? steps / 10 : 1 ))
for p in "$(ini_get train eval-every 0)" "$(ini_get output checkpoint-every 0)"; do
  [[ $p =~ ^[0-9]+$ ]] && (( p > period && 2 * p < steps )) && period=$p
done
warmup=${warmup:-$period}
window=${window:-$period}
for v in warmup window; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "soak_bench: --$v wants an integer >= 0, got '${!v}'" >&2; exit 2; }
done
(( warmup + window < steps )) ||
  { echo "soak_bench: --warmup ($warmup) + --window ($window) must leave steps to compare (--steps $steps)" >&2; exit 2; }
[[ $every =~ ^[0-9]*\.?[0-9]+$ ]] || { echo "soak_bench: --every wants seconds, got '$every'" >&2; exit 2; }
[[ $limit =~ ^[0-9]*\.?[0-9]+$ ]] || { echo "soak_bench: --limit wants a percentage, got '$limit'" >&2; exit 2; }

# Table and verdict from the samples: reference = highest RSS in steps (W, W+R]; after = the
# samples past W+R (the process's last samples, after the final step, included).
report() {
  awk -F, -v W="$warmup" -v R="$window" -v N="$steps" -v limit="$limit" '
    NR == 1 { next }
    { n++ }
    $2 > W && $2 <= W + R { if ($3 > ref) { ref = $3; ref_step = $2 } ; nref++ }
    $2 > W + R {
      if ($3 > after) { after = $3; after_step = $2 }
      if ($2 > N - R && $3 > endmax) endmax = $3
      nafter++
    }
    $2 > 0 { last = $3; last_step = $2 }
    END {
      if (!nref || !nafter) {
        printf "soak_bench: too few samples (%d in the reference window, %d after it): use more steps or a shorter --every\n", nref, nafter
        exit 3
      }
      mib = 1024
      printf "\n  %-46s %8s %9s\n", "", "step", "RSS MiB"
      printf "  %-46s %8d %9.1f\n", "warm-up end: peak of steps " W + 1 "-" W + R, ref_step, ref / mib
      printf "  %-46s %8d %9.1f\n", "end: peak of steps " N - R + 1 "-" N, N, endmax / mib
      printf "  %-46s %8d %9.1f\n", "max after the warm-up window", after_step, after / mib
      printf "  %-46s %8d %9.1f\n", "last sample", last_step, last / mib
      growth = 100 * (after - ref) / ref
      printf "\n  growth after warm-up: %+.1f%% (max), %+.1f%% (end window), %d samples\n", growth, 100 * (endmax - ref) / ref, n
      verdict = growth <= limit ? "PASS" : "FAIL"
      printf "\nRESULT reference_rss_mib=%.1f end_rss_mib=%.1f max_after_rss_mib=%.1f growth_pct=%.1f samples=%d\n", \
        ref / mib, endmax / mib, after / mib, growth, n
      printf "  %s: RSS after warm-up stays within %s%% of the warm-up peak\n", verdict, limit
      exit verdict == "PASS" ? 0 : 1
    }' "$1"
}

if [[ -n $analyze ]]; then
  [[ -s $analyze ]] || { echo "soak_bench: $analyze is missing or empty" >&2; exit 1; }
  report "$analyze" && exit 0 || exit $?
fi

train_bin=$build/apps/fusion-train
[[ -x $train_bin ]] || { echo "soak_bench: $train_bin is missing: build first: scripts/build.sh (or pass --build DIR)" >&2; exit 1; }
data=$(ini_get data file "")
if [[ -n $data && $data != /* ]]; then data=$(dirname "$config")/$data; fi
[[ -z $data || -s $data ]] || { echo "soak_bench: corpus $data not found: run scripts/get-data.sh" >&2; exit 1; }

out=${out:-$(mktemp -d "${TMPDIR:-/tmp}/soak_bench.XXXXXX")}
mkdir -p "$out"
csv=$out/rss.csv metrics=$out/metrics.jsonl log=$out/train.log
rm -f "$metrics"
((smoke)) && smoke_note soak_bench
echo "soak_bench: $config, $steps steps, RSS every $every s; $(nproc) cores, load average" \
     "$(cut -d' ' -f1-3 /proc/loadavg); output in $out"

# The metrics file's step records are written as each step ends; evaluation records carry the
# step they follow, so only "type": "step" lines count. No interpreter per sample: a python3
# start (50-100 ms) made the smoke's short windows hold no sample at all now and then.
last_step() {
  local line
  line=$(tail -n 4 "$metrics" 2>/dev/null | grep '^{"type": "step", "step": [0-9]*,' | tail -n 1)
  [[ $line =~ \"step\":\ ([0-9]+), ]] && echo "${BASH_REMATCH[1]}" || echo 0
}

"$train_bin" --config "$config" --train.steps="$steps" --output.metrics="$metrics" \
  --output.checkpoint="$out/checkpoints" --force --output.sample-chars=0 "${extra[@]}" >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' INT TERM EXIT
echo "elapsed_s,step,rss_kib" >"$csv"
t0=$(date +%s.%N)
while kill -0 "$pid" 2>/dev/null; do
  rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || true)
  [[ -n $rss ]] && echo "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'),$(last_step),$rss" >>"$csv"
  sleep "$every"
done
status=0
wait "$pid" || status=$?
trap - INT TERM EXIT
if (( status != 0 )); then
  echo "soak_bench: fusion-train exited with status $status; the end of $log:" >&2
  tail -n 20 "$log" >&2
  exit 1
fi
grep -m1 'steps in' "$log" | sed 's/^/soak_bench: /' || true

report "$csv" && rc=0 || rc=$?
echo "  samples: $csv"
exit "$rc"
