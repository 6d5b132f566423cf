#!/usr/bin/env bash
# Local steps against synchronous replicas across a slow link: gpt-char-small
# (configs/runs/char-sites.ini) as ONE stage with two replicas, a1 and b1 of
# configs/clusters/sites-2-slow.pbtxt (20 Mbit/s between them), in one run of this script:
#   step      train.sync=step: the replicas all-reduce their gradients every step;
#   local:H   train.sync=local:H (default H 20): each replica steps alone, every H steps they
#             average their parameter change and take DiLoCo's outer Nesterov step (0.7, 0.9).
# Both see the same batches (same seed, same global batch, so equal tokens at every step).
# Reported: validation loss every --eval-every steps (8 batches), tokens/s over the steps after
# the first 5, and all-reduce bytes per step (every replica's ring bytes, the step records'
# allreduce_bytes; for local:H the bytes of a sync x steps // H syncs / steps, since a sync is
# recorded with the step after it).
# Needs root with network namespaces (scripts/run-sites.sh); refuses on loopback.
#
#   bench/diloco_bench.sh [--steps 600] [--eval-every 200] [--sync-every 20] [--step-loopback]
#                         [--batch ROWS] [--outer LR,MOMENTUM] [--step-from DIR] [--build build]
#                         [--out runs/diloco/STAMP] [--smoke]
#
# --batch sets the global batch of both runs (default the run file's 16 rows, in 4 micro-batches:
# each replica takes half). --outer sets the local run's train.outer-lr and train.outer-momentum
# (default: the run file's, DiLoCo's 0.7 and 0.9); 1,0 is plain parameter averaging every H steps.
# --step-from DIR takes the synchronous run from an earlier output directory of the same steps and
# batch (DIR/step.jsonl: it does not depend on the outer settings) instead of running it again.
# --step-loopback runs the synchronous reference on loopback (scripts/run-sites.sh --loopback:
# same plan, caps, batches and ring, no 20 Mbit/s shaping): its losses and all-reduce bytes do not
# depend on the link (the replicas' exactness, tests/actors/replica_test.cpp), its tokens/s do, so
# the table shows them as n/a. Over the link the synchronous run takes about 10 s a step (two
# hours for 600 steps); on loopback a few minutes.
#
# --smoke: 4 steps, H 2, one evaluation of 2 batches at the end (the ctest bench_smoke_diloco_bench;
# without namespaces it exits 77, skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=600 eval_every=200 eval_batches=8 sync_every=20 build=${BUILD_DIR:-build} out="" smoke=0 step_loopback=0 outer=() step_from="" batch=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --eval-every) eval_every=$2; shift 2 ;;
    --sync-every) sync_every=$2; shift 2 ;;
    --step-loopback) step_loopback=1; shift ;;
    --outer)
      [[ $2 =~ ^([0-9]+(\.[0-9]+)?),([0-9]+(\.[0-9]+)?)$ ]] ||
        { echo "diloco_bench: --outer needs LR,MOMENTUM (numbers), got '$2'" >&2; exit 2; }
      lr=${BASH_REMATCH[1]} mom=${BASH_REMATCH[3]}  # fusion-train wants a decimal point: 1 -> 1.0
      [[ $lr == *.* ]] || lr+=.0
      [[ $mom == *.* ]] || mom+=.0
      outer=(--train.outer-lr="$lr" --train.outer-momentum="$mom"); shift 2 ;;
    --step-from) step_from=$2; shift 2 ;;
    --batch)
      [[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "diloco_bench: --batch needs a row count >= 1, got '$2'" >&2; exit 2; }
      batch=(--train.batch="$2"); shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --smoke) steps=4 eval_every=4 eval_batches=2 sync_every=2 smoke=1; shift ;;
    -h|--help) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "diloco_bench: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
for v in "$steps" "$eval_every" "$sync_every"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "diloco_bench: step counts must be integers >= 1" >&2; exit 2; }
done
for b in fusion-train fusion-node fusion-cluster; do
  [[ -x $build/apps/$b ]] || { echo "diloco_bench: $build/apps/$b not found (build it, or --build DIR)" >&2; exit 2; }
done
if ! why=$(scripts/sites.sh check 2>&1); then
  echo "diloco_bench: refusing to run: $why (the slow link exists only as a shaped namespace link)" >&2
  ((smoke)) && exit 77  # ctest: skipped, with the reason above
  exit 3
