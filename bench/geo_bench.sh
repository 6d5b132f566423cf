#!/usr/bin/env bash
# Geo-distributed placement and compression: placement policies (even, pipeline-only OP-Fence
# "opfence", OP-Fence with stage replicas "opfence-replicas", explicit) and edge codecs
# (none, topk, adatopk) on emulated sites, with the link rates and CPU caps of the cluster files
# (configs/clusters/sites-3, sites-4-pairs, sites-6-tiers, sites-2x3: network namespaces and tc from
# scripts/sites.sh, cgroup CPU quotas from scripts/run-sites.sh). Each run trains
# configs/runs/char-sites.ini (gpt-char-small) for --steps steps through scripts/run-sites.sh with
# --cluster.policy=POLICY --compression.mode=MODE for every POLICY+MODE of --configs; the order of
# the configs alternates round by round, topology by topology. --slow 8,20,100 repeats every
# topology with its slowest links (all links at the file's lowest rate) set to each rate in
# Mbit/s (a copy of the cluster file in the output directory). Needs root with network
# namespaces: on loopback the topologies would not exist, so it refuses.
#
#   bench/geo_bench.sh [--rounds 2] [--steps 30] [--warmup 5] [--topologies sites-3,sites-4-pairs,sites-6-tiers]
#                      [--configs even+none,opfence+none] [--slow MBIT,...] [--no-alone]
#                      [--run configs/runs/char-sites.ini] [--batch ROWS] [--micro-batches N|auto] [--build build]
#                      [--out runs/geo/STAMP]
#                      [--smoke]   (1 round, 4 steps, sites-3, even and OP-Fence: the ctest bench_smoke_geo_bench)
#
# From each run's metrics (JSON lines, type "step"), over the steps after the first --warmup:
# tokens/s = tokens of those steps / their wall time (elapsed_s), and where the steps carry
# step_s and predicted_step_s, their means and the mean of |predicted - measured| / measured.
# Hardware efficiency ("hw eff %"): tokens/s over the sum, across every node of the cluster file,
# of that node's own tokens/s alone under its cap. Once per topology the first node of the file
# trains the whole model alone (a one-node copy of the cluster file, its site and cap) for the
# same steps; every node's alone rate is that rate scaled by its cpu_share over the first node's
# (uncapped nodes: n/a). --no-alone skips that run and the column. --batch and --micro-batches
# set train.batch and train.micro-batches for every run, the alone run too (default: the run
# file's; micro-batches auto: the estimator's choice per run). Example, replicas against
# pipeline-only OP-Fence where replicas should matter (docs/scheduler.md, "Stage replicas"):
#   bench/geo_bench.sh --topologies sites-2x3,sites-3 --configs opfence+none,opfence-replicas+none
# The table has one row per run and, per topology (and slow rate), each config's ratio of tokens/s
# to the first config (the baseline): the mean of the per-round ratios. "others %" is the CPU that other
# processes took during the run (machine busy time from /proc/stat minus the run's own CPU time
# from /usr/bin/time); above 10% the row is marked * and is not valid. Metrics, coordinator and
# node logs, and the table (table.txt) stay in the output directory.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=2 steps=30 warmup=5 topologies=sites-3,sites-4-pairs,sites-6-tiers run=configs/runs/char-sites.ini
configs=even+none,opfence+none slow="" build=${BUILD_DIR:-build} out="" alone=1 micro=() batch=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --topologies) topologies=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    --slow) slow=$2; shift 2 ;;
    --run) run=$2; shift 2 ;;
    --micro-batches) micro=(--train.micro-batches="$2"); shift 2 ;;
    --batch)
      [[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "geo_bench: --batch needs a row count >= 1, got '$2'" >&2; exit 2; }
      batch=(--train.batch="$2"); shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --smoke) rounds=1 steps=4 warmup=1 topologies=sites-3 configs=even+none,opfence+none smoke=1; shift ;;
    --no-alone) alone=0; shift ;;
    -h|--help) sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "geo_bench: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "geo_bench: --rounds needs an integer >= 1" >&2; exit 2; }
[[ $warmup =~ ^[0-9]+$ ]] || { echo "geo_bench: --warmup needs an integer >= 0" >&2; exit 2; }
[[ $steps =~ ^[0-9]+$ ]] && ((steps > warmup)) ||
  { echo "geo_bench: --steps must be an integer above --warmup ($warmup)" >&2; exit 2; }
IFS=, read -r -a topos <<<"$topologies"
for t in "${topos[@]}"; do
  [[ -f configs/clusters/$t.pbtxt ]] || { echo "geo_bench: no cluster file configs/clusters/$t.pbtxt" >&2; exit 2; }
