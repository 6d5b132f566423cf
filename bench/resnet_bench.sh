#!/usr/bin/env bash
# ResNet training on the CPU: FusionLLM (fusion-train) against Debian's PyTorch 1.13
# (bench/resnet_torch.py) on Fashion-MNIST, same model, batch, micro-batches, optimizer, schedule,
# augmentation and step count, one after the other in one invocation: images/s and test accuracy.
#
#   bench/resnet_bench.sh [--models resnet-fmnist,resnet50-small] [--steps N] [--skip K]
#                         [--threads T] [--eval-batches E] [--out runs/resnet-bench] [--quick]
#                         [--config configs/runs/resnet-fmnist.ini] [--build build]
#                         [--shared-start] [-- EXTRA fusion-train ARGS]
#
# --steps: optimizer steps of every model (default: 2 epochs = ceil(2 * 60000 / batch) steps for
#   resnet-fmnist, 50 for the others, which are far slower). --skip: first steps left out of
#   images/s (default 5). --threads: PyTorch threads (default: nproc; our run keeps the config's
#   runtime.threads, 0 = one per core). --eval-batches: test batches of `batch` images evaluated
#   at the end by both (default: the config's train.eval-batches; resnet50-small evaluates slowly,
#   minutes on 2 cores). --quick: a smoke test (10 steps of resnet-fmnist, 2 of the others, first
#   step untimed, 1 test batch). --smoke: --quick on resnet-fmnist alone, 3 steps (the ctest
#   bench_smoke_resnet_bench). Without PyTorch its part is skipped with the reason, and the table
#   and RESULT lines have our figures only. Builds nothing: expects $build/apps/fusion-train (scripts/build.sh).
# --shared-start: PyTorch starts from our initial weights (fusion-train --train.steps=0 writes
#   them to $out/MODEL.init.ckpt) and trains on our batches, image for image (core/image_source's
#   shuffle and augmentation for train.seed), so the two runs differ only in floating-point
#   rounding; the script then compares the training losses step by step and fails when the first
#   step's differ by more than 1e-4 (the models or the batches are not the same).
# Everything else comes from the run config; only the model file changes per model. Logs, our
# metrics and PyTorch's JSON stay in --out. Numbers are valid on a quiet machine only (the
# script warns when other processes took > 10% of the CPUs during a run); see bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."

models=resnet-fmnist,resnet50-small steps="" skip="" torch_threads="" eval_batches="" quick=0
out=runs/resnet-bench config=configs/runs/resnet-fmnist.ini build=${BUILD_DIR:-build} shared=0
extra=()
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
need_value() { [[ $# -ge 2 && -n "$2" ]] || { echo "resnet_bench: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --models) need_value "$@"; models=$2; shift 2 ;;
    --steps) need_value "$@"; steps=$2; shift 2 ;;
    --skip) need_value "$@"; skip=$2; shift 2 ;;
    --threads) need_value "$@"; torch_threads=$2; shift 2 ;;
    --eval-batches) need_value "$@"; eval_batches=$2; shift 2 ;;
    --out) need_value "$@"; out=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --smoke) quick=1 models=resnet-fmnist steps=${steps:-3} out=$(mktemp -d /tmp/resnet-bench-smoke.XXXXXX); shift ;;
    --shared-start) shared=1; shift ;;
    --config) need_value "$@"; config=$2; shift 2 ;;
    --build) need_value "$@"; build=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "resnet_bench: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
[[ -z $steps || $steps =~ ^[1-9][0-9]*$ ]] || { echo "resnet_bench: --steps wants a positive integer, got '$steps'" >&2; exit 2; }
[[ -z $skip || $skip =~ ^[0-9]+$ ]] || { echo "resnet_bench: --skip wants an integer >= 0, got '$skip'" >&2; exit 2; }
[[ -z $torch_threads || $torch_threads =~ ^[1-9][0-9]*$ ]] || { echo "resnet_bench: --threads wants a positive integer" >&2; exit 2; }
[[ -z $eval_batches || $eval_batches =~ ^[1-9][0-9]*$ ]] || { echo "resnet_bench: --eval-batches wants a positive integer" >&2; exit 2; }

