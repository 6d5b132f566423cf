# Shell pieces the benchmarks share (bench/train_bench.sh, bench/resnet_bench.sh,
# bench/cluster_bench.sh, bench/tls_bench.sh); sourced, not run. Each takes the calling script's name for messages.

# The python that runs the PyTorch peers: Debian's, unless FUSION_TORCH_PYTHON names another.
torch_python=${FUSION_TORCH_PYTHON:-/usr/bin/python3}

# have_torch: whether $torch_python can import torch.
have_torch() { "$torch_python" -c 'import torch' 2>/dev/null; }

# torch_skip_reason: why the PyTorch part is skipped, in one line.
torch_skip_reason() {
  echo "skipped: $torch_python cannot import torch (FUSION_SETUP_BENCH=1 scripts/setup.sh installs python3-torch)"
}

# require_torch NAME: stops NAME unless $torch_python can import torch.
require_torch() {
  have_torch || { echo "$1: $(torch_skip_reason)" >&2; exit 1; }
}

# smoke_note NAME: the line a --smoke run starts with: its numbers only show that it runs.
smoke_note() { echo "$1: --smoke: a few steps, one round: the numbers only show that the benchmark runs"; }

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
