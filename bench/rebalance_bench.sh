#!/usr/bin/env bash
# The scheduler against a changing world (docs/migration.md): the README's main job (the d256
# character GPT over three emulated sites, configs/clusters/sites-3.pbtxt, every node capped at
# 0.6 of a core) trains while this script throttles the node that runs the most ops to 0.2 of a
# core at step --slow-at (scripts/sites.sh throttle) and gives it its 0.6 back at step
# --restore-at. It then reads the metrics: how many steps the scheduler took to move work off the
# throttled node, tokens/s before the throttle, throttled, and after the move against the
# estimator's prediction for the new placement, and what happened after the restore. The
# tokens/s timeline goes to a plot (scripts/plot.sh; migrations marked).
#
#   bench/rebalance_bench.sh [--steps N] [--slow-at S] [--restore-at S] [--every N]
#                            [--confirmations K] [--plot OUT.png] [--build DIR] [--smoke]
#
# --smoke: 60 steps, throttle at 25, restore at 45, every 2 steps, 1 confirmation (the ctest
# bench_smoke_rebalance_bench; skipped, 77, without root).
# Defaults: 200 steps, throttle at 40, restore at 120, scheduler.every=5, confirmations=2 (the
# run's defaults, 10 and 3, react in 30 steps, too slow to show in a short run), plot
# bench/rebalance_timeline.png. Needs root (namespaces, tc, cgroups). Logs in a temporary directory.
set -Eeuo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
steps=200 slow_at=40 restore_at=120 every=5 confirmations=2 plot=bench/rebalance_timeline.png build=$repo/build
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --slow-at) slow_at=$2; shift 2 ;;
    --restore-at) restore_at=$2; shift 2 ;;
    --every) every=$2; shift 2 ;;
    --confirmations) confirmations=$2; shift 2 ;;
    --plot) plot=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --smoke) steps=60 slow_at=25 restore_at=45 every=2 confirmations=1 smoke=1 plot=/tmp/rebalance_smoke.png; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "rebalance_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $(id -u) -eq 0 ]] || { echo "rebalance_bench.sh: needs root (network namespaces, tc, cgroups)" >&2; ((${smoke:-0})) && exit 77; exit 1; }
work=$(mktemp -d /tmp/fusion-rebalance-bench.XXXXXX)
tag=frb port=$((20000 + RANDOM % 20000)) metrics=$work/metrics.jsonl
admin() { "$build/apps/fusion-admin" "127.0.0.1:$port" --security.certs="$work/certs" --json --timeout 60 -c "$1"; }
# The last step record of the metrics, read as JSON (a line still being written is left out).
last_step() {
  # (pipefail: a metrics file not written yet must not add a second "0")
  { tail -n 4 "$metrics" 2>/dev/null || true; } | python3 -c '
import json, sys
step = 0
for line in sys.stdin:
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if r.get("type") == "step":
        step = r["step"]
print(step)'
}
FUSION_BIN=$build/apps scripts/run-sites.sh --cluster configs/clusters/sites-3.pbtxt --run configs/runs/char-sites.ini \
  --tag "$tag" --subnet 10.79.0 --logs "$work" --certs "$work/certs" -- \
  --train.steps="$steps" --train.eval-every=0 --output.checkpoint= --output.metrics="$metrics" \
  --output.sample-chars=0 --scheduler.every="$every" --scheduler.confirmations="$confirmations" \
  --admin.port="$port" >"$work/run.log" 2>&1 &
