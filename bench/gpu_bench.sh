#!/usr/bin/env bash
# GPU training throughput: gpt2-124m (configs/models/gpt2-124m.pbtxt, 163 M parameters with the
# untied head) trained by fusion-train with every op actor on one GPU (--runtime.device=cuda)
# against the same model in PyTorch eager on the same GPU (bench/torch_char_gpt.py --device
# cuda; attention spelled out as ours is, and with PyTorch 2's fused SDPA where it exists), in
# one session. Reports tokens/s, the ratio, model-FLOPs utilisation from the model's FLOPs per
# token (fusion-bench-flops) and the GPU's peak rate you pass in, and where our step's time goes
# (each op kind's forward and backward milliseconds, from the run's own per-op measurements).
#
#   bench/gpu_bench.sh [--steps 20] [--warmup 3] [--batch 8] [--micro-batches 1] [--precision fp32]
#                      [--model gpt2-124m] [--schedule auto] [--gemm-attention] [--compile] [--no-torch]
#                      [--peak-tflops 67] [--build build] [--out DIR]
#
# --precision bf16 runs ours with --runtime.precision=bf16 (bf16 tensor-core GEMMs and fused
# attention on f32 tensors) and PyTorch under torch.autocast(bfloat16) (bf16 matmuls and
# activations). --model gpt2-xl trains configs/models/gpt2-xl.pbtxt (1.6 B parameters) instead.
# --schedule passes train.schedule to ours (1f1b in one process keeps one micro-batch of
# activations per op alive, gpipe all of them: what lets gpt2-xl fit with --micro-batches 4).
# --gemm-attention adds a row of ours with the cuBLAS attention path (FUSION_CUDA_ATTENTION=gemm),
# --compile a row of PyTorch + SDPA under torch.compile, --no-torch leaves PyTorch out. Every
# row shows the GPU memory the run held at its peak (nvidia-smi, sampled every 100 ms).
# --peak-tflops is the dense peak used for MFU (H100 SXM and H200: 67 fp32, 989 bf16; the default
# follows --precision); say which one you used when recording results. Needs a CUDA build and a
# GPU; exits 3 with a message when there is none (77 with --smoke: ctest's skipped).
# --smoke: 2 steps after 1 warm-up at batch 2 (the ctest bench_smoke_gpu_bench). Without PyTorch
# its rows read "skipped" with the reason and the ratios are left out.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=20 warmup=3 batch=8 micro=1 peak="" precision=fp32 build=${BUILD_DIR:-build} work="" smoke=0
model=gpt2-124m gemm_row=0 compile_row=0 torch_rows=1 schedule=auto
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --micro-batches) micro=$2; shift 2 ;;
    --peak-tflops) peak=$2; shift 2 ;;
    --precision) precision=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --schedule) schedule=$2; shift 2 ;;
    --gemm-attention) gemm_row=1; shift ;;
    --compile) compile_row=1; shift ;;
    --no-torch) torch_rows=0; shift ;;
    --build) build=$2; shift 2 ;;
    --out) work=$2; shift 2 ;;
    --smoke) steps=2 warmup=1 batch=2 smoke=1; shift ;;
    -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_bench: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
case $precision in
  fp32) peak=${peak:-67} ;;
  bf16) peak=${peak:-989} ;;
  *) echo "gpu_bench: --precision must be fp32 or bf16, not '$precision'" >&2; exit 2 ;;
esac
case $model in  # the PyTorch peer's shape of each model file
  gpt2-124m) dims=(768 12 12) ;;
  gpt2-xl) dims=(1600 25 48) ;;
  *) echo "gpu_bench: --model must be gpt2-124m or gpt2-xl, not '$model'" >&2; exit 2 ;;
esac
command -v nvidia-smi >/dev/null && nvidia-smi -L ||
  { echo "gpu_bench: no GPU here (nvidia-smi missing)" >&2; ((smoke)) && exit 77; exit 3; }
if [[ -n $work ]]; then mkdir -p "$work"; else work=$(mktemp -d /tmp/fusion-gpu-bench.XXXX); fi
# The PyTorch peer runs under the python3 on PATH (GPU images keep torch in their own venv).
python=${PYTHON:-python3}
total=$((steps + warmup))
T=1024
flops=$("$build/bench/fusion-bench-flops" "configs/models/$model.pbtxt" | sed -n 's/.*flops_per_token=\([0-9.e+]*\).*/\1/p')

sampled() {  # NAME COMMAND...: runs the command while sampling the GPU's used memory (gpu-mem-NAME.txt)
  local log="$work/gpu-mem-$1.txt"; shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$log" 2>/dev/null &
  local sampler=$! rc=0
  "$@" || rc=$?
  kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null || true
  return $rc
}
peak_of() { sort -n "$work/gpu-mem-$1.txt" 2>/dev/null | tail -n 1 | grep . || echo "-"; }
ours_rate() {  # NAME [ENV=VALUE...]: tokens/s of fusion-train over the timed steps
  local name=$1; shift
  sampled "$name" env "$@" "$build/apps/fusion-train" --config configs/runs/char-small.ini \
    --model "configs/models/$model.pbtxt" --runtime.device=cuda --runtime.precision="$precision" \
    --steps "$total" --train.batch="$batch" --train.micro-batches="$micro" --train.schedule="$schedule" \
    --train.eval-every=0 --train.eval-batches=0 --output.sample-chars=0 --output.checkpoint="" \
    --output.metrics="$work/$name.jsonl" --runtime.quiet 2>"$work/$name.log" || { cat "$work/$name.log" >&2; echo "-"; return; }
  python3 - "$work/$name.jsonl" "$warmup" "$batch" "$T" <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "step"]
