#!/usr/bin/env bash
# Recovery soak (issue 31): the main job (configs/runs/bpe-sites.ini: gpt-bpe-small on KJV BPE
# shards) on 3 fusion-node processes over loopback (mutual TLS, no namespaces, no shaping, one
# actor thread per node), with peer-held snapshots and checkpoints on. In the same invocation:
#   1. an undisturbed run of STEPS steps (the reference);
#   2. the same run with a node SIGKILLed at K seeded random steps and started again RESTART
#      seconds after its recovery record under the same name, so that it rejoins (docs/recovery.md).
#
#   bench/recovery_bench.sh [--steps 400] [--kills 5] [--seed 1] [--snapshot-every 10]
#                           [--checkpoint-every 100] [--restart-after 3] [--config FILE.ini]
#                           [--build build] [--out DIR] [--smoke]
#
# --smoke: gpt-char-tiny (configs/runs/char-tiny.ini, unless --config is given), 400 steps, 2
# kills, snapshots every 5 steps, checkpoint every 50, one evaluation of 2 batches at the end
# (the ctest bench_smoke_recovery_bench, about a minute); the same checks but the 2% one.
#
# Kill steps are drawn from --seed, at least 2 x snapshot-every apart, none in the first or the
# last 2 x snapshot-every steps. A kill waits for the previous victim to have rejoined (its "join"
# record) and for 2 x snapshot-every steps after the last plan change (recovery, join, migration):
# snapshots of a plan that changed are made again in the background, and a loss before the first
# of them falls back to the checkpoint (docs/recovery.md). The victim is drawn from the nodes that
# hold operators: those whose ops stream snapshots, in fusion-train's last "peer snapshots every"
# log line (a node without ops costs nothing to lose).
#
# Read from the metrics (JSON lines, parsed): every recovery record, tabulated (node, detected at,
# state from where, steps lost, seconds to resume); both runs' final validation loss and their
# relative difference; goodput = STEPS / wall time of the soak against the reference's.
# Exit 1 when a check fails: a run that does not finish, a kill without its recovery record or a
# victim that does not rejoin, steps lost above snapshot-every, or (full runs, not --smoke) a final
# validation loss more than 2% from the reference's. Everything stays in DIR (default a fresh
# /tmp/fusion-recovery-bench.XXXX): metrics, logs of fusion-train and of every node, kills.tsv.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/bench_lib.sh
steps=400 kills=5 seed=1 snap=10 ckpt_every=100 restart_after=3 config=configs/runs/bpe-sites.ini
build=${BUILD_DIR:-build} out="" smoke=0 val_limit=2 config_given=0
need_value() { [[ $# -ge 2 && -n "$2" ]] || { echo "recovery_bench: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) need_value "$@"; steps=$2; shift 2 ;;
    --kills) need_value "$@"; kills=$2; shift 2 ;;
    --seed) need_value "$@"; seed=$2; shift 2 ;;
    --snapshot-every) need_value "$@"; snap=$2; shift 2 ;;
    --checkpoint-every) need_value "$@"; ckpt_every=$2; shift 2 ;;
    --restart-after) need_value "$@"; restart_after=$2; shift 2 ;;
    --config) need_value "$@"; config=$2; config_given=1; shift 2 ;;
    --build) need_value "$@"; build=$2; shift 2 ;;
    --out) need_value "$@"; out=$2; shift 2 ;;
    --smoke) smoke=1; shift ;;
    -h|--help) awk 'NR == 1 { next } !/^#/ { exit } { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "recovery_bench: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
if ((smoke)); then
  # Long enough for two kills and a rejoin between them however fast the steps run: gpt-char-tiny
  # steps take 20-70 ms on loopback, and a rejoin (restart, profiling, admission) 2-3 s.
  steps=400 kills=2 snap=5 ckpt_every=50 restart_after=1
  ((config_given)) || config=configs/runs/char-tiny.ini
  smoke_note recovery_bench
