#!/usr/bin/env bash
# Loss parity of the two GPU precisions: gpt2-124m (configs/models/gpt2-124m.pbtxt) trained by
# fusion-train on one GPU for the same steps, seed and data order in fp32 and in bf16
# (runtime.precision), batch 8 in 4 micro-batches (configs/runs/char-small.ini), as in
# bench/RESULTS.md section 15. Prints the losses at a few steps, the mean of the last 10 steps
# and the largest single-step difference, and tokens/s of each.
#
#   bench/gpu_parity.sh [--steps 100] [--batch 8] [--build build] [--out DIR]
#
# Needs a CUDA build and a GPU; exits 3 with a message when there is none.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=100 batch=8 build=${BUILD_DIR:-build} work=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) work=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_parity: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
[[ $steps =~ ^[0-9]+$ && $steps -ge 10 ]] || { echo "gpu_parity: --steps must be a whole number >= 10" >&2; exit 2; }
command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "gpu_parity: no GPU here (nvidia-smi missing)" >&2; exit 3; }
if [[ -n $work ]]; then mkdir -p "$work"; else work=$(mktemp -d /tmp/fusion-gpu-parity.XXXX); fi
for p in fp32 bf16; do
  "$build/apps/fusion-train" --config configs/runs/char-small.ini --model configs/models/gpt2-124m.pbtxt \
    --runtime.device=cuda --runtime.precision="$p" --steps "$steps" --train.batch="$batch" \
    --train.eval-every=0 --train.eval-batches=0 --output.sample-chars=0 --output.checkpoint="" \
    --output.metrics="$work/$p.jsonl" --runtime.quiet 2>"$work/$p.log" || { cat "$work/$p.log"; exit 1; }
done
python3 - "$work/fp32.jsonl" "$work/bf16.jsonl" "$steps" "$batch" <<'PY'
import json, sys
def steps(path):
    return {r["step"]: r for r in map(json.loads, open(path)) if r.get("type") == "step"}
a, b, n = steps(sys.argv[1]), steps(sys.argv[2]), int(sys.argv[3])
marks = sorted({1, 10, n // 4, n // 2, 3 * n // 4, n})
print("gpt2-124m, batch %s (micro-batches as configs/runs/char-small.ini), %d steps, same seed: loss per precision" % (sys.argv[4], n))
print("%-8s %10s %10s %9s" % ("step", "fp32", "bf16", "diff %"))
for s in marks:
    print("%-8d %10.4f %10.4f %9.2f" % (s, a[s]["loss"], b[s]["loss"], 100 * (b[s]["loss"] - a[s]["loss"]) / a[s]["loss"]))
last = range(n - 9, n + 1)
ma, mb = (sum(x[s]["loss"] for s in last) / 10 for x in (a, b))
worst = max(range(1, n + 1), key=lambda s: abs(b[s]["loss"] - a[s]["loss"]) / a[s]["loss"])
rate = lambda x: (x[n]["step"] - x[2]["step"]) / (x[n]["elapsed_s"] - x[2]["elapsed_s"])
print("mean of the last 10 steps: fp32 %.4f, bf16 %.4f (%.2f%%)" % (ma, mb, 100 * (mb - ma) / ma))
print("largest single-step difference: step %d, %.2f%%" % (worst, 100 * abs(b[worst]["loss"] - a[worst]["loss"]) / a[worst]["loss"]))
print("RESULT last10_fp32=%.4f last10_bf16=%.4f last10_diff_pct=%.3f steps_per_s_fp32=%.2f steps_per_s_bf16=%.2f"
      % (ma, mb, 100 * (mb - ma) / ma, rate(a), rate(b)))
PY
echo "logs: $work"