done
IFS=, read -r -a confs <<<"$configs"
for c in "${confs[@]}"; do
  [[ $c =~ ^(even|opfence|opfence-replicas|explicit)\+(none|topk|adatopk)$ ]] ||
    { echo "geo_bench: config '$c' is not POLICY+MODE (policy even|opfence|opfence-replicas|explicit," \
           "mode none|topk|adatopk)" >&2; exit 2; }
done
slows=("")
if [[ -n $slow ]]; then
  IFS=, read -r -a slows <<<"$slow"
  for m in "${slows[@]}"; do
    [[ $m =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "geo_bench: --slow needs rates in Mbit/s, got '$m'" >&2; exit 2; }
  done
fi
[[ -f $run ]] || { echo "geo_bench: run config $run not found" >&2; exit 2; }
for b in fusion-train fusion-node fusion-cluster; do
  [[ -x $build/apps/$b ]] || { echo "geo_bench: $build/apps/$b not found (build it, or --build DIR)" >&2; exit 2; }
done
[[ -s data/kjv.txt ]] || { echo "geo_bench: corpus data/kjv.txt not found: run scripts/get-data.sh" >&2; exit 2; }
export FUSION_BIN=$build/apps FUSION_CLUSTER_BIN=$build/apps/fusion-cluster

# ---- refuse without namespaces; say whether the CPU caps will hold -------------------------------
if ! why=$(scripts/sites.sh check 2>&1); then
  echo "geo_bench: refusing to run: $why" >&2
  echo "geo_bench: the topologies exist only as network namespaces with tc-shaped links (root);" \
       "on loopback every link is unshaped and even vs OP-Fence would measure nothing" >&2
  ((${smoke:-0})) && exit 77  # ctest: skipped, with the reason above
  exit 3
fi
if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
  grep -qw cpu /sys/fs/cgroup/cgroup.controllers && caps_ok=1 || caps_ok=0
else
  [[ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]] && caps_ok=1 || caps_ok=0
fi
((caps_ok)) || echo "geo_bench: WARNING: no cgroup cpu controller: the nodes' cpu_share caps will not hold" >&2

out=${out:-runs/geo/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
time_v=""
if [[ -x /usr/bin/time ]] && /usr/bin/time -v -o /dev/null true 2>/dev/null; then time_v=/usr/bin/time; fi

# ---- interference: what other processes took (as bench/train_bench.sh) ---------------------------
hz=$(getconf CLK_TCK) ncpu=$(nproc)
cpu_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }
now_s() { date +%s.%N; }
others_pct() {  # others_pct TICKS0 T0 OWN_CPU_S: % of the machine's capacity since then, not ours
  awk -v b0="$1" -v t0="$2" -v own="$3" -v b1="$(cpu_ticks)" -v t1="$(now_s)" -v hz="$hz" -v n="$ncpu" \
    'BEGIN { o = ((b1 - b0) / hz - own) / ((t1 - t0) * n) * 100; printf "%.0f\n", (o < 0 ? 0 : o) }'
}
b0=$(cpu_ticks); t0=$(now_s); sleep 1
idle_others=$(others_pct "$b0" "$t0" 0)
echo "geo_bench: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $ncpu cores;" \
     "other processes use ${idle_others}% of the CPUs now; output in $out" >&2
((idle_others <= 10)) ||
  echo "geo_bench: WARNING: the machine is busy (${idle_others}% used by others): numbers are not valid" >&2

# cluster_file TOPOLOGY SLOW: the cluster file, or a copy whose slowest links run at SLOW Mbit/s.
cluster_file() {
  local f="configs/clusters/$1.pbtxt"
  [[ -z $2 ]] && { echo "$f"; return; }
  mkdir -p "$out/clusters"
  local copy="$out/clusters/$1-slow$2.pbtxt"
  python3 - "$f" "$2" "$copy" <<'PY'
import re, sys
src, rate, dst = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(src).read()
pat = re.compile(r'(link\s*\{[^}]*?mbit:\s*)([0-9.]+)')
lowest = min(float(m.group(2)) for m in pat.finditer(text))
text = pat.sub(lambda m: m.group(1) + (rate if float(m.group(2)) == lowest else m.group(2)), text)
open(dst, "w").write(text)
PY
  echo "$copy"
}

# ---- one run ---------------------------------------------------------------------------------
# run_one TOPOLOGY CONFIG ROUND SLOW [CLUSTER_FILE]: prints "tokens/s predicted_s measured_s error%
# others% caps" ("failed" when the run failed).
run_one() {
  local name="$1${4:+-slow$4}-$2-r$3"
  local m="$out/$name.jsonl" log="$out/$name.log" tf="$out/$name.time"
  local file=${5:-$(cluster_file "$1" "$4")}
  local cmd=(scripts/run-sites.sh --cluster "$file" --run "$run" --tag geo --subnet 10.78.0
             --logs "$out/$name.nodes" -- --cluster.policy="${2%+*}" --compression.mode="${2#*+}"
             --train.steps="$steps" --train.eval-every=0
             --train.eval-batches=0 --output.sample-chars=0 --output.checkpoint= --output.metrics="$m" --runtime.quiet
             ${micro[@]+"${micro[@]}"} ${batch[@]+"${batch[@]}"})
  rm -f "$m"
  local b t rc=0 own=0
  b=$(cpu_ticks); t=$(now_s)
  if [[ -n $time_v ]]; then
    "$time_v" -v -o "$tf" "${cmd[@]}" >"$log" 2>&1 || rc=$?
    own=$(awk -F: '/User time|System time/ { s += $2 } END { print s + 0 }' "$tf")
  else
    "${cmd[@]}" >"$log" 2>&1 || rc=$?
  fi
  local others; others=$([[ -n $time_v ]] && others_pct "$b" "$t" "$own" || echo n/a)
  if ((rc != 0)) || [[ ! -s $m ]]; then echo "failed"; return; fi
  local caps=capped
  grep -q 'CPU caps NOT enforced' "$log" && caps=uncapped
  python3 - "$m" "$warmup" "$others" "$caps" <<'PY'
import json, sys
path, warm, others, caps = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = [r for r in (json.loads(l) for l in open(path) if l.strip()) if r.get("type") == "step"]
rows.sort(key=lambda r: r["step"])
base = [r for r in rows if r["step"] <= warm]
meas = [r for r in rows if r["step"] > warm]
if not meas:
    print("failed"); sys.exit()
have_s = all("step_s" in r for r in meas)
# wall time of the measured steps: from the end of the last warm-up step to the end of the last
if base:
    wall = meas[-1]["elapsed_s"] - base[-1]["elapsed_s"]
else:
    wall = meas[-1]["elapsed_s"]
if have_s:
    tokens = sum(r["tokens_per_s"] * r["step_s"] for r in meas)
    tps = tokens / wall if wall > 0 else float("nan")
else:
    tps = sum(r["tokens_per_s"] for r in meas) / len(meas)
def mean(v): return sum(v) / len(v) if v else float("nan")
measured = mean([r["step_s"] for r in meas]) if have_s else float("nan")
pred_rows = [r for r in meas if r.get("predicted_step_s", 0) > 0 and r.get("step_s", 0) > 0]
predicted = mean([r["predicted_step_s"] for r in pred_rows])
err = mean([abs(r["predicted_step_s"] - r["step_s"]) / r["step_s"] * 100 for r in pred_rows])
def f(x, fmt): return "n/a" if x != x else fmt % x
print(f(tps, "%.1f"), f(predicted, "%.4f"), f(measured, "%.4f"), f(err, "%.1f"), others, caps)
PY
}

# ---- hardware efficiency: every node's own tokens/s alone under its cap ---------------------------
# alone_file TOPOLOGY: a copy of the cluster file with its first node only (its site, no links, no
# placement section).
alone_file() {
  mkdir -p "$out/clusters"
  local copy="$out/clusters/$1-alone.pbtxt"
  python3 - "configs/clusters/$1.pbtxt" "$copy" <<'PY'
import re, sys
src, dst = sys.argv[1], sys.argv[2]
text = open(src).read()
def blocks(kind):  # (start, end) of every top-level "kind { ... }", nested braces included
    out = []
    for m in re.finditer(r'(?m)^\s*' + kind + r'\s*\{', text):
        depth, i = 0, m.end() - 1
        while True:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
            if depth == 0: break
        out.append((m.start(), i))
    return out
nodes = blocks("node")
first = text[nodes[0][0]:nodes[0][1]]
site = re.search(r'site:\s*"([^"]+)"', first).group(1)
drop = nodes[1:] + blocks("link") + blocks("placement")
drop += [b for b in blocks("site") if re.search(r'name:\s*"([^"]+)"', text[b[0]:b[1]]).group(1) != site]
for a, b in sorted(drop, reverse=True):
    text = text[:a] + text[b:]
open(dst, "w").write(text)
PY
  echo "$copy"
}
# node_rates TOPOLOGY ALONE_TPS: the sum over every node of ALONE_TPS x its cpu_share / the first
# node's ("n/a" when a node is uncapped or the alone run failed).
node_rates() {
  "$build/apps/fusion-cluster" netns "configs/clusters/$1.pbtxt" | awk -v t="$2" '
    $1 == "node" { n++; share[n] = $5 + 0 }
    END {
      if (t == "" || t == "failed" || n == 0) { print "n/a"; exit }
      for (i = 1; i <= n; i++) if (share[i] <= 0) { print "n/a"; exit }
      for (i = 1; i <= n; i++) s += t * share[i] / share[1]
      printf "%.2f\n", s
    }'
}
declare -A alone_sum=()
if ((alone)); then
  for t in "${topos[@]}"; do
    echo "geo_bench: $t: the first node alone ($steps steps) ..." >&2
    v=$(run_one "$t-alone" "even+none" 1 "" "$(alone_file "$t")")
    alone_sum[$t]=$(node_rates "$t" "${v%% *}")
    echo "geo_bench: $t: first node alone: $v; all nodes alone: ${alone_sum[$t]} tokens/s" >&2
  done
fi
# efficiency TOPOLOGY TPS: "hw eff %" of a run.
efficiency() {
  local sum=${alone_sum[$1]:-n/a}
  awk -v t="$2" -v s="$sum" 'BEGIN { if (s == "n/a" || s <= 0 || t <= 0) print "n/a"; else printf "%.1f\n", 100 * t / s }'
}

declare -A result=()
# Topologies with each slow rate: "sites-3" or "sites-3@8".
cases=()
for t in "${topos[@]}"; do for m in "${slows[@]}"; do cases+=("$t${m:+@$m}"); done; done
for r in $(seq 1 "$rounds"); do
  order=("${confs[@]}")
  if ((r % 2 == 0)); then order=(); for ((i = ${#confs[@]} - 1; i >= 0; i--)); do order+=("${confs[$i]}"); done; fi
  for k in "${cases[@]}"; do
    t=${k%@*} m=""; [[ $k == *@* ]] && m=${k#*@}
    for p in "${order[@]}"; do
      echo "geo_bench: round $r: $k $p ($steps steps) ..." >&2
      v=$(run_one "$t" "$p" "$r" "$m")
      result[$k,$p,$r]=$v
      echo "geo_bench: round $r: $k $p: $v (tokens/s, predicted s, measured s, error %, others %, caps)" >&2
    done
  done
done

# ---- table ---------------------------------------------------------------------------------------
{
  echo
  echo "placement and compression on emulated sites: $(basename "$run" .ini)${batch[0]:+ (${batch[0]#--})}${micro[0]:+ (${micro[0]#--})}, $steps steps, means over steps" \
       "$((warmup + 1))-$steps; $rounds round(s), config order alternating; TOPOLOGY@R: slowest links at R Mbit/s"
  printf "%-20s %-24s %5s %10s %9s %12s %12s %8s %8s\n" topology config round tokens/s "hw eff %" "pred step s" \
         "meas step s" "error %" "others %"
  marked=0 uncapped=0
  for k in "${cases[@]}"; do
    for r in $(seq 1 "$rounds"); do
      for p in "${confs[@]}"; do
        v=${result[$k,$p,$r]}
        if [[ $v == failed ]]; then
          printf "%-20s %-24s %5s %10s   (failed: see %s)\n" "$k" "$p" "$r" - "$out"; continue
        fi
        read -r tps pred meas err others caps <<<"$v"
        mark=""
        if [[ $others != n/a ]] && ((others > 10)); then mark="*"; marked=1; fi
        if [[ $caps == uncapped ]]; then mark+="u"; uncapped=1; fi
        printf "%-20s %-24s %5s %10s %9s %12s %12s %8s %8s\n" "$k" "$p" "$r" "$tps$mark" "$(efficiency "${k%@*}" "$tps")" \
               "$pred" "$meas" "$err" "$others"
      done
    done
  done
  echo
  echo "tokens/s against ${confs[0]} (mean of the per-round ratios):"
  result_line="RESULT"
  for k in "${cases[@]}"; do
    line=$(printf "  %-20s" "$k")
    for p in "${confs[@]:1}"; do
      ratios=()
      for r in $(seq 1 "$rounds"); do
        e=${result[$k,${confs[0]},$r]} o=${result[$k,$p,$r]}
        [[ $e == failed || $o == failed ]] && continue
        ratios+=("$(awk -v o="${o%% *}" -v e="${e%% *}" 'BEGIN { if (e > 0 && o > 0) printf "%.3f", o / e; else print "n/a" }')")
      done
      mean="n/a"
      ((${#ratios[@]})) && mean=$(printf '%s\n' "${ratios[@]}" |
        awk '$1 != "n/a" { s += $1; n++ } END { if (n) printf "%.2fx", s / n; else print "n/a" }')
      line+=$(printf "  %s %-8s" "$p" "$mean")
      result_line+=" ${k}_${p}_ratio=${mean%x}"
    done
    echo "$line"
  done
  echo "$result_line"
  ((marked == 0)) || echo "* other processes took more than 10% of the CPUs during that run: not valid"
  ((uncapped == 0)) || echo "u the nodes' CPU caps were NOT enforced in that run (see its log)"
  if ((alone)); then
    for t in "${topos[@]}"; do echo "hw eff % of $t: tokens/s over ${alone_sum[$t]} (every node alone, from its first node's run)"; done
  fi
  echo "runs: $out"
} | tee "$out/table.txt"