fi
for v in steps kills snap ckpt_every seed; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "recovery_bench: --${v//_/-} wants a whole number, got '${!v}'" >&2; exit 2; }
done
[[ $restart_after =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "recovery_bench: --restart-after wants seconds, got '$restart_after'" >&2; exit 2; }
((snap > 0)) || { echo "recovery_bench: --snapshot-every must be at least 1" >&2; exit 2; }
[[ -f $config ]] || { echo "recovery_bench: config $config not found" >&2; exit 2; }
bin=$build/apps
for b in fusion-train fusion-node fusion-cluster; do
  [[ -x $bin/$b ]] || { echo "recovery_bench: $bin/$b not found (build first: scripts/build.sh)" >&2; exit 2; }
done
shards=$(ini_path data shards "")
if [[ -n $shards && ! -d $shards ]]; then
  echo "recovery_bench: the config's token shards $shards are missing (make them: scripts/prepare-bpe.sh)" >&2
  exit 2
fi
if [[ -z $out ]]; then out=$(mktemp -d /tmp/fusion-recovery-bench.XXXX); fi
mkdir -p "$out"
out=$(cd "$out" && pwd)

# A free coordinator port, so that the run shares no fixed port with other loopback runs.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cluster=$out/cluster.pbtxt
cat >"$cluster" <<EOF
# recovery_bench: three sites of one CPU node each on loopback; placement by OP-Fence as the main job.
name: "recovery-bench"
coordinator { host: "127.0.0.1" port: $port }
site { name: "a" }
site { name: "b" }
site { name: "c" }
node { name: "a1" site: "a" device: "cpu" }
node { name: "b1" site: "b" device: "cpu" }
node { name: "c1" site: "c" device: "cpu" }
EOF
nodes=(a1 b1 c1)
declare -A site_of=([a1]=a [b1]=b [c1]=c)
"$bin/fusion-cluster" certs "$cluster" --out "$out/certs" --force >/dev/null

# The kill steps, seeded (python's Mersenne Twister: the same on every machine).
gap=$((2 * snap))
kill_steps=$(python3 - "$steps" "$kills" "$seed" "$gap" <<'PY'
import random, sys
steps, kills, seed, gap = map(int, sys.argv[1:])
lo, hi = gap, steps - gap
if kills == 0:
    sys.exit(0)
if hi - lo < (kills - 1) * gap:
    print("recovery_bench: %d kills at least %d steps apart do not fit in steps %d-%d: "
          "give more --steps or fewer --kills" % (kills, gap, lo, hi), file=sys.stderr)
    sys.exit(2)
rng = random.Random(seed)
while True:
    ks = sorted(rng.sample(range(lo, hi + 1), kills))
    if all(b - a >= gap for a, b in zip(ks, ks[1:])):
        break
# Each kill comes a seeded fraction of a step after its step's record: mid-step, not at a boundary.
print(" ".join("%d:%.2f" % (k, rng.random()) for k in ks))
PY
)
victim_rng_state=$seed

common=(--config "$config" --cluster "$cluster" --cluster.listen="127.0.0.1:$port" --security.certs="$out/certs"
        --train.steps="$steps" --recovery.mode=auto --recovery.snapshot-every="$snap"
        --output.checkpoint-every="$ckpt_every" --output.sample-chars=0 --runtime.quiet --force)
((smoke)) && common+=(--train.eval-every=0 --train.eval-batches=2)

declare -A node_pid=()
train_pid=""
cleanup() {
  local p
  for p in "${node_pid[@]}" $train_pid; do kill "$p" 2>/dev/null || true; done
  for p in "${node_pid[@]}" $train_pid; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_node() {  # start_node RUN NODE: (re)starts NODE of run RUN, its log appended to RUN/NODE.log
  local run=$1 n=$2
  "$bin/fusion-node" --config configs/nodes/site-a.ini --node.name="$n" --node.site="${site_of[$n]}" \
    --node.device=cpu --node.coordinator="127.0.0.1:$port" --node.host=127.0.0.1 --runtime.threads=1 \
    --security.certs="$out/certs" >>"$out/$run/$n.log" 2>&1 &
  node_pid[$n]=$!
}

# await_metrics METRICS WANT_REC WANT_JOIN STEP GAP FRAC TIMEOUT: waits, reading the metrics file as
# it grows (one process: a python start costs 0.3-1 s here, several steps of the smoke run), until
# the run has WANT_REC recovery and WANT_JOIN join records, has done STEP steps and GAP steps
# since its last plan change (recovery, join, migration; GAP 0: not asked); then FRAC of the last step's time more.
# Prints "ok STEP" (the steps done then), "ended STEP" when fusion-train exits first or
# "timeout STEP" after TIMEOUT seconds.
await_metrics() {
  python3 - "$train_pid" "$@" <<'PY'
import json, os, sys, time
pid, path = int(sys.argv[1]), sys.argv[2]
want_rec, want_join, want_step, gap = map(int, sys.argv[3:7])
frac, timeout = float(sys.argv[7]), float(sys.argv[8])
step = rec = joins = change = 0
step_s, buf, pos = 0.0, b"", 0

def alive():  # a zombie (exited, not yet reaped by the script) counts as gone
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

def read_new():
    global step, step_s, rec, joins, change, buf, pos
    try:
        with open(path, "rb") as f:
            f.seek(pos)
            data = f.read()
    except FileNotFoundError:
        return
    pos += len(data)
    lines = (buf + data).split(b"\n")
    buf = lines.pop()  # the line being written
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        t = r.get("type")
        if t == "step":
            step, step_s = r["step"], r.get("step_s", 0.0)
        elif t == "recovery":
            rec += 1; change = r["step"]
        elif t == "join":
            joins += 1; change = r["step"]
        elif t == "migration" and r.get("ok"):
            change = r["step"]

deadline = time.monotonic() + timeout
while True:
    read_new()
    if rec >= want_rec and joins >= want_join and step >= want_step and (gap == 0 or step >= change + gap):
        break
    if not alive():
        read_new()
        print("ended", step); sys.exit(0)
    if time.monotonic() > deadline:
        print("timeout", step); sys.exit(0)
    time.sleep(0.02)
if frac > 0:
    time.sleep(frac * step_s)
    read_new()
print("ok", step)
PY
}

# run_job NAME DISTURB: one training run; with DISTURB=1 the kills. Sets wall_s.
wall_s=0
run_job() {
  local run=$1 disturb=$2 m=$out/$1/metrics.jsonl
  rm -rf "${out:?}/$run"
  mkdir -p "$out/$run"
  node_pid=()
  for n in "${nodes[@]}"; do start_node "$run" "$n"; done
  local t0 t1
  t0=$(date +%s.%N)
  "$bin/fusion-train" "${common[@]}" --output.metrics="$m" --output.checkpoint="$out/$run/checkpoints" \
    >"$out/$run/train.log" 2>&1 &
  train_pid=$!
  if ((disturb)); then soak "$run" "$m"; fi
  local rc=0
  wait "$train_pid" || rc=$?
  train_pid=""
  t1=$(date +%s.%N)
  wall_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  # Nodes leave when the run ends; one started again too late to be admitted would wait for
  # its join-timeout: stopped after 15 s.
  local n i
  for n in "${!node_pid[@]}"; do
    for ((i = 0; i < 75; i++)); do kill -0 "${node_pid[$n]}" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "${node_pid[$n]}" 2>/dev/null; then
      echo "recovery_bench: node $n still runs 15 s after the $run run ended: stopped" >&2
      kill "${node_pid[$n]}" 2>/dev/null || true
    fi
    wait "${node_pid[$n]}" 2>/dev/null || true
  done
  node_pid=()
  if ((rc != 0)); then
    echo "recovery_bench: the $run run exited $rc; see $out/$run/train.log:" >&2
    tail -n 5 "$out/$run/train.log" >&2
    exit 1
  fi
  echo "recovery_bench: $run run: $steps steps in $wall_s s" >&2
}

# holders_of LOG: the nodes whose ops have snapshot holders, from the last "peer snapshots every N
# step(s), each node's ops to its buddy: a1 (site a) -> b1 (site b), ..." line of fusion-train.
holders_of() {
  grep -a 'peer snapshots every' "$1" | tail -n 1 | sed 's/.*to its buddy: //' | tr ',' '\n' |
    awk '$4 == "->" { print $1 }' | sort -u
}

# soak RUN METRICS: the kills, while fusion-train runs; one line per kill in kills.tsv.
soak() {
  local run=$1 m=$2 kf k frac state step victim want_rec=0 want_join=0 killed_at restarted_at
  local -a holders
  printf "kill_step\tnode\tkilled_at_step\tkilled_at\trestarted_at\n" >"$out/kills.tsv"
  for kf in $kill_steps; do
    k=${kf%:*} frac=${kf#*:}
    read -r state step < <(await_metrics "$m" "$want_rec" "$want_join" "$k" "$gap" "$frac" 86400)
    case $state in
      ok) ;;
      ended) echo "recovery_bench: the run ended at step $step before the kill at step $k" >&2
             return ;;
      *) echo "recovery_bench: FAIL: could not follow $m before the kill at step $k" >&2
         exit 1 ;;
    esac
    holders=($(holders_of "$out/$run/train.log"))
    ((${#holders[@]})) || holders=("${nodes[@]}")
    victim_rng_state=$(( (victim_rng_state * 1103515245 + 12345) % 2147483648 ))
    victim=${holders[$(( victim_rng_state / 65536 % ${#holders[@]} ))]}
    kill -KILL "${node_pid[$victim]}"
    wait "${node_pid[$victim]}" 2>/dev/null || true
    killed_at=$(date -u +%H:%M:%S.%N | cut -c1-12)
    echo "recovery_bench: step $step: node $victim SIGKILLed (kill step $k)" >&2
    want_rec=$((want_rec + 1))
    read -r state _ < <(await_metrics "$m" "$want_rec" 0 0 0 0 120)
    case $state in
      ended) echo "recovery_bench: FAIL: the run ended before it recorded the recovery from killing $victim at step $step" >&2
             exit 1 ;;
      ok) ;;
      timeout) echo "recovery_bench: FAIL: no recovery record within 120 s of killing $victim at step $step" >&2
               exit 1 ;;
      *) echo "recovery_bench: FAIL: could not follow $m after killing $victim" >&2
         exit 1 ;;
    esac
    sleep "$restart_after"
    start_node "$run" "$victim"
    restarted_at=$(date -u +%H:%M:%S.%N | cut -c1-12)
    want_join=$((want_join + 1))
    printf "%s\t%s\t%s\t%s\t%s\n" "$k" "$victim" "$step" "$killed_at" "$restarted_at" >>"$out/kills.tsv"
  done
}

echo "recovery_bench: $steps steps, snapshots every $snap, checkpoint every $ckpt_every; kills at steps $kill_steps" \
  "(step:fraction of a step after its record; seed $seed); in $out" >&2
run_job reference 0
ref_wall=$wall_s
run_job soak 1
soak_wall=$wall_s

python3 - "$out" "$steps" "$snap" "$ref_wall" "$soak_wall" "$smoke" "$val_limit" "$kills" <<'PY'
import csv, json, sys
out, steps, snap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ref_wall, soak_wall, smoke, limit, kills = float(sys.argv[4]), float(sys.argv[5]), sys.argv[6] == "1", float(sys.argv[7]), int(sys.argv[8])

def records(run):
    return [json.loads(l) for l in open("%s/%s/metrics.jsonl" % (out, run)) if l.strip()]

ref, soak = records("reference"), records("soak")
done = list(csv.DictReader(open(out + "/kills.tsv"), delimiter="\t"))
recs = [r for r in soak if r.get("type") == "recovery"]
joins = [r for r in soak if r.get("type") == "join"]
fail = []

print()
print("Recoveries (soak run, from its metrics' recovery records)")
# A plain table: its text columns would read as missing numbers in a markdown row.
row = "%-3s %-5s %14s %13s %13s %-10s %12s %10s %11s"
print(row % ("#", "node", "killed at step", "detected at", "detected step", "state from", "resumed from", "steps lost",
             "s to resume"))
for i, r in enumerate(recs):
    kill = done[i] if i < len(done) else {}
    lost = r["steps_lost"]
    print(row % (i + 1, ",".join(r["nodes"]), kill.get("killed_at_step", "?"), r["detected_at"][11:23],
                 r["detected_step"], r["state_from"], r["step"], lost, "%.2f" % r["seconds_to_resume"]))
    # A kill while the snapshot of the step just done was still on its way to its buddy falls
    # back to the one before: the interval's steps and the step in flight run again.
    bound = snap + (1 if snap > 0 and r["detected_step"] % snap == 0 else 0)
    if lost > bound:
        fail.append("recovery %d (%s at step %d) lost %d steps, more than the snapshot interval %d allows (state from %s%s)"
                    % (i + 1, ",".join(r["nodes"]), r["detected_step"], lost, snap, r["state_from"],
                       ": " + r["note"] if r.get("note") else ""))
    if kill and kill["node"] not in r["nodes"]:
        fail.append("recovery %d names %s, but %s was killed" % (i + 1, r["nodes"], kill["node"]))
if len(done) < kills:
    fail.append("only %d of %d kills happened before the run ended" % (len(done), kills))
if len(recs) != len(done):
    fail.append("%d kills but %d recovery records" % (len(done), len(recs)))
rejoins = [j for j in joins if j.get("rejoin")]
# The last victim may be killed too late to rejoin before the end; every earlier one must have.
if len(rejoins) < len(done) - 1:
    fail.append("%d victims started again but only %d rejoined" % (len(done), len(rejoins)))

def last_step(rs):
    s = [r["step"] for r in rs if r.get("type") == "step"]
    return s[-1] if s else 0

def final_val(rs):
    e = [r for r in rs if r.get("type") == "eval"]
    return (float(e[-1]["val_loss"]), e[-1]["step"]) if e else (None, None)

for name, rs in (("reference", ref), ("soak", soak)):
    if last_step(rs) != steps:
        fail.append("the %s run's last step record is step %d, not %d" % (name, last_step(rs), steps))
(rv, rstep), (sv, sstep) = final_val(ref), final_val(soak)
if rv is None or sv is None or rstep != steps or sstep != steps:
    fail.append("a final evaluation at step %d is missing (reference %s, soak %s)" % (steps, rstep, sstep))
    rv = sv = rv or sv or 0.0
rel = abs(sv - rv) / rv * 100 if rv else 0.0
if not smoke and rel > limit:
    fail.append("final validation loss %.4f is %.2f%% from the reference's %.4f (limit %g%%)" % (sv, rel, rv, limit))
lost_total = sum(r["steps_lost"] for r in recs)
goodput_ref, goodput_soak = steps / ref_wall, steps / soak_wall

print()
print("Runs: %d useful steps each, %d recoveries, %d steps run again in all" % (steps, len(recs), lost_total))
print("| run | wall s | final val loss | val diff % | goodput steps/s | goodput ratio |")
print("|---|---|---|---|---|---|")
print("| undisturbed (reference) | %.1f | %.4f | 0.00 | %.3f | 1.000 |" % (ref_wall, rv, goodput_ref))
print("| %d kills + rejoins | %.1f | %.4f | %.2f | %.3f | %.3f |" % (len(done), soak_wall, sv, rel, goodput_soak, goodput_soak / goodput_ref))
mx = max([r["steps_lost"] for r in recs] or [0])
resume = [r["seconds_to_resume"] for r in recs] or [0]
print("RESULT steps=%d kills=%d recoveries=%d rejoins=%d max_steps_lost=%d snapshot_every=%d max_resume_s=%.2f "
      "ref_val=%.4f soak_val=%.4f val_diff_pct=%.2f ref_wall_s=%.1f soak_wall_s=%.1f goodput_ratio=%.3f" % (
          steps, len(done), len(recs), len(rejoins), mx, snap, max(resume), rv, sv, rel, ref_wall, soak_wall,
          goodput_soak / goodput_ref))
for f in fail:
    print("recovery_bench: FAIL: " + f, file=sys.stderr)
print("recovery_bench: %s (metrics and logs in %s)" % ("FAIL" if fail else "PASS: every check held", out), file=sys.stderr)
sys.exit(1 if fail else 0)
PY