fi
export FUSION_BIN=$build/apps FUSION_CLUSTER_BIN=$build/apps/fusion-cluster
out=${out:-runs/diloco/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
# sites-2-slow with every op on a1 and a replica on b1: one stage, its ring across the link.
cluster=$out/sites-2-slow-replicas.pbtxt run=configs/runs/char-sites.ini
sed 's/^placement .*$/placement { policy: "explicit" assign { node: "a1" replica: "b1" ops: "*" } }/' \
  configs/clusters/sites-2-slow.pbtxt >"$cluster"
common=(--train.eval-every="$eval_every" --train.eval-batches="$eval_batches" --output.sample-chars=0 --output.checkpoint=
        --compression.mode=none --runtime.quiet "${batch[@]}")

# sites NAME [--loopback] ARGS...: a run over the emulated sites (or loopback), metrics in $out/NAME.jsonl.
sites() {
  local name=$1 where=(); shift
  [[ ${1:-} == --loopback ]] && { where=(--loopback); shift; }
  echo "diloco_bench: $name ($steps steps over $cluster${where:+, on loopback}) ..." >&2
  scripts/run-sites.sh --cluster "$cluster" --run "$run" --tag dil --subnet 10.78.6 --logs "$out/$name.nodes" "${where[@]}" \
    -- --train.steps="$steps" --output.metrics="$out/$name.jsonl" "${common[@]}" "$@" >"$out/$name.log" 2>&1 ||
    { echo "diloco_bench: $name failed (see $out/$name.log)" >&2; exit 1; }
}
if [[ -n $step_from ]]; then
  [[ -f $step_from/step.jsonl ]] || { echo "diloco_bench: --step-from: $step_from/step.jsonl not found" >&2; exit 2; }
  cp "$step_from/step.jsonl" "$out/step.jsonl"
  grep -q 'on loopback' "$step_from/table.txt" 2>/dev/null && step_loopback=1
elif ((step_loopback)); then sites step --loopback --train.sync=step; else sites step --train.sync=step; fi
sites local --train.sync=local:"$sync_every" "${outer[@]}"

python3 - "$out" "$steps" "$eval_every" "$eval_batches" "$sync_every" "$step_loopback" "${outer[*]:-}" <<'PY' | tee "$out/table.txt"
import json, sys
out, steps, every, eval_batches, h = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
step_loopback = sys.argv[6] == "1"  # the reference ran without the slow link: its speed says nothing
outer = " ".join(a.split("=")[1] for a in sys.argv[7].split())  # "1.0 0.0": outer lr and momentum, if set
def rows(name):
    return [json.loads(l) for l in open(f"{out}/{name}.jsonl") if l.strip()]
def val(name):
    return {r["step"]: r["val_loss"] for r in rows(name) if r.get("type") == "eval"}
def tps(name, warm=1 if steps < 20 else 5):
    st = sorted((r for r in rows(name) if r.get("type") == "step"), key=lambda r: r["step"])
    base = [r for r in st if r["step"] <= warm]; meas = [r for r in st if r["step"] > warm]
    wall = meas[-1]["elapsed_s"] - (base[-1]["elapsed_s"] if base else 0)
    return sum(r["tokens_per_s"] * r["step_s"] for r in meas) / wall
def bytes_per_step(name):
    st = [r for r in rows(name) if r.get("type") == "step"]
    if name == "step":
        return sum(r.get("allreduce_bytes", 0) for r in st) / len(st)
    # A sync's bytes come with the next step's record, so the sync after the last step is not
    # recorded: bytes per sync (the records that carry one) x the run's syncs (steps // H) / steps.
    syncs = [r["allreduce_bytes"] for r in st if r.get("allreduce_bytes", 0) > 0]
    return sum(syncs) / len(syncs) * (steps // h) / steps if syncs else float("nan")
def cell(x, fmt, unit=""):  # a number, or n/a for the loopback reference's speed (nan)
    return "n/a" if x != x else format(x, fmt) + unit
def run_config(name):
    return next(r["config"] for r in rows(name) if r.get("type") == "run")
# --step-from may name a reference of other settings: equal tokens need the same batch and steps.
for key in ("train.batch", "train.steps", "train.micro-batches"):
    a, b = run_config("step").get(key), run_config("local").get(key)
    if a != b:
        sys.exit(f"diloco_bench: the synchronous run has {key}={a}, the local run {b}: not comparable")
batch = run_config("local")["train.batch"]
points = list(range(every, steps + 1, every))
if steps not in points: points.append(steps)
ref_val, ref_tps, ref_bytes = val("step"), float("nan") if step_loopback else tps("step"), bytes_per_step("step")
print(f"gpt-char-small, 1 stage x 2 replicas across sites-2-slow's 20 Mbit/s link, batch {batch}, {steps} steps "
      f"(equal tokens per step); validation loss ({eval_batches} batches) at steps " + ", ".join(map(str, points)))
if step_loopback:
    print("the synchronous reference ran on loopback (--step-loopback): same losses and bytes, its tokens/s n/a")
print()
# Header cells without digits: bench_smoke reads a row with digits as a row of numbers.
print("| sync | " + " | ".join("val" for p in points) + " | tokens/s | x step | all-reduce MB/step | bytes vs step | final vs step |")
print("|---|" + "---|" * (len(points) + 5))
results = []
for name, label in (("step", "step"), ("local", f"local:{h}" + (f" (outer {outer})" if outer else ""))):
    v, t, b = val(name), float("nan") if name == "step" and step_loopback else tps(name), bytes_per_step(name)
    final, ref = v.get(steps, float("nan")), ref_val.get(steps, float("nan"))
    print(f"| {label} | " + " | ".join(f"{v.get(p, float('nan')):.4f}" for p in points) +
          f" | {cell(t, '.0f')} | {cell(t / ref_tps, '.2f', 'x')} | {b / 1e6:.3f} | {b / ref_bytes:.4f} | {(final / ref - 1) * 100:+.2f}% |")
    results.append(f"{name}_tokens_per_s={t:.1f} {name}_final_val_loss={final:.4f} {name}_allreduce_bytes_per_step={b:.0f}")
print()
print("RESULT " + " ".join(results))
PY
echo "runs: $out"
