#!/usr/bin/env bash
# Makes the data of configs/runs/gpt-bpe-small.ini from the corpus (scripts/get-data.sh):
#   data/kjv-bpe/tokenizer/{vocab.json,merges.txt}   an 8,192-token byte-level BPE tokenizer
#   data/kjv-bpe/shards/kjv_{train,val}_*.bin       the corpus as token shards (llm.c's format),
#                                                   the last 10% of the text for validation
# with build/apps/fusion-data (docs/data.md). Idempotent: existing files are kept; --force
# makes them again. Usage: scripts/prepare-bpe.sh [--force] [BUILD_DIR]
set -euo pipefail

force=0
if [[ "${1:-}" == "--force" ]]; then force=1; shift; fi
build="${1:-build}"
tool="$build/apps/fusion-data"
corpus=data/kjv.txt
out=data/kjv-bpe

if [[ ! -x "$tool" ]]; then
  echo "prepare-bpe: $tool is missing: build first (scripts/build.sh)" >&2
  exit 1
fi
if [[ ! -s "$corpus" ]]; then
  echo "prepare-bpe: $corpus is missing: run scripts/get-data.sh" >&2
  exit 1
fi
if [[ $force == 1 || ! -s "$out/tokenizer/merges.txt" || ! -s "$out/tokenizer/vocab.json" ]]; then
  "$tool" train-bpe "$corpus" --vocab-size 8192 --out "$out/tokenizer"
  force=1  # new tokenizer: the shards must be made again
else
  echo "prepare-bpe: $out/tokenizer already present, keeping it"
fi
if [[ $force == 1 ]] || ! compgen -G "$out/shards/kjv_train_*.bin" >/dev/null; then
  "$tool" tokenize --tokenizer "$out/tokenizer" "$corpus" --out "$out/shards" --val-fraction 0.1
else
  echo "prepare-bpe: $out/shards already present, keeping them"
fi
