#!/usr/bin/env bash
# Convergence and speed of compressed edges: gpt-char-small (configs/runs/char-sites.ini) on
# configs/clusters/sites-2-slow.pbtxt (two sites, one 20 Mbit/s link that the even placement must
# cross), dense vs the codecs of --codecs, in one run of this script:
#   dense       the validation reference: a one-process run of the same config and seed (a dense
#               cluster run computes the same losses: the equality invariant, tests/actors/
#               cluster_test.cpp), or with --dense-full a dense run of --steps steps over the sites
#               under --policy;
#   baseline    tokens/s of --dense-steps dense steps over the sites, even placement, gpipe
#               schedule: what "x dense" divides by;
#   CODEC       --compression.mode=CODEC for --steps steps over the sites under --policy (topk at
#               --compression.ratio=0.1; adatopk, int8 and int4 with their defaults).
# Validation loss every --eval-every steps (8 batches), tokens/s over the steps after the first 5,
# and how many nodes each run used (those with at least a tenth of the busiest node's CPU, from
# the step records' node_cpu_s).
# Needs root with network namespaces (scripts/run-sites.sh); refuses on loopback.
#
#   bench/compression_bench.sh [--steps 600] [--eval-every 200] [--dense-steps 40] [--codecs topk,adatopk]
#                              [--policy even|opfence|opfence-replicas] [--dense-full] [--build build]
#                              [--out runs/compression/STAMP] [--smoke]
#
# Issue 30's comparison: --codecs int8,int4,adatopk --policy opfence --dense-full.
# --smoke: 4 steps, one evaluation of 2 batches at the end, 4 dense steps (the ctest bench_smoke_compression_bench;
# without namespaces it exits 77, skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=600 eval_every=200 eval_batches=8 dense_steps=40 build=${BUILD_DIR:-build} out="" smoke=0
codecs=topk,adatopk policy="" dense_full=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --eval-every) eval_every=$2; shift 2 ;;
    --dense-steps) dense_steps=$2; shift 2 ;;
    --codecs) codecs=$2; shift 2 ;;
    --policy) policy=$2; shift 2 ;;
    --dense-full) dense_full=1; shift ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --smoke) steps=4 eval_every=4 eval_batches=2 dense_steps=4 smoke=1; shift ;;
    -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "compression_bench: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
for v in "$steps" "$eval_every" "$dense_steps"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "compression_bench: step counts must be integers >= 1" >&2; exit 2; }
done
IFS=, read -r -a codec_list <<<"$codecs"
for c in "${codec_list[@]}"; do
  [[ $c =~ ^(topk|adatopk|int8|int4)$ ]] ||
    { echo "compression_bench: --codecs takes topk, adatopk, int8 and int4, got '$c'" >&2; exit 2; }
done
[[ -z $policy || $policy =~ ^(even|opfence|opfence-replicas)$ ]] ||
  { echo "compression_bench: --policy must be even, opfence or opfence-replicas, got '$policy'" >&2; exit 2; }
placed=(${policy:+--cluster.policy="$policy"})
for b in fusion-train fusion-node fusion-cluster; do
  [[ -x $build/apps/$b ]] || { echo "compression_bench: $build/apps/$b not found (build it, or --build DIR)" >&2; exit 2; }
done
if ! why=$(scripts/sites.sh check 2>&1); then
  echo "compression_bench: refusing to run: $why (the slow link exists only as a shaped namespace link)" >&2
  ((smoke)) && exit 77  # ctest: skipped, with the reason above
  exit 3
