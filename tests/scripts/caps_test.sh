#!/usr/bin/env bash
# ctest cpu_caps: scripts/run-sites.sh puts a node with a cpu_share into a cgroup with that CPU
# quota for the whole run and removes the cgroup afterwards (loopback: caps need no namespaces).
# A two-node cluster (a1 uncapped, b1 cpu_share 0.5) trains configs/runs/char-tiny.ini:
#  1. a short run: while it runs, fusion-fuscap-b1 exists with quota 50000 per 100000 us and holds
#     b1's fusion-node (and nothing else), a1 has no cgroup; afterwards the run succeeded and the
#     cgroup is gone;
#  2. a long run interrupted like Ctrl-C (SIGINT to its process group) after two steps: b1 was
#     throttled (cpu.stat nr_throttled > 0; on a machine too loaded to give b1 even its half core,
#     it at least never used more than its cap), and the cgroup and the processes are gone after;
#     while it runs, `scripts/sites.sh throttle` caps the uncapped a1 at 0.25 (a new cgroup holding
#     its node, and not a process of the same name from another run) and uncaps b1, and refuses an
#     unknown node;
#  3. --no-caps: no cgroup, and the script says the caps are ignored.
# Without root or without a cgroup cpu controller it says why and exits 77 (ctest: skipped).
#
#   tests/scripts/caps_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=${1:?usage: caps_test.sh SOURCE_DIR BUILD_DIR}
build=${2:?usage: caps_test.sh SOURCE_DIR BUILD_DIR}
export FUSION_BIN=$build/apps FUSION_CLUSTER_BIN=$build/apps/fusion-cluster
tag=fuscap

if [[ $(id -u) -ne 0 ]]; then echo "SKIP: cgroup CPU caps need root (uid $(id -u))"; exit 77; fi
if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
  grep -qw cpu /sys/fs/cgroup/cgroup.controllers || { echo "SKIP: cgroup v2 without the cpu controller"; exit 77; }
  cg=/sys/fs/cgroup/fusion-$tag-b1 cg_a=/sys/fs/cgroup/fusion-$tag-a1
  quota_of() { cat "$1/cpu.max"; }
  want_quota="50000 100000"
elif [[ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]]; then
  cg=/sys/fs/cgroup/cpu/fusion-$tag-b1 cg_a=/sys/fs/cgroup/cpu/fusion-$tag-a1
  quota_of() { echo "$(cat "$1/cpu.cfs_quota_us") $(cat "$1/cpu.cfs_period_us")"; }
  want_quota="50000 100000"
else
  echo "SKIP: no cgroup cpu controller (no /sys/fs/cgroup/cpu, no cgroup v2 with cpu)"; exit 77
