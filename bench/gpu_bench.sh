#!/usr/bin/env bash
# GPU training throughput: gpt2-124m (configs/models/gpt2-124m.pbtxt, 163 M parameters with the
# untied head) trained by fusion-train with every op actor on one GPU (--runtime.device=cuda)
# against the same model in PyTorch eager on the same GPU (bench/torch_char_gpt.py --device
# cuda), in one session. Reports tokens/s, the ratio, and model-FLOPs utilisation from the
# model's FLOPs per token (fusion-bench-flops) and the GPU's peak rate you pass in.
#
#   bench/gpu_bench.sh [--steps 20] [--warmup 3] [--batch 8] [--micro-batches 1]
#                      [--peak-tflops 989] [--build build]
#
# --peak-tflops is the dense fp32-accumulate peak used for MFU (H100 SXM: 989 bf16 / 67 fp32;
# H200 the same); say which one you used when recording results. Needs a CUDA build and a GPU;
# exits 3 with a message when there is none.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=20 warmup=3 batch=8 micro=1 peak=67 build=${BUILD_DIR:-build}
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --micro-batches) micro=$2; shift 2 ;;
    --peak-tflops) peak=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_bench: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "gpu_bench: no GPU here (nvidia-smi missing)" >&2; exit 3; }
work=$(mktemp -d /tmp/fusion-gpu-bench.XXXX)
total=$((steps + warmup))
T=1024
flops=$("$build/bench/fusion-bench-flops" configs/models/gpt2-124m.pbtxt | sed -n 's/.*flops_per_token=\([0-9.e+]*\).*/\1/p')

"$build/apps/fusion-train" --config configs/runs/char-small.ini --model configs/models/gpt2-124m.pbtxt \
  --runtime.device=cuda --steps "$total" --train.batch="$batch" --train.micro-batches="$micro" \
  --train.eval-every=0 --train.eval-batches=0 --output.sample-chars=0 --output.checkpoint="" \
  --output.metrics="$work/fusion.jsonl" --runtime.quiet 2>"$work/fusion.log" || { cat "$work/fusion.log"; exit 1; }
ours=$(python3 - "$work/fusion.jsonl" "$warmup" "$batch" "$T" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"elapsed_s"' in l]
w, B, T = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
a, b = rows[w - 1], rows[-1]
print("%.1f" % ((b["step"] - a["step"]) * B * T / (b["elapsed_s"] - a["elapsed_s"])))
PY
)
torch_line=$(/usr/bin/python3 bench/torch_char_gpt.py --device cuda --vocab 50257 --context $T --channels 768 \
  --heads 12 --layers 12 --batch "$batch" --steps "$steps" --warmup "$warmup" 2>"$work/torch.log" | grep '^RESULT')
theirs=$(sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p' <<<"$torch_line")
echo
echo "gpt2-124m, batch $batch x $T, $steps steps after $warmup warm-up; MFU against $peak TFLOP/s"
printf "%-28s %12s %8s %8s\n" "trainer" "tokens/s" "ratio" "MFU"
for row in "PyTorch eager (reference):$theirs" "fusion-train, all ops cuda:$ours"; do
  name=${row%%:*} v=${row##*:}
  printf "%-28s %12s %8s %8s\n" "$name" "$v" "$(awk -v a="$v" -v b="$theirs" 'BEGIN{printf "%.2f", a/b}')" \
    "$(awk -v t="$v" -v f="$flops" -v p="$peak" 'BEGIN{ if (f == "") print "-"; else printf "%.3f", t*f/(p*1e12) }')"
done
echo "logs: $work"