fi
export FUSION_BIN=$build/apps FUSION_CLUSTER_BIN=$build/apps/fusion-cluster
out=${out:-runs/compression/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
cluster=configs/clusters/sites-2-slow.pbtxt run=configs/runs/char-sites.ini
common=(--train.eval-every="$eval_every" --train.eval-batches="$eval_batches" --output.sample-chars=0 --output.checkpoint=
        --runtime.quiet)

# sites NAME STEPS ARGS...: a run over the emulated sites, metrics in $out/NAME.jsonl.
sites() {
  local name=$1 n=$2; shift 2
  echo "compression_bench: $name ($n steps over $cluster) ..." >&2
  scripts/run-sites.sh --cluster "$cluster" --run "$run" --tag cmp --subnet 10.78.4 --logs "$out/$name.nodes" \
    -- --train.steps="$n" --output.metrics="$out/$name.jsonl" "${common[@]}" "$@" >"$out/$name.log" 2>&1 ||
    { echo "compression_bench: $name failed (see $out/$name.log)" >&2; exit 1; }
}
if ((dense_full)); then
  sites dense "$steps" --compression.mode=none ${placed[@]+"${placed[@]}"}
else
  echo "compression_bench: dense reference ($steps steps, one process) ..." >&2
  "$build/apps/fusion-train" --config "$run" --cluster.file= --train.steps="$steps" --compression.mode=none \
    --output.metrics="$out/dense.jsonl" "${common[@]}" >"$out/dense.log" 2>&1 ||
    { echo "compression_bench: the dense reference failed (see $out/dense.log)" >&2; exit 1; }
fi
sites dense-sites "$dense_steps" --compression.mode=none --cluster.policy=even --train.schedule=gpipe
for c in "${codec_list[@]}"; do
  extra=()
  [[ $c == topk ]] && extra=(--compression.ratio=0.1)
  sites "$c" "$steps" --compression.mode="$c" ${extra[@]+"${extra[@]}"} ${placed[@]+"${placed[@]}"}
done

python3 - "$out" "$steps" "$eval_every" "$eval_batches" "$codecs" "${policy:-even (the cluster file)}" "$dense_full" <<'PY' | tee "$out/table.txt"
import json, sys
out, steps, every, eval_batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
codecs, policy, dense_full = sys.argv[5].split(","), sys.argv[6], sys.argv[7] == "1"
def rows(name):
    return [json.loads(l) for l in open(f"{out}/{name}.jsonl") if l.strip()]
def val(name):
    return {r["step"]: r["val_loss"] for r in rows(name) if r.get("type") == "eval"}
def tps(name, warm=1 if steps < 20 else 5):
    st = sorted((r for r in rows(name) if r.get("type") == "step"), key=lambda r: r["step"])
    base = [r for r in st if r["step"] <= warm]; meas = [r for r in st if r["step"] > warm]
    wall = meas[-1]["elapsed_s"] - (base[-1]["elapsed_s"] if base else 0)
    return sum(r["tokens_per_s"] * r["step_s"] for r in meas) / wall
def wire(name):
    st = [r for r in rows(name) if r.get("type") == "step"]
    sent = sum(e["bytes"] for r in st for e in r["edges"]); dense = sum(e["dense_bytes"] for r in st for e in r["edges"])
    return sent / dense if dense else float("nan")
def nodes_used(name):
    # Nodes that did a real share of the work: at least a tenth of the busiest node's CPU over
    # the run (a node holding only the loss still ends an edge); the edges' ends without CPU data.
    cpu = {}
    for r in rows(name):
        if r.get("type") == "step":
            for n, s in r.get("node_cpu_s", {}).items():
                cpu[n] = cpu.get(n, 0.0) + s
    if cpu:
        return sum(1 for s in cpu.values() if s >= 0.1 * max(cpu.values()))
    ends = {n for r in rows(name) if r.get("type") == "step" for e in r["edges"] for n in (e["from"], e["to"])}
    return max(len(ends), 1)
points = list(range(every, steps + 1, every))
if steps not in points: points.append(steps)
dense_val, dense_tps = val("dense"), tps("dense-sites")
print(f"gpt-char-small on sites-2-slow (20 Mbit/s link), {steps} steps, policy {policy}; validation loss ({eval_batches} batches)")
print(f"{'run':<10}" + "".join(f"{'val@' + str(p):>10}" for p in points) +
      f"{'tokens/s':>10}{'x dense':>9}{'wire/dense':>12}{'nodes':>7}{'final vs dense':>16}")
results = []
runs = [("dense", "dense")] + [(c, "topk 10%" if c == "topk" else c) for c in codecs]
for name, label in runs:
    v = val(name)
    t = dense_tps if name == "dense" and not dense_full else tps(name)
    w = wire("dense-sites") if name == "dense" and not dense_full else wire(name)
    used = nodes_used(name) if name != "dense" or dense_full else "-"
    final = v.get(steps, float("nan")); ref = dense_val.get(steps, float("nan"))
    print(f"{label:<10}" + "".join(f"{v.get(p, float('nan')):>10.4f}" for p in points) +
          f"{t:>10.0f}{t / dense_tps:>8.2f}x{w:>12.3f}{used:>7}{(final / ref - 1) * 100:>+15.2f}%")
    results.append(f"{name}_tokens_per_s={t:.1f} {name}_final_val_loss={final:.4f} {name}_wire_fraction={w:.3f}")
print(f"{'baseline':<10}" + " " * (10 * len(points)) + f"{dense_tps:>10.0f}{1:>8.2f}x{wire('dense-sites'):>12.3f}"
      f"{nodes_used('dense-sites'):>7}")
print("dense validation losses: " + ("a dense run over the sites under the same policy" if dense_full else
      "one-process run (equal to a dense cluster run)") + "; x dense: tokens/s over the baseline's, "
      "dense over the sites with the even placement and the gpipe schedule (run dense-sites)")
print("RESULT " + " ".join(results))
if "adatopk" in codecs:
    ratios = [r for r in rows("adatopk") if r.get("type") == "compression"]
    print(f"adatopk ratio changes: {len(ratios)}" + "".join(f"\n  step {r['step']}: {r['link']} {r.get('codec_before', r['keep_before'])} -> {r.get('codec_after', r['keep_after'])}" for r in ratios))
PY
echo "runs: $out"
