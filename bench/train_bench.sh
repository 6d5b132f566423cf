#!/usr/bin/env bash
# Training throughput: FusionLLM (fusion-train) against Debian's PyTorch 1.13 on gpt-char-small,
# batch 16, in one session, plus the sgemm rate and the model's FLOPs per token, so every number
# in the final table is a ratio between things measured on the same machine in the same run.
#
#   bench/train_bench.sh [--steps 40] [--warmup 5] [--repeats 3] [--micro-batches M]
#                        [--threads N] [--blas-threads K] [--torch-threads P]
#                        [--config configs/runs/char-small.ini] [--data FILE] [--build build]
#                        [--smoke] [-- EXTRA fusion-train ARGS]
#
# --smoke: 2 steps after 1 warm-up, one round, configs/runs/char-tiny.ini (unless --config is
# given): what the ctest bench_smoke_train_bench runs. Without PyTorch the PyTorch part is skipped
# with the reason and the table has our row only.
# Each repeat is one round: sgemm rate, then our trainer and PyTorch (order alternates between
# rounds, so slow drift of the machine does not favour either). Every trainer runs
# warmup + steps optimizer steps; tokens/s counts only the last `steps`. The table reports
# medians over the rounds. Results and logs stay in a temporary directory named at the end.
# See bench/RESULTS.md for how FLOPs are counted and for recorded results.
set -euo pipefail
cd "$(dirname "$0")/.."

steps=40 warmup=5 repeats=3 micro_batches="" threads="" blas_threads="" torch_threads=""
config="" build=${BUILD_DIR:-build} data_override="" smoke=0
extra=()
usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }
need_value() { [[ $# -ge 2 && -n "$2" ]] || { echo "train_bench: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) need_value "$@"; steps=$2; shift 2 ;;
    --warmup) need_value "$@"; warmup=$2; shift 2 ;;
    --repeats) need_value "$@"; repeats=$2; shift 2 ;;
    --micro-batches) need_value "$@"; micro_batches=$2; shift 2 ;;
    --threads) need_value "$@"; threads=$2; shift 2 ;;
    --blas-threads) need_value "$@"; blas_threads=$2; shift 2 ;;
    --torch-threads) need_value "$@"; torch_threads=$2; shift 2 ;;
    --config) need_value "$@"; config=$2; shift 2 ;;
    --build) need_value "$@"; build=$2; shift 2 ;;
    --data) need_value "$@"; data_override=$2; shift 2 ;;
    --smoke) smoke=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "train_bench: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
if ((smoke)); then
  steps=2 warmup=1 repeats=1 config=${config:-configs/runs/char-tiny.ini}
fi
config=${config:-configs/runs/char-small.ini}
for v in steps repeats; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "train_bench: --$v wants a positive integer, got '${!v}'" >&2; exit 2; }
done
[[ $warmup =~ ^[0-9]+$ ]] || { echo "train_bench: --warmup wants an integer >= 0, got '$warmup'" >&2; exit 2; }

# ---- prerequisites -------------------------------------------------------------------------
train_bin=$build/apps/fusion-train sgemm_bin=$build/bench/fusion-bench-sgemm flops_bin=$build/bench/fusion-bench-flops
for b in "$train_bin" "$sgemm_bin" "$flops_bin"; do
  [[ -x $b ]] || { echo "train_bench: $b is missing: build first: scripts/build.sh (or pass --build DIR)" >&2; exit 1; }
done
[[ -f $config ]] || { echo "train_bench: config $config not found" >&2; exit 1; }
source bench/bench_lib.sh  # have_torch, ini_get
torch=1
have_torch || torch=0
((smoke)) && smoke_note train_bench

model=$(ini_path model file "") data=${data_override:-$(ini_path data file data/kjv.txt)} batch=$(ini_get train batch 16)
lr=$(ini_get optim lr 1e-3) min_lr=$(ini_get optim min-lr 1e-4) lr_warmup=$(ini_get optim warmup-steps 0)
[[ -f $model ]] || { echo "train_bench: model file '$model' (from $config) not found" >&2; exit 1; }
[[ -s $data ]] || { echo "train_bench: corpus $data not found: run scripts/get-data.sh" >&2; exit 1; }
time_v=""
if [[ -x /usr/bin/time ]] && /usr/bin/time -v -o /dev/null true 2>/dev/null; then time_v=/usr/bin/time; fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/train_bench.XXXXXX")
total=$((warmup + steps))
nproc_=$(nproc)
torch_threads=${torch_threads:-$nproc_}
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

echo "train_bench: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $nproc_ cores;" \
     "load average $load_before; logs in $tmp"