fi
[[ -s $src/data/kjv.txt ]] || { echo "SKIP: corpus data/kjv.txt missing (scripts/get-data.sh)"; exit 77; }

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
work=$(mktemp -d)
run_pid=""
cleanup() {
  [[ -n $run_pid ]] && kill -KILL -- -"$run_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

port=$((20000 + RANDOM % 20000))
cat >"$work/caps.pbtxt" <<EOF
name: "caps-test"
coordinator { host: "127.0.0.1" port: $port }
site { name: "a" }
site { name: "b" }
node { name: "a1" site: "a" device: "cpu" }
node { name: "b1" site: "b" device: "cpu" cpu_share: 0.5 }
placement { policy: "even" }
EOF
train_args=(--train.eval-every=0 --train.eval-batches=0 --output.sample-chars=0 --output.checkpoint=
            --runtime.quiet --runtime.step-timeout=60.0)

# start_run LOG STEPS [run-sites options]: runs run-sites.sh in a new session (its own process
# group, SIGINT at its default as in a terminal); sets run_pid.
start_run() {
  local log=$1 steps=$2; shift 2
  rm -f "$work/metrics.jsonl"
  (cd "$src" && exec setsid perl -e '$SIG{INT} = "DEFAULT"; exec @ARGV or die "exec: $!"' \
     scripts/run-sites.sh --loopback --cluster "$work/caps.pbtxt" --run configs/runs/char-tiny.ini --tag "$tag" \
     --logs "$work/nodes" "$@" -- --train.steps="$steps" --output.metrics="$work/metrics.jsonl" "${train_args[@]}") \
     >"$log" 2>&1 &
  run_pid=$!
}
# finish_run SECONDS: waits for the run, killing it after SECONDS; its exit status in $rc.
rc=0
finish_run() {
  for _ in $(seq $(($1 * 10))); do kill -0 "$run_pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$run_pid" 2>/dev/null; then kill -KILL -- -"$run_pid" 2>/dev/null; fail "run killed after $1 s"; fi
  wait "$run_pid"; rc=$?
  run_pid=""
}
leftover_nodes() { pgrep -f "fusion-node.*--node.coordinator=127.0.0.1:$port" | tr '\n' ' '; }

# ---- 1. the cgroup during and after a short run -------------------------------------------------
if [[ -d $cg ]]; then rmdir "$cg" 2>/dev/null || fail "a cgroup $cg from an earlier run cannot be removed"; fi
start_run "$work/run1.log" 3
seen="" quota="" member=""
comm_of() { cat "/proc/$1/comm" 2>/dev/null; }
a1_cg=0
for _ in $(seq 300); do
  [[ -d $cg_a ]] && a1_cg=1
  if [[ -d $cg ]]; then
    procs=$(cat "$cg/cgroup.procs" 2>/dev/null)
    for pid in $procs; do  # the launcher shell execs into the node: wait for the exec
      if [[ $(comm_of "$pid") == fusion-node ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- '--node.name=b1'; then
        member=$pid
      fi
    done
    if [[ -n $member ]]; then
      quota=$(quota_of "$cg" 2>/dev/null)
      for pid in $procs; do [[ $(comm_of "$pid") == fusion-node ]] || seen+="$pid($(comm_of "$pid")) "; done
      break
    fi
  fi
  kill -0 "$run_pid" 2>/dev/null || break
  sleep 0.1
done
((a1_cg == 0)) || fail "uncapped node a1 got a cgroup $cg_a"
finish_run 120
[[ $rc == 0 ]] || { tail -n 20 "$work/run1.log"; fail "run-sites.sh exited $rc"; }
grep -q 'node b1 capped at 0.5 core (cgroup '"$cg"')' "$work/run1.log" || fail "no 'node b1 capped at 0.5 core' line"
[[ -n $member ]] && echo "b1 (pid $member) ran in $cg, quota $quota" || fail "b1's fusion-node never appeared in $cg"
[[ $quota == "$want_quota" ]] || fail "quota of $cg is '$quota', expected '$want_quota'"
[[ -z $seen ]] || fail "processes other than fusion-node in $cg: $seen"
grep -q '"step": 3, "loss"' "$work/metrics.jsonl" 2>/dev/null || fail "run 1 has no step 3 in its metrics"
[[ ! -d $cg ]] || fail "$cg left behind after the run"
[[ -z $(leftover_nodes) ]] || fail "fusion-node processes left behind: $(leftover_nodes)"

# ---- 2. Ctrl-C in the middle of a run -----------------------------------------------------------
start_run "$work/run2.log" 500
steps_seen=0 throttled=""
for _ in $(seq 600); do
  steps_seen=$(grep -c '"type": "step"' "$work/metrics.jsonl" 2>/dev/null); steps_seen=${steps_seen:-0}
  ((steps_seen >= 2)) && break
  kill -0 "$run_pid" 2>/dev/null || break
  sleep 0.1
done
((steps_seen >= 2)) || fail "run 2 did not reach step 2"
# b1 is throttled once it asks for more than its half core in a period. On a machine loaded by
# other work (ctest -j, builds) it may not even get half a core: then nothing can be throttled,
# and the check is whether it used more than its cap without being throttled.
b1_pid=$(head -n 1 "$cg/cgroup.procs" 2>/dev/null)
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
ticks0=$(cpu_ticks "$b1_pid") t0=$(date +%s.%N)
for _ in $(seq 100); do
  throttled=$(awk '$1 == "nr_throttled" { print $2 }' "$cg/cpu.stat" 2>/dev/null)
  [[ ${throttled:-0} -gt 0 ]] && break
  sleep 0.1
done
used=$(awk -v a="$ticks0" -v b="$(cpu_ticks "$b1_pid")" -v t0="$t0" -v t1="$(date +%s.%N)" -v hz="$(getconf CLK_TCK)" \
  'BEGIN { printf "%.2f", (b - a) / hz / (t1 - t0) }')
echo "b1 after $steps_seen steps: nr_throttled ${throttled:-?} ($(grep throttled_ "$cg/cpu.stat" 2>/dev/null | tr '\n' ' ')), using $used core"
if [[ ${throttled:-0} -eq 0 ]]; then
  if awk -v u="$used" 'BEGIN { exit !(u > 0.6) }'; then
    fail "b1 used $used core and was never throttled (nr_throttled '${throttled:-}'): the cap does not hold"
  else
    echo "note: b1 got only $used core of this loaded machine, below its cap: no throttling to observe"
  fi
fi
# A changing world (scripts/sites.sh throttle): cap the uncapped a1 mid-run, uncap b1. A decoy
# named like a fusion-node a1 of another run on this machine (ctest runs tests side by side) must
# stay where it is.
bash -c 'exec -a "fusion-node --node.name=a1" sleep 120' &
decoy=$!
"$src/scripts/sites.sh" throttle a1 0.25 --tag "$tag" 2>>"$work/throttle.log" || fail "throttle a1 0.25: $(cat "$work/throttle.log")"
a1_pid=$(cat "$cg_a/cgroup.procs" 2>/dev/null | head -n 1)
[[ -n $a1_pid ]] && tr '\0' ' ' <"/proc/$a1_pid/cmdline" | grep -q -- '--node.name=a1' ||
  fail "a1's fusion-node is not in $cg_a after throttle"
[[ $(quota_of "$cg_a") == "25000 100000" ]] || fail "quota of $cg_a after throttle: '$(quota_of "$cg_a")'"
grep -qx "$decoy" "$cg_a/cgroup.procs" 2>/dev/null && fail "throttle a1 moved another run's a1 (pid $decoy) into $cg_a"
kill "$decoy" 2>/dev/null; wait "$decoy" 2>/dev/null
"$src/scripts/sites.sh" throttle b1 0 --tag "$tag" 2>>"$work/throttle.log" || fail "throttle b1 0"
[[ $(quota_of "$cg") == "-1 100000" || $(quota_of "$cg") == "max 100000" ]] || fail "b1 not uncapped: '$(quota_of "$cg")'"
"$src/scripts/sites.sh" throttle zz 0.5 --tag "$tag" >/dev/null 2>&1 && fail "throttle of an unknown node accepted"
kill -INT -- -"$run_pid" 2>/dev/null
finish_run 90
echo "interrupted run exited $rc"
[[ ! -d $cg ]] || fail "$cg left behind after Ctrl-C"
[[ ! -d $cg_a ]] || fail "$cg_a (made by throttle) left behind after Ctrl-C"
[[ -z $(leftover_nodes) ]] || fail "fusion-node processes left behind after Ctrl-C: $(leftover_nodes)"

# ---- 3. --no-caps -------------------------------------------------------------------------------
start_run "$work/run3.log" 1 --no-caps
made=0
while kill -0 "$run_pid" 2>/dev/null; do [[ -d $cg ]] && made=1; sleep 0.1; done
finish_run 60
[[ $rc == 0 ]] || { tail -n 20 "$work/run3.log"; fail "run-sites.sh --no-caps exited $rc"; }
((made == 0)) || fail "--no-caps still made $cg"
grep -q -- '--no-caps: the cpu_share of 1 node(s) is ignored' "$work/run3.log" || fail "--no-caps said nothing"

if ((failures > 0)); then echo "$failures failure(s)"; exit 1; fi
echo "cpu_caps: all checks passed"
