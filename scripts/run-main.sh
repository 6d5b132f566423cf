#!/usr/bin/env bash
# The README's main command: installs dependencies, fetches the corpus, builds, makes the BPE
# tokenizer and token shards (scripts/prepare-bpe.sh, seconds), and trains the small BPE GPT
# (configs/runs/bpe-sites.ini) over three emulated sites (configs/clusters/sites-3.pbtxt): one
# fusion-node process per site inside its own network namespace, links shaped to 1000, 100 and
# 8 Mbit/s, the coordinator outside (scripts/run-sites.sh; loopback without shaping when not
# root). Every connection is mutual TLS with certificates made for the run (runs/sites/certs).
# At the end it draws the run's metrics (scripts/plot.sh) into runs/sites/metrics.png.
# Extra arguments go to fusion-train, e.g. scripts/run-main.sh --train.steps=100
# fusion-train refuses to start over an earlier run's checkpoints and metrics; the main job,
# run again without --resume or --force, first moves the earlier run's to
# runs/sites/previous-<time>/ (said in one line), so that nothing is lost and the command works.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/get-data.sh data
./scripts/build.sh
./scripts/prepare-bpe.sh
status=0
if [[ " $* " != *" --resume"* && " $* " != *" --force"* ]] &&
   [[ -s runs/sites/metrics.jsonl || -e runs/sites/checkpoints/latest ]]; then
  keep=runs/sites/previous-$(date -u +%Y%m%dT%H%M%SZ)
  mkdir -p "$keep"
  for f in runs/sites/metrics.jsonl runs/sites/metrics.png runs/sites/checkpoints; do
    [[ -e $f ]] && mv "$f" "$keep/"
  done
  echo "run-main.sh: the earlier run's checkpoints and metrics are kept in $keep"
fi
./scripts/run-sites.sh --cluster configs/clusters/sites-3.pbtxt --run configs/runs/bpe-sites.ini -- "$@" || status=$?
# The run's curves (loss, tokens/s, measured and predicted step time): runs/sites/metrics.png.
[[ -s runs/sites/metrics.jsonl ]] && { ./scripts/plot.sh runs/sites/metrics.jsonl || true; }
exit "$status"