# ---- prerequisites -------------------------------------------------------------------------
train_bin=$build/apps/fusion-train
[[ -x $train_bin ]] || { echo "resnet_bench: $train_bin is missing: build first (scripts/build.sh, or pass --build DIR); this script builds nothing" >&2; exit 1; }
[[ -f $config ]] || { echo "resnet_bench: config $config not found" >&2; exit 1; }
source bench/bench_lib.sh  # have_torch, ini_get
torch=1
have_torch || { torch=0; echo "resnet_bench: PyTorch $(torch_skip_reason)"; }
((shared && !torch)) && { echo "resnet_bench: --shared-start compares with PyTorch: $(torch_skip_reason)" >&2; exit 1; }

# Defaults as in ops/optim.hpp and docs/training.md where the config leaves a key out.
batch=$(ini_get train batch 16) micro_batches=$(ini_get train micro-batches 1)
[[ $(ini_get optim kind adamw) == adamw ]] || { echo "resnet_bench: $config: only optim.kind=adamw is mirrored in PyTorch" >&2; exit 1; }
lr=$(ini_get optim lr 1e-3) min_lr=$(ini_get optim min-lr 1e-4) warmup_steps=$(ini_get optim warmup-steps 0)
total_steps=$(ini_get optim total-steps 0) weight_decay=$(ini_get optim weight-decay 0.1)
beta1=$(ini_get optim beta1 0.9) beta2=$(ini_get optim beta2 0.95) eps=$(ini_get optim eps 1e-8)
grad_clip=$(ini_get optim grad-clip 1.0)
image_dir=$(ini_get data image-dir /usr/share/datasets/fashion-mnist)
crop_padding=$(ini_get data crop-padding 0) flip=$(ini_get data flip false)
[[ $flip == true ]] && flip=1 || flip=0
eval_batches=${eval_batches:-$(ini_get train eval-batches 0)}
seed=$(ini_get train seed 1337)
for a in "${extra[@]}"; do [[ $a == --train.seed=* ]] && seed=${a#--train.seed=}; done
[[ $seed =~ ^[0-9]+$ ]] || { echo "resnet_bench: train.seed wants a non-negative integer, got '$seed'" >&2; exit 2; }
((eval_batches > 0)) || { echo "resnet_bench: $config has train.eval-batches=0: pass --eval-batches N" >&2; exit 1; }
[[ $image_dir == /* ]] || image_dir=$(dirname "$config")/$image_dir  # relative to the config file
[[ -d $image_dir ]] || { echo "resnet_bench: image directory $image_dir not found (scripts/setup.sh installs dataset-fashion-mnist)" >&2; exit 1; }

nproc_=$(nproc)
torch_threads=${torch_threads:-$nproc_}
if ((quick)); then
  eval_batches=1
  skip=${skip:-1}
else
  skip=${skip:-5}
fi
# default_steps MODEL
default_steps() {
  if [[ -n $steps ]]; then echo "$steps"
  elif ((quick)); then [[ $1 == resnet-fmnist ]] && echo 10 || echo 2
  elif [[ $1 == resnet-fmnist ]]; then echo $(((2 * 60000 + batch - 1) / batch))  # 2 epochs of Fashion-MNIST
  else echo 50
  fi
}
IFS=, read -r -a model_list <<<"$models"
for m in "${model_list[@]}"; do
  [[ -f configs/models/$m.pbtxt ]] || { echo "resnet_bench: no model file configs/models/$m.pbtxt" >&2; exit 1; }
  grep -q -- "^    \"$m\": (" bench/resnet_torch.py ||
    { echo "resnet_bench: bench/resnet_torch.py has no PyTorch version of $m" >&2; exit 1; }
  s=$(default_steps "$m")
  ((s > skip)) || { echo "resnet_bench: $m: --skip $skip leaves no timed step of $s" >&2; exit 1; }
done

mkdir -p "$out"
out=$(cd "$out" && pwd)
time_v=""
if [[ -x /usr/bin/time ]] && /usr/bin/time -v -o /dev/null true 2>/dev/null; then time_v=/usr/bin/time; fi

# Interference check, as bench/train_bench.sh: CPU time the whole machine spent (/proc/stat)
# minus what our child used (/usr/bin/time -v) over a run is what other processes took.
hz=$(getconf CLK_TCK)
cpu_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $9 }' /proc/stat; }
now_s() { date +%s.%N; }
others_pct() {  # B0 S0 T0 CHILD_CPU_S -> "others% steal%"
  local b1 s1
  read -r b1 s1 < <(cpu_ticks)
  awk -v b0="$1" -v s0="$2" -v t0="$3" -v t1="$(now_s)" -v child="$4" -v b1="$b1" -v s1="$s1" -v hz="$hz" -v n="$nproc_" \
    'BEGIN { cap = (t1 - t0) * n; o = ((b1 - b0) / hz - child) / cap * 100; printf "%.0f %.0f\n", (o < 0 ? 0 : o), (s1 - s0) / hz / cap * 100 }'
}
child_cpu_s() { awk -F: '/User time|System time/ { s += $2 } END { print s + 0 }' "$1"; }

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "resnet_bench: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $nproc_ cores;" \
     "load average $load_before; logs in $out"
read -r b0 s0 < <(cpu_ticks); t0=$(now_s); sleep 1
read -r idle_others idle_steal < <(others_pct "$b0" "$s0" "$t0" 0)
echo "resnet_bench: other processes use ${idle_others}% of the CPUs now (steal ${idle_steal}%)"
((idle_others <= 10)) || echo "resnet_bench: WARNING: the machine is busy (${idle_others}% used by others): numbers are not valid" >&2
echo "resnet_bench: $config: batch $batch in $micro_batches micro-batches, AdamW lr $lr -> $min_lr," \
     "warm-up $warmup_steps, weight decay $weight_decay, betas ($beta1, $beta2), eps $eps, clip $grad_clip;" \
     "crop padding $crop_padding, flip $flip; test: $eval_batches batches of $batch; first $skip steps untimed;" \
     "PyTorch threads $torch_threads"

# compare_losses MODEL: a shared start's training losses, ours against PyTorch's, step by step.
compare_losses() {
  /usr/bin/python3 - "$out/$1.metrics.jsonl" "$out/$1.torch.losses" <<'EOF'
import json, sys
ours = [r["loss"] for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "step"]
torch_ = [float(l) for l in open(sys.argv[2])]
n = min(len(ours), len(torch_))
if n == 0:
    sys.exit("resnet_bench: no training losses to compare")
d = [abs(a - b) for a, b in zip(ours, torch_)]
first = lambda tol: next((i + 1 for i in range(n) if d[i] > tol), None)
print(f"  shared start: step 1 loss ours {ours[0]:.6f}, PyTorch {torch_[0]:.6f}; largest difference over steps 1-"
      f"{min(n, 10)}: {max(d[:10]):.2e}; first step differing by more than 1e-3: {first(1e-3) or 'none'}, "
      f"by more than 1e-2: {first(1e-2) or 'none'}")
w = max(1, n // 10)
print(f"  mean training loss per window of {w} steps (ours / PyTorch): " + ", ".join(
    f"{i + 1}-{min(n, i + w)}: {sum(ours[i:i + w]) / len(ours[i:i + w]):.4f} / {sum(torch_[i:i + w]) / len(torch_[i:i + w]):.4f}"
    for i in range(0, n, w)))
if d[0] > 1e-4:
    sys.exit(f"resnet_bench: the first step's losses differ by {d[0]:.2e} (> 1e-4): the shared start failed, "
             "the two runs do not see the same model or the same batches")
EOF
}

# run_logged NAME LOG CMD...: runs CMD with stdout to LOG.out and stderr to LOG.err, showing the
# stderr lines indented as they come; returns CMD's status.
run_logged() {
  local name=$1 log=$2; shift 2
  local rc=0
  set +e
  "$@" 2>&1 >"$log.out" | tee "$log.err" | sed -u "s/^/    $name | /"
  rc=${PIPESTATUS[0]}
  set -e
  return "$rc"
}

: >"$out/results.tsv"
for m in "${model_list[@]}"; do
  n=$(default_steps "$m")
  log_every=$(((n + 9) / 10))
  echo
  echo "== $m: $n steps (batch $batch), $(date -u +%H:%M:%S) UTC"

  # ---- ours ----
  rm -f "$out/$m.metrics.jsonl" "$out/$m.torch.json"
  if ((shared)); then
    init=("$train_bin" --config "$config" --model.file="\"configs/models/$m.pbtxt\"" --train.steps=0
          --train.eval-batches=0 --output.metrics="\"\"" --output.checkpoint="\"$out/$m.init.ckpt\"" "${extra[@]}")
    echo "${init[*]}" >"$out/$m.init.cmd"
    echo "  initial weights: ${init[*]}"
    "${init[@]}" >"$out/$m.init.log" 2>&1 ||
      { echo "resnet_bench: fusion-train could not write the initial weights of $m (log: $out/$m.init.log)" >&2; exit 1; }
    # Step 1's gradients, ours and float32 PyTorch's, against float64 PyTorch's from the same start.
    step1=("${init[@]/--train.steps=0/--train.steps=1}")
    step1=("${step1[@]/$m.init.ckpt/$m.step1.ckpt}")
    "${step1[@]}" >"$out/$m.step1.log" 2>&1 ||
      { echo "resnet_bench: fusion-train failed on one step of $m (log: $out/$m.step1.log)" >&2; exit 1; }
    if ! OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/resnet_torch.py --model "$m" --batch "$batch" \
         --micro-batches "$micro_batches" --grad-clip "$grad_clip" --beta1 "$beta1" --crop-padding "$crop_padding" \
         --flip "$flip" --data-dir "$image_dir" --threads "$torch_threads" --seed "$seed" \
         --init-from "$out/$m.init.ckpt" --data-order fusion --grad-check "$out/$m.step1.ckpt" \
         >"$out/$m.gradcheck.out" 2>"$out/$m.gradcheck.err"; then
      sed 's/^/    /' "$out/$m.gradcheck.out" "$out/$m.gradcheck.err" >&2
      echo "resnet_bench: $m: our step-1 gradients are further from float64 than float32 PyTorch's" >&2; exit 1
    fi
    sed 's/^/    /' "$out/$m.gradcheck.out"
  fi
  ours=("$train_bin" --config "$config" --model.file="\"configs/models/$m.pbtxt\"" --train.steps="$n"
        --train.eval-every=0 --train.eval-batches="$eval_batches" --train.log-every="$log_every"
        --output.metrics="\"$out/$m.metrics.jsonl\"" --output.checkpoint="\"\"" --output.checkpoint-every=0
        "${extra[@]}")
  [[ -n $time_v ]] && ours=("$time_v" -v -o "$out/$m.ours.time" "${ours[@]}")
  echo "${ours[*]}" >"$out/$m.ours.cmd"
  echo "  FusionLLM: ${ours[*]}"
  read -r b0 s0 < <(cpu_ticks); t0=$(now_s)
  if ! run_logged ours "$out/$m.ours" "${ours[@]}"; then
    echo "resnet_bench: fusion-train failed on $m (log: $out/$m.ours.err)" >&2; exit 1
  fi
  ours_others=n/a
  [[ -n $time_v ]] && ours_others=$(others_pct "$b0" "$s0" "$t0" "$(child_cpu_s "$out/$m.ours.time")" | cut -d' ' -f1)

  # ---- PyTorch ----
  torch_others=n/a
  if ((torch)); then
  torch_cmd=("$torch_python" bench/resnet_torch.py --model "$m" --batch "$batch" --micro-batches "$micro_batches"
             --steps "$n" --skip "$skip" --threads "$torch_threads" --lr "$lr" --min-lr "$min_lr"
             --warmup-steps "$warmup_steps" --total-steps "$total_steps" --weight-decay "$weight_decay"
             --beta1 "$beta1" --beta2 "$beta2" --eps "$eps" --grad-clip "$grad_clip"
             --crop-padding "$crop_padding" --flip "$flip" --data-dir "$image_dir"
             --eval-images "$((eval_batches * batch))" --log-every "$log_every" --json "$out/$m.torch.json"
             --seed "$seed")
  if ((shared)); then
    torch_cmd+=(--init-from "$out/$m.init.ckpt" --data-order fusion --loss-log "$out/$m.torch.losses")
  fi
  [[ -n $time_v ]] && torch_cmd=("$time_v" -v -o "$out/$m.torch.time" "${torch_cmd[@]}")
  echo "OMP_WAIT_POLICY=PASSIVE ${torch_cmd[*]}" >"$out/$m.torch.cmd"
  echo "  PyTorch: OMP_WAIT_POLICY=PASSIVE ${torch_cmd[*]}"
  read -r b0 s0 < <(cpu_ticks); t0=$(now_s)
  if ! OMP_WAIT_POLICY=PASSIVE run_logged torch "$out/$m.torch" "${torch_cmd[@]}"; then
    echo "resnet_bench: resnet_torch.py failed on $m (log: $out/$m.torch.err)" >&2; exit 1
  fi
  [[ -n $time_v ]] && torch_others=$(others_pct "$b0" "$s0" "$t0" "$(child_cpu_s "$out/$m.torch.time")" | cut -d' ' -f1)
  fi

  # ---- both results: one TSV row ----
  /usr/bin/python3 - "$m" "$n" "$skip" "$batch" "$out" "$ours_others" "$torch_others" >>"$out/results.tsv" <<'EOF'
import json, os, re, sys
m, n, skip, batch, out, ours_others, torch_others = sys.argv[1:]
n, skip, batch = int(n), int(skip), int(batch)
steps, evals, params = {}, [], None
for line in open(f"{out}/{m}.metrics.jsonl"):
    r = json.loads(line)
    if r.get("type") == "step":
        steps[r["step"]] = r["elapsed_s"]
    elif r.get("type") == "eval":
        evals.append(r)
    elif r.get("type") == "run" and "parameters" in r:
        params = r["parameters"]
err = open(f"{out}/{m}.ours.err").read()
g = re.search(r"fusion-train: model .*?, (\d+) parameters", err)
if g:
    params = int(g.group(1))
if n not in steps or (skip > 0 and skip not in steps):
    sys.exit(f"resnet_bench: {out}/{m}.metrics.jsonl lacks step {n if n not in steps else skip}")
ours_ips = (n - skip) * batch / (steps[n] - (steps[skip] if skip > 0 else 0.0))
if not evals or "val_accuracy" not in evals[-1]:
    sys.exit(f"resnet_bench: {out}/{m}.metrics.jsonl has no test accuracy (eval line with val_accuracy)")
ours_acc, ours_loss = evals[-1]["val_accuracy"], evals[-1]["val_loss"]
g = re.search(r"([0-9.]+) images/s", err)  # the final line's average, evaluation excluded, for the log
# Without PyTorch (its part skipped) the torch columns hold "-".
tf = f"{out}/{m}.torch.json"
t = json.load(open(tf)) if os.path.exists(tf) else {k: "-" for k in
    ["images_per_s", "test_accuracy", "test_loss", "parameters", "eval_images"]}
fmt = lambda v, f: v if v == "-" else format(v, f)
print("\t".join(str(x) for x in [m, n, f"{ours_ips:.1f}", fmt(t['images_per_s'], ".1f"), f"{ours_acc:.6f}",
      fmt(t['test_accuracy'], ".6f"), f"{ours_loss:.6f}", fmt(t['test_loss'], ".6f"), params, t["parameters"],
      ours_others, torch_others, g.group(1) if g else "n/a", t["eval_images"]]))
EOF
  IFS=$'\t' read -r _ _ oi ti oa ta _ _ op tp _ _ <<<"$(tail -1 "$out/results.tsv")"
  if ((torch)); then
  echo "  $m: ours $oi images/s, test accuracy $(awk -v a="$oa" 'BEGIN { printf "%.2f%%", 100 * a }');" \
       "PyTorch $ti images/s, test accuracy $(awk -v a="$ta" 'BEGIN { printf "%.2f%%", 100 * a }');" \
       "other processes took ${ours_others}% / ${torch_others}% of the CPUs"
  else
  echo "  $m: ours $oi images/s, test accuracy $(awk -v a="$oa" 'BEGIN { printf "%.2f%%", 100 * a }'); PyTorch skipped"
  fi
  ((!torch)) || [[ $op == "$tp" ]] || echo "resnet_bench: WARNING: $m has $op parameters in fusion-train but $tp in PyTorch: the models differ" >&2
  if ((shared)); then compare_losses "$m"; fi
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- table ---------------------------------------------------------------------------------------
torch_version=skipped
((torch)) && torch_version=$("$torch_python" -c 'import torch; print(torch.__version__)')
echo
echo "ResNets on Fashion-MNIST ($config): batch $batch in $micro_batches micro-batches; images/s over the steps after" \
     "the first $skip, evaluation excluded; test accuracy on $((eval_batches * batch)) test images after the last step"
echo "FusionLLM fusion-train (runtime.threads from the config, 0 = one per core) vs PyTorch $torch_version" \
     "($torch_threads threads, OMP_WAIT_POLICY=PASSIVE); load average before $load_before, after $load_after"
echo
awk -F'\t' '
  BEGIN { printf "| model | parameters | steps | ours images/s | torch images/s | ratio ours/torch | ours test acc | torch test acc | diff (points) | ours / torch test loss | others CPU %% |\n"
          printf "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n" }
  $4 == "-" { printf "| %s | %s | %d | %.0f | %s |\n", $1, $9, $2, $3, "PyTorch skipped: not installed"; next }
  { busy = ($11 + 0 > 10 || $12 + 0 > 10)
    if (busy) warn = 1
    printf "| %s | %s%s | %d | %.0f | %.0f | %.2fx | %.2f%% | %.2f%% | %+.2f | %.4f / %.4f | %s / %s%s |\n",
      $1, $9, ($9 == $10 ? "" : " (torch " $10 "!)"), $2, $3, $4, $3 / $4, 100 * $5, 100 * $6, 100 * ($5 - $6),
      $7, $8, $11, $12, (busy ? " *" : "") }
  END { if (warn) print "\n* other processes took > 10% of the CPUs during that run: its numbers are not valid" }' "$out/results.tsv"
echo
awk -F'\t' '$4 == "-" { printf "RESULT model=%s steps=%d ours_images_per_s=%s ours_test_accuracy=%s ours_test_loss=%s parameters=%s\n", $1, $2, $3, $5, $7, $9; next }
  { printf "RESULT model=%s steps=%d ours_images_per_s=%s torch_images_per_s=%s ratio=%.3f ours_test_accuracy=%s torch_test_accuracy=%s ours_test_loss=%s torch_test_loss=%s parameters=%s torch_parameters=%s\n",
  $1, $2, $3, $4, $3 / $4, $5, $6, $7, $8, $9, $10 }' "$out/results.tsv"
echo "commands and logs: $out/MODEL.{ours,torch}.{cmd,err,out}, metrics $out/MODEL.metrics.jsonl, PyTorch JSON $out/MODEL.torch.json"
