#!/usr/bin/env bash
# ctest fmnist_learns: fusion-train, as a user runs it, teaches configs/runs/resnet-fmnist.ini's
# ResNet to classify Fashion-MNIST: 1500 steps of batch 64 (1.6 epochs; about 1.5 minutes on 2
# quiet cores) must reach more than 85% accuracy on the 9984 images of the official test split
# that the run evaluates. The full 8000-step run reaches about 91% (bench/RESULTS.md).
#
#   tests/scripts/fmnist_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=${1:?usage: fmnist_test.sh SOURCE_DIR BUILD_DIR}
build=${2:?usage: fmnist_test.sh SOURCE_DIR BUILD_DIR}
want=85
out=$(mktemp -d /tmp/fusion_fmnist_XXXXXX)
trap 'rm -rf "$out"' EXIT

"$build/apps/fusion-train" --config "$src/configs/runs/resnet-fmnist.ini" --train.steps=1500 \
  --optim.warmup-steps=50 --train.eval-every=0 --train.log-every=250 --output.checkpoint="" \
  --output.metrics="$out/metrics.jsonl" 2>&1 | tee "$out/log"
status=${PIPESTATUS[0]}
if [[ $status -ne 0 ]]; then echo "FAIL: fusion-train exited $status"; exit 1; fi
acc=$(sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p' "$out/log" | tail -1)
if [[ -z $acc ]]; then echo "FAIL: fusion-train printed no test accuracy"; exit 1; fi
# The metrics file carries the same figure as the progress output.
grep -q '"type": "eval".*"val_accuracy"' "$out/metrics.jsonl" || { echo "FAIL: no val_accuracy in the metrics"; exit 1; }
if awk -v a="$acc" -v w="$want" 'BEGIN { exit !(a > w) }'; then
  echo "PASS: test accuracy $acc% > $want%"
else
  echo "FAIL: test accuracy $acc% is not above $want%"
  exit 1
fi
