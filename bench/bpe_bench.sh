#!/usr/bin/env bash
# Characters against BPE at equal training time: gpt-char-small (configs/runs/char-small.ini,
# 64 character tokens) and gpt-bpe-small (configs/runs/gpt-bpe-small.ini, the same d256 /
# 6-layer / context-128 GPT over the 8,192-token tokenizer of scripts/prepare-bpe.sh), one after
# the other, same seed and batch, each for --seconds of training (the step count of each comes
# from a 20-step timing run of it first). Validation every --eval-every steps reports bits per
# byte (val_bpb, docs/data.md), the figure both share; the table shows, per run, its steps, its
# tokens/s, and val_bpb at its last evaluation. Run it on a quiet machine.
#
#   bench/bpe_bench.sh [--seconds 300] [--eval-every 50] [--build build] [--out runs/bpe-bench/STAMP]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=300 eval_every=50 build=${BUILD_DIR:-build} out=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --eval-every) eval_every=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bpe_bench: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
for v in "$seconds" "$eval_every"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "bpe_bench: --seconds and --eval-every must be integers >= 1" >&2; exit 2; }
done
[[ -x $build/apps/fusion-train ]] || { echo "bpe_bench: $build/apps/fusion-train not found (build it, or --build DIR)" >&2; exit 2; }
scripts/prepare-bpe.sh "$build"
out=${out:-runs/bpe-bench/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
echo "bpe_bench: load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores; results in $out"

# steps_for NAME CONFIG: steps that fill --seconds, from the tokens/s of a 20-step run.
steps_for() {
  local rate
  "$build/apps/fusion-train" --config "$2" --train.steps=20 --train.eval-batches=0 --output.sample-chars=0 \
    --output.checkpoint= --output.metrics="$out/$1-timing.jsonl" --runtime.quiet 2>"$out/$1-timing.log" >/dev/null
  rate=$(python3 -c 'import json,sys
s=[json.loads(l) for l in open(sys.argv[1]) if "\"step\"" in l]
s=[r for r in s if r.get("type")=="step"][5:]
print(sum(float(r["step_s"]) for r in s)/len(s))' "$out/$1-timing.jsonl")
  python3 -c "import sys; print(max(1, int(float(sys.argv[1]) / float(sys.argv[2]))))" "$seconds" "$rate"
}

for run in char-small:configs/runs/char-small.ini gpt-bpe-small:configs/runs/gpt-bpe-small.ini; do
  name=${run%%:*} config=${run#*:}
  steps=$(steps_for "$name" "$config")
  echo "bpe_bench: $name: $steps steps (~${seconds} s)"
  "$build/apps/fusion-train" --config "$config" --train.steps="$steps" --train.eval-every="$eval_every" \
    --optim.total-steps="$steps" --output.checkpoint="$out/$name.ckpt" --output.metrics="$out/$name.jsonl" \
    --output.sample-chars=0 --runtime.quiet 2>"$out/$name.log" >/dev/null
done

python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print(f"{'run':<15} {'steps':>6} {'seconds':>8} {'tokens/s':>9} {'val_loss':>9} {'val_bpb':>8}")
for name in ("char-small", "gpt-bpe-small"):
    recs = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    steps = [r for r in recs if r.get("type") == "step"]
    evals = [r for r in recs if r.get("type") == "eval"]
    secs = float(steps[-1]["elapsed_s"])
    tps = sum(float(r["tokens_per_s"]) for r in steps[5:]) / max(1, len(steps[5:]))
    e = evals[-1]
    print(f"{name:<15} {len(steps):>6} {secs:>8.1f} {tps:>9.0f} {float(e['val_loss']):>9.4f} {float(e['val_bpb']):>8.4f}")
    print("   val_bpb by step: " + ", ".join(f"{r['step']}: {float(r['val_bpb']):.3f}" for r in evals))
PY