w, B, T = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
a, b = rows[w - 1], rows[-1]
print("%.1f" % ((b["step"] - a["step"]) * B * T / (b["elapsed_s"] - a["elapsed_s"])))
PY
}
ours=$(ours_rate fusion)
[[ $ours == - ]] && exit 1
rows=()
torch_rate() {  # NAME ATTENTION [--compile]: tokens/s of the PyTorch peer, or "-" when it cannot run
  local name=$1; shift
  sampled "$name" "$python" bench/torch_char_gpt.py --device cuda --vocab 50257 --context $T \
    --channels "${dims[0]}" --heads "${dims[1]}" --layers "${dims[2]}" --batch "$batch" --steps "$steps" \
    --warmup "$warmup" --precision "$precision" --attention "$@" >"$work/$name.out" 2>"$work/$name.log" || true
  sed -n 's/^RESULT tokens_per_s=\([0-9.]*\).*/\1/p' "$work/$name.out" | grep . || echo "-"
}
theirs="-" fused="-"
if ((!torch_rows)); then
  theirs="left out (--no-torch)"
elif "$python" -c 'import torch' 2>/dev/null; then
  theirs=$(torch_rate torch-spelled spelled)
  fused=$(torch_rate torch-sdpa sdpa)
  rows+=("PyTorch eager (reference):torch-spelled:$theirs" "PyTorch eager, fused SDPA:torch-sdpa:$fused")
  ((compile_row)) && rows+=("PyTorch SDPA, torch.compile:torch-compile:$(torch_rate torch-compile sdpa --compile)")
else
  theirs="skipped: $python cannot import torch" fused=$theirs
fi
rows+=("fusion-train, all ops cuda:fusion:$ours")
((gemm_row)) && rows+=("fusion-train, cuBLAS attention:fusion-gemm:$(ours_rate fusion-gemm FUSION_CUDA_ATTENTION=gemm)")
echo
echo "$model, batch $batch x $T, $precision, $steps steps after $warmup warm-up; MFU against $peak TFLOP/s"
[[ $theirs =~ ^[0-9.]+$ ]] || echo "PyTorch: $theirs"
printf "%-34s %12s %8s %8s %10s\n" "trainer" "tokens/s" "ratio" "MFU" "peak MiB"
for row in "${rows[@]}"; do
  IFS=: read -r name key v <<<"$row"
  printf "%-34s %12s %8s %8s %10s\n" "$name" "$v" "$(awk -v a="$v" -v b="$theirs" 'BEGIN{ if (a + 0 == 0 || b + 0 == 0) print "-"; else printf "%.2f", a/b }')" \
    "$(awk -v t="$v" -v f="$flops" -v p="$peak" 'BEGIN{ if (f == "" || t + 0 == 0) print "-"; else printf "%.3f", t*f/(p*1e12) }')" \
    "$(peak_of "$key")"
done
result="RESULT ours_tokens_per_s=$ours"
[[ $theirs =~ ^[0-9.]+$ ]] && result+=" torch_tokens_per_s=$theirs ratio=$(awk -v a="$ours" -v b="$theirs" 'BEGIN { printf "%.3f", a / b }')"
[[ $fused =~ ^[0-9.]+$ ]] && result+=" torch_sdpa_tokens_per_s=$fused"
echo "$result"
echo
echo "where fusion-train's step goes: ms per step by op kind (median over the timed steps, summed over layers)"
python3 - "$work/fusion.jsonl" "$warmup" "$build/apps/fusion-train" <<'PY'
import json, re, statistics, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "step" and "ops" in r][int(sys.argv[2]):]
if not rows:
    sys.exit("  (no step record carries per-op times)")
kinds = {}
for r in rows:
    per = {}
    for name, t in r["ops"].items():
        kind = re.sub(r"^[A-Za-z_]+[0-9]+[.]", "", name)  # h7.fc -> fc
        f, b = per.get(kind, (0.0, 0.0))
        per[kind] = (f + sum(t.get("fwd_ms", [])), b + sum(t.get("bwd_ms", [])))
    for kind, fb in per.items():
        kinds.setdefault(kind, []).append(fb)
step_ms = statistics.median(r["step_s"] for r in rows) * 1e3
table = sorted(((statistics.median(f for f, _ in v), statistics.median(b for _, b in v), k) for k, v in kinds.items()),
               key=lambda x: -(x[0] + x[1]))
print("  %-16s %10s %10s %8s" % ("op", "fwd ms", "bwd ms", "share"))
for f, b, k in table:
    print("  %-16s %10.2f %10.2f %7.1f%%" % (k, f, b, 100 * (f + b) / step_ms))
ops_ms = sum(f + b for f, b, _ in table)
update_ms = statistics.median(r.get("update_s", 0) for r in rows) * 1e3
boundary_ms = statistics.median(r.get("boundary_s", 0) for r in rows) * 1e3
print("  %-16s %10.2f %10s (median step)" % ("step", step_ms, ""))
print("  %-16s %10.2f %10s %7.1f%% (update requests to the last reply; step_s holds it)" %
      ("optimizer", update_ms, "", 100 * update_ms / step_ms))
print("  %-16s %10.2f %10s %7.1f%% (the step less its ops and its optimizer: messaging and waits)" %
      ("between ops", step_ms - ops_ms - update_ms, "", 100 * (step_ms - ops_ms - update_ms) / step_ms))
print("  %-16s %10.2f %10s (before each step, outside step_s: the coordinator between steps)" %
      ("boundary", boundary_ms, ""))
PY
echo "logs: $work"