# Interference check: CPU time the whole machine spent (from /proc/stat) minus what our child
# used (from /usr/bin/time -v) over a run is what other processes took; the load average lags
# by minutes, so it is only printed. cpu_ticks: "busy steal" clock ticks since boot, all cores.
hz=$(getconf CLK_TCK)
cpu_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $9 }' /proc/stat; }
now_s() { date +%s.%N; }
# others_pct B0 S0 T0 CHILD_CPU_S: "others% steal%" of the machine's capacity since (B0, S0, T0).
others_pct() {
  local b1 s1
  read -r b1 s1 < <(cpu_ticks)
  awk -v b0="$1" -v s0="$2" -v t0="$3" -v t1="$(now_s)" -v child="$4" -v b1="$b1" -v s1="$s1" -v hz="$hz" -v n="$nproc_" \
    'BEGIN { cap = (t1 - t0) * n; o = ((b1 - b0) / hz - child) / cap * 100; printf "%.0f %.0f\n", (o < 0 ? 0 : o), (s1 - s0) / hz / cap * 100 }'
}
# child_cpu_s TIMEFILE: user + system seconds from a /usr/bin/time -v report.
child_cpu_s() { awk -F: '/User time|System time/ { s += $2 } END { print s + 0 }' "$1"; }
read -r b0 s0 < <(cpu_ticks); t0=$(now_s); sleep 1
read -r idle_others idle_steal < <(others_pct "$b0" "$s0" "$t0" 0)
echo "train_bench: other processes use ${idle_others}% of the CPUs now (steal ${idle_steal}%)"
if ((idle_others > 10)); then
  echo "train_bench: WARNING: the machine is busy (${idle_others}% used by others): numbers are not valid" >&2
fi

# ---- FLOPs per token (deterministic, once) -----------------------------------------------------
"$flops_bin" --batch "$batch" "$model" >"$tmp/flops.txt" 2>&1 ||
  { cat "$tmp/flops.txt" >&2; echo "train_bench: fusion-bench-flops failed" >&2; exit 1; }
result_field() { sed -n 's/^RESULT.* '"$2"'=\([^ ]*\).*/\1/p' "$1" | tail -1; }
sed -i 's/^RESULT /RESULT  /' "$tmp/flops.txt"  # so the first field also has a space before it
flops_per_token=$(result_field "$tmp/flops.txt" flops_per_token)
context=$(result_field "$tmp/flops.txt" context)
tokens_per_step=$((batch * context))

# ---- one run of each -----------------------------------------------------------------------------
# peak_rss_mib FILE: "Maximum resident set size" from a /usr/bin/time -v report, in MiB.
peak_rss_mib() { awk -F: '/Maximum resident set size/ { printf "%.0f", $2 / 1024 }' "$1"; }

run_sgemm() {  # $1 round
  "$sgemm_bin" --rows "$((batch * context)),$((batch * context / ${micro_batches:-$(ini_get train micro-batches 1)}))" \
    --threads "$(seq -s, 1 "$nproc_")" --min-time 0.15 >"$tmp/sgemm$1.txt" 2>&1 ||
    { cat "$tmp/sgemm$1.txt" >&2; echo "train_bench: fusion-bench-sgemm failed" >&2; exit 1; }
  sed -i 's/^RESULT /RESULT  /' "$tmp/sgemm$1.txt"
  echo "$(result_field "$tmp/sgemm$1.txt" peak_gflops)" >>"$tmp/sgemm_peak"
  echo "  round $1: sgemm peak $(result_field "$tmp/sgemm$1.txt" peak_gflops) GFLOP/s"
}

