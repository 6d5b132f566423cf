#!/usr/bin/env bash
# Writes the default training corpus: OUT_DIR/kjv.txt (default OUT_DIR=data), the King James
# Bible from Debian's bible-kjv-text, one verse per line with the "Gen1:1 " references stripped
# (about 4.1 MB, 63 distinct characters). Idempotent: an existing non-empty file is kept.
set -euo pipefail

out_dir="${1:-data}"
out="$out_dir/kjv.txt"

if [[ -s "$out" ]]; then
  echo "get-data: $out already present ($(wc -c <"$out") bytes), skipping"
  exit 0
fi
if ! command -v bible >/dev/null 2>&1; then
  echo "get-data: the 'bible' program (Debian packages bible-kjv, bible-kjv-text) is missing:" \
       "run scripts/setup.sh first" >&2
  exit 1
fi

mkdir -p "$out_dir"
# Write to a temporary name and rename, so an interrupted run never leaves a partial corpus
# that the idempotence check above would then accept.
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
bible -f "Gen1:1-Rev22:21" | sed -E 's/^[0-9A-Za-z]+[0-9]+:[0-9]+ //' >"$tmp"
if [[ ! -s "$tmp" ]]; then
  echo "get-data: 'bible' produced no text; is bible-kjv-text installed? run scripts/setup.sh" >&2
  exit 1
fi
mv "$tmp" "$out"
trap - EXIT
echo "get-data: wrote $out ($(wc -c <"$out") bytes)"