run=$!
# Background jobs ignore SIGINT, and run-sites.sh waits for fusion-train: stop that one.
trap 'pkill -TERM -P $run -x fusion-train 2>/dev/null; wait $run 2>/dev/null || true' EXIT
echo "rebalance_bench: $steps steps, throttle at step $slow_at, restore at $restore_at; logs in $work" >&2
wait_step() {
  while (($(last_step) < $1)); do
    kill -0 $run 2>/dev/null || { echo "rebalance_bench: the run ended early, see $work/run.log" >&2; tail -5 "$work/run.log" >&2; exit 1; }
    sleep 0.5
  done
}
wait_step "$slow_at"
slow=$(admin placement | python3 -c '
import collections, json, sys
ops = json.load(sys.stdin)["ops"]
print(collections.Counter(o["node"] for o in ops if o["op"] not in ("tokens", "targets")).most_common(1)[0][0])')
scripts/sites.sh throttle "$slow" 0.2 --tag "$tag" >&2
echo "rebalance_bench: throttled $slow to 0.2 core at step $(last_step)" >"$work/events"
wait_step "$restore_at"
scripts/sites.sh throttle "$slow" 0.6 --tag "$tag" >&2
echo "rebalance_bench: restored $slow to 0.6 core at step $(last_step)" >>"$work/events"
wait $run || { echo "rebalance_bench: the run failed, see $work/run.log" >&2; exit 1; }
trap - EXIT
cat "$work/events" >&2
python3 - "$metrics" "$work/events" "$slow" <<'PY'
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
events = open(sys.argv[2]).read()
slow_at, restore_at = [int(x) for x in re.findall(r"at step (\d+)", events)]
steps = {r["step"]: r for r in rows if r.get("type") == "step"}
migs = [r for r in rows if r.get("type") == "migration" and r.get("ok")]
verdicts = [r for r in rows if r.get("type") == "schedule"]
def tps(a, b):
    v = [steps[s]["tokens_per_s"] for s in range(a, b) if s in steps]
    return statistics.median(v) if v else float("nan")
def predicted_tps(a, b):
    v = [steps[s]["tokens_per_s"] * steps[s]["step_s"] / steps[s]["predicted_step_s"]
         for s in range(a, b) if s in steps and steps[s].get("predicted_step_s", 0) > 0]
    return statistics.median(v) if v else float("nan")
print("| phase | steps | tokens/s (median) | predicted tokens/s |")
print("|---|---|---|---|")
print("| before the throttle | %d-%d | %.0f | %.0f |" % (slow_at - 20, slow_at, tps(slow_at - 20, slow_at), predicted_tps(slow_at - 20, slow_at)))
# A move at the throttle's own step boundary was decided before the throttle: not a reaction.
after = [m for m in migs if slow_at < m["step"] < restore_at]
first = after[0]["step"] if after else None
end_throttled = first if first else restore_at
print("| throttled, before the move | %d-%d | %.0f | %.0f |" % (slow_at, end_throttled, tps(slow_at + 1, end_throttled + 1), predicted_tps(slow_at + 1, end_throttled + 1)))
if first:
    last = after[-1]["step"]
    a, b = last + 3, restore_at
    if a >= b - 1:  # the scheduler kept moving until the restore: measure after the first move
        a = min(first + 3, b - 1)
    m, p = tps(a, b), predicted_tps(a, b)
    print("| after the move(s) | %d-%d | %.0f | %.0f |" % (a, b, m, p))
back = [m for m in migs if m["step"] >= restore_at]
a = (back[-1]["step"] + 3) if back else restore_at + 3
if a >= max(steps):  # moves went on to the end: measure from the first one after the restore
    a = min((back[0]["step"] if back else restore_at) + 3, max(steps))
print("| after the restore | %d-%d | %.0f | %.0f |" % (a, max(steps), tps(a, max(steps) + 1), predicted_tps(a, max(steps) + 1)))
print()
if first:
    print("throttled %s at step %d; first migration at step %d (%d steps later): %s" % (sys.argv[3], slow_at, first, first - slow_at, after[0]["moves"]))
    print("after the move(s): measured/predicted tokens/s = %.2f" % (m / p))
else:
    print("throttled %s at step %d: no migration before the restore" % (sys.argv[3], slow_at))
for m in back:
    print("after the restore, step %d: %s (%s)" % (m["step"], m["moves"], m["reason"]))
if not back:
    last_v = [v for v in verdicts if v["step"] >= restore_at]
    print("after the restore: no migration; last verdict: %s" % (last_v[-1]["reason"] if last_v else "none"))
print("RESULT before_tokens_per_s=%.1f throttled_tokens_per_s=%.1f after_restore_tokens_per_s=%.1f migrations=%d"
      % (tps(slow_at - 20, slow_at), tps(slow_at + 1, end_throttled + 1), tps(a, max(steps) + 1), len(migs)))
print("verdicts: %s" % " ".join("%d:%s" % (v["step"], v["verdict"]) for v in verdicts))
PY
# The estimator must have followed both quota changes (op times under a quota are CPU times,
# which a throttle leaves alone): without it the scheduler never sees the throttle.
for q in 0.20 0.60; do
  grep -q "node '$slow' (site [a-z0-9_-]*): CPU quota now $q core" "$work/run.log" ||
    { echo "rebalance_bench: the coordinator never logged $slow's CPU quota of $q core, see $work/run.log" >&2; exit 1; }
done
scripts/plot.sh "$metrics" "$plot" >&2