run_ours() {  # $1 round
  local args=(--config "$config" --train.steps="$total" --train.eval-batches=0 --train.eval-every=0
              --output.sample-chars=0 --output.metrics="\"$tmp/metrics$1.jsonl\"" --output.checkpoint="\"\"")
  # A corpus given with --data gets its own vocabulary, built from it, not the config's file.
  [[ -n $data_override ]] && args+=(--data.file="\"$data\"" --data.vocab="\"$tmp/data.vocab\"")
  [[ -n $micro_batches ]] && args+=(--train.micro-batches="$micro_batches")
  [[ -n $threads ]] && args+=(--runtime.threads="$threads")
  [[ -n $blas_threads ]] && args+=(--runtime.blas-threads="$blas_threads")
  args+=("${extra[@]}")
  local cmd=("$train_bin" "${args[@]}")
  [[ -n $time_v ]] && cmd=("$time_v" -v -o "$tmp/ours_time$1.txt" "${cmd[@]}")
  echo "${cmd[*]}" >"$tmp/ours_cmd.txt"
  local b0 s0 t0
  read -r b0 s0 < <(cpu_ticks); t0=$(now_s)
  if ! "${cmd[@]}" >"$tmp/ours$1.out" 2>"$tmp/ours$1.err"; then
    tail -20 "$tmp/ours$1.err" >&2; echo "train_bench: fusion-train failed (log: $tmp/ours$1.err)" >&2; exit 1
  fi
  # Step records carry cumulative elapsed_s; rate over the steps after the warm-up ones. Read as
  # JSON: op names inside a record ("loss" is one) must not be taken for its fields.
  local line
  line=$(/usr/bin/python3 - "$tmp/metrics$1.jsonl" "$warmup" "$tokens_per_step" <<'PY'
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "step"]
warmup, tokens_per_step = int(sys.argv[2]), int(sys.argv[3])
if len(steps) <= warmup:
    sys.exit(1)
t0 = steps[warmup - 1]["elapsed_s"] if warmup > 0 else 0.0
print("%.1f %s" % ((len(steps) - warmup) * tokens_per_step / (steps[-1]["elapsed_s"] - t0), steps[-1]["loss"]))
PY
  ) || { echo "train_bench: $tmp/metrics$1.jsonl has too few steps" >&2; exit 1; }
  local rss others="n/a"
  if [[ -n $time_v ]]; then
    rss=$(peak_rss_mib "$tmp/ours_time$1.txt")
    others=$(others_pct "$b0" "$s0" "$t0" "$(child_cpu_s "$tmp/ours_time$1.txt")")
    echo "${others% *}" >>"$tmp/others"
  else
    rss=$(sed -n 's/.*peak RSS \([0-9.]*\) MiB.*/\1/p' "$tmp/ours$1.err" | tail -1)
  fi
  echo "$line $rss ${others% *}" >>"$tmp/ours_runs"
  echo "  round $1: FusionLLM $line $rss (tokens/s, loss, peak RSS MiB); others/steal CPU % ${others/ //}"
}

run_torch() {  # $1 round
  ((torch)) || return 0
  local cmd=("$torch_python" bench/torch_char_gpt.py --steps "$steps" --warmup "$warmup" --threads "$torch_threads"
             --data "$data" --batch "$batch" --context "$context" --lr "$lr" --min-lr "$min_lr" --lr-warmup "$lr_warmup")
  [[ -n $time_v ]] && cmd=("$time_v" -v -o "$tmp/torch_time$1.txt" "${cmd[@]}")
  echo "OMP_WAIT_POLICY=PASSIVE ${cmd[*]}" >"$tmp/torch_cmd.txt"
  local b0 s0 t0
  read -r b0 s0 < <(cpu_ticks); t0=$(now_s)
  if ! OMP_WAIT_POLICY=PASSIVE "${cmd[@]}" >"$tmp/torch$1.out" 2>"$tmp/torch$1.err"; then
    tail -20 "$tmp/torch$1.err" >&2; echo "train_bench: torch_char_gpt.py failed (log: $tmp/torch$1.err)" >&2; exit 1
  fi
  sed -i 's/^RESULT /RESULT  /' "$tmp/torch$1.out"
  local tps loss rss others="n/a"
  tps=$(result_field "$tmp/torch$1.out" tokens_per_s) loss=$(result_field "$tmp/torch$1.out" loss)
  if [[ -n $time_v ]]; then
    rss=$(peak_rss_mib "$tmp/torch_time$1.txt")
    others=$(others_pct "$b0" "$s0" "$t0" "$(child_cpu_s "$tmp/torch_time$1.txt")")
    echo "${others% *}" >>"$tmp/others"
  else
    rss=$(result_field "$tmp/torch$1.out" peak_rss_mb)
  fi
  echo "$tps $loss $rss ${others% *}" >>"$tmp/torch_runs"
  echo "  round $1: PyTorch $tps $loss $rss (tokens/s, loss, peak RSS MiB); others/steal CPU % ${others/ //}"
}

