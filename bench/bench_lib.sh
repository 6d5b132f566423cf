# Shell pieces the benchmarks share (bench/train_bench.sh, bench/resnet_bench.sh,
# bench/cluster_bench.sh, bench/tls_bench.sh); sourced, not run. Each takes the calling script's name for messages.

# require_torch NAME: stops NAME unless Debian's /usr/bin/python3 can import torch.
require_torch() {
  /usr/bin/python3 -c 'import torch' 2>/dev/null ||
    { echo "$1: /usr/bin/python3 cannot import torch: run FUSION_SETUP_BENCH=1 scripts/setup.sh (installs python3-torch)" >&2; exit 1; }
}

# ini_get SECTION KEY DEFAULT: a value from the run config "$config", quotes and comments
# stripped; DEFAULT when the config leaves the key out.
ini_get() {
  local v
  v=$(awk -v want="$1" -v key="$2" '
        /^[ \t]*\[/ { sec = $0; gsub(/[][ \t]/, "", sec); next }
        sec == want && index($0, "=") {
          k = substr($0, 1, index($0, "=") - 1); gsub(/[ \t]/, "", k)
          if (k != key) next
          v = substr($0, index($0, "=") + 1); sub(/[ \t]*;.*$/, "", v)
          sub(/^[ \t]+/, "", v); sub(/[ \t]+$/, "", v); gsub(/"/, "", v); print v; exit
        }' "$config")
  echo "${v:-$3}"
}

# ini_path SECTION KEY DEFAULT: a path from the run config, relative to the config file's
# directory as fusion-train reads it (docs/training.md); DEFAULT (relative to the current
# directory) when the config leaves the key out.
ini_path() {
  local v
  v=$(ini_get "$1" "$2" "")
  if [[ -z $v ]]; then echo "$3"; elif [[ $v == /* ]]; then echo "$v"; else echo "$(dirname "$config")/$v"; fi
}

# run_rounds REPEATS SETUP...: calls the script's run_setup SETUP ROUND for every set-up in every
# round, odd rounds in the given order and even rounds reversed (so neither order favours one),
# and appends each printed rate to results[SETUP] (declare -A results first).
run_rounds() {
  local repeats=$1 r s v order
  shift
  for r in $(seq 1 "$repeats"); do
    order=("$@"); ((r % 2 == 0)) && order=($(printf '%s\n' "$@" | tac))
    for s in "${order[@]}"; do
      v=$(run_setup "$s" "$r")
      results[$s]+="$v "
      echo "round $r: $s $v tokens/s" >&2
    done
  done
}

# median "V1 V2 ...": the middle value (the upper one of an even count).
median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
