# Shell pieces the PyTorch comparison benchmarks share (bench/train_bench.sh,
# bench/resnet_bench.sh); sourced, not run. Each takes the calling script's name for messages.

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