for ((r = 1; r <= repeats; r++)); do
  run_sgemm "$r"
  if ((r % 2)); then run_ours "$r"; run_torch "$r"; else run_torch "$r"; run_ours "$r"; fi
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- table ---------------------------------------------------------------------------------------
# median FILE COLUMN
median() { awk -v c="$2" '{ print $c }' "$1" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# runs_list FILE: tokens/s of each run in round order, "*" after runs other processes disturbed.
runs_list() { awk '{ printf "%s%.0f%s", (NR > 1 ? " " : ""), $1, ($4 + 0 > 10 ? "*" : "") }' "$1"; }
# Paired per-round ratios (ours / torch of the same round): robust to drift between rounds.
ours_tps=$(median "$tmp/ours_runs" 1) ours_loss=$(median "$tmp/ours_runs" 2) ours_rss=$(median "$tmp/ours_runs" 3)
sgemm_peak=$(median "$tmp/sgemm_peak" 1)
if ((torch)); then
  round_ratios=$(paste "$tmp/ours_runs" "$tmp/torch_runs" | awk '{ printf "%s%.2f", (NR > 1 ? " " : ""), $1 / $5 }')
  torch_tps=$(median "$tmp/torch_runs" 1) torch_loss=$(median "$tmp/torch_runs" 2) torch_rss=$(median "$tmp/torch_runs" 3)
  torch_version=$("$torch_python" -c 'import torch; print(torch.__version__)')
  torch_runs=$(runs_list "$tmp/torch_runs")
else
  round_ratios="" torch_tps=0 torch_loss=0 torch_rss=0 torch_version="" torch_runs=""
fi

echo
echo "$(basename "$model" .pbtxt), batch $batch x $context, $warmup warm-up + $steps timed steps, median of $repeats rounds"
others_max=$( [[ -s $tmp/others ]] && sort -g "$tmp/others" | tail -1 || echo "n/a")
echo "load average before $load_before, after $load_after; other processes took at most ${others_max}% of the CPUs during a run"
if [[ $others_max != n/a ]] && ((others_max > 10)); then
  echo "WARNING: other processes took up to ${others_max}% of the CPUs during the runs: numbers are not valid"
fi
echo
awk -v ot="$ours_tps" -v ol="$ours_loss" -v orss="$ours_rss" -v oruns="$(runs_list "$tmp/ours_runs")" \
    -v tt="$torch_tps" -v tl="$torch_loss" -v trss="$torch_rss" -v truns="$torch_runs" -v skip="$( ((torch)) || torch_skip_reason)" \
    -v tv="$torch_version" -v rr="$round_ratios" -v rr_csv="${round_ratios// /,}" -v fpt="$flops_per_token" -v peak="$sgemm_peak" -v tthreads="$torch_threads" 'BEGIN {
  printf "| system | tokens/s (median) | runs | peak RSS MiB | loss at end |\n|---|---:|---|---:|---:|\n"
  printf "| FusionLLM fusion-train | %.0f | %s | %.0f | %.4f |\n", ot, oruns, orss, ol
  if (skip != "") {
    printf "(* = other processes took > 10%% of the CPUs during that run)\nPyTorch: %s\n\n", skip
    printf "FLOPs per token (fusion-bench-flops, fwd+bwd): %.4g\n", fpt
    printf "our achieved: %.1f GFLOP/s = %.2f of peak sgemm %.1f GFLOP/s (same run)\n", ot * fpt / 1e9, ot * fpt / 1e9 / peak, peak
    printf "\nRESULT ours_tokens_per_s=%.1f our_gflops=%.2f sgemm_peak_gflops=%.1f fraction_of_peak=%.3f ours_peak_rss_mib=%.0f\n", \
      ot, ot * fpt / 1e9, peak, ot * fpt / 1e9 / peak, orss
    exit
  }
  printf "| PyTorch %s (%d threads) | %.0f | %s | %.0f | %.4f |\n", tv, tthreads, tt, truns, trss, tl
  printf "(* = other processes took > 10%% of the CPUs during that run)\n\n"
  printf "ratio ours/PyTorch: %.2fx (target >= 1.5x: %s); per round: %s\n", ot / tt, (ot / tt >= 1.5 ? "met" : "NOT met"), rr
  printf "FLOPs per token (fusion-bench-flops, fwd+bwd): %.4g\n", fpt
  printf "our achieved: %.1f GFLOP/s = %.2f of peak sgemm %.1f GFLOP/s (same run)\n", ot * fpt / 1e9, ot * fpt / 1e9 / peak, peak
  printf "PyTorch, same FLOP count: %.1f GFLOP/s = %.2f of peak sgemm\n", tt * fpt / 1e9, tt * fpt / 1e9 / peak
  printf "\nRESULT ours_tokens_per_s=%.1f torch_tokens_per_s=%.1f ratio=%.3f our_gflops=%.2f sgemm_peak_gflops=%.1f fraction_of_peak=%.3f ours_peak_rss_mib=%.0f torch_peak_rss_mib=%.0f round_ratios=%s\n", \
    ot, tt, ot / tt, ot * fpt / 1e9, peak, ot * fpt / 1e9 / peak, orss, trss, rr_csv
}'
echo "commands: $(cat "$tmp/ours_cmd.txt")"
((torch)) && echo "          $(cat "$tmp/torch_cmd.txt")"
echo "logs: $tmp"
