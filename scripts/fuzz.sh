#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz into ./build-fuzz (clang, FUSION_FUZZ=ON: every
# library they link runs under ASan and UBSan) and runs each one over its seed corpus for a
# bounded time. Usage:
#
#     scripts/fuzz.sh [SECONDS_PER_TARGET]     (default 20; FUZZ_TARGETS="model wire" picks some)
#
# Seeds: tests/fuzz/corpus/<target>/ (text seeds and reproducers of fixed bugs), the project's
# real files (configs/models, configs/clusters, configs/runs, configs/nodes) and the binary seeds
# fuzz_seeds writes with the project's encoders. New inputs go to a temporary working corpus that
# is removed at the end, so the source tree never grows. Exits 1 when any target finds a crash,
# sanitizer report, leak, timeout or allocation over the limits, printing the reproducer, which
# stays in build-fuzz/artifacts/<target>/. Rerun one with: build-fuzz/tests/fuzz/fuzz_<target> FILE
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
[[ "$seconds" =~ ^[0-9]+$ && "$seconds" -gt 0 ]] || { echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET]" >&2; exit 2; }
read -r -a targets <<< "${FUZZ_TARGETS:-model cluster ini checkpoint wire preamble codec admin tokenizer}"
jobs=$(nproc 2>/dev/null || echo 2)

build_targets=(fuzz_seeds)
for t in "${targets[@]}"; do build_targets+=("fuzz_$t"); done
source scripts/lib/instrumented-build.sh
configure_instrumented_build fuzz || exit 1
cmake --build build-fuzz -j "$jobs" --target "${build_targets[@]}"

work=$(mktemp -d "${TMPDIR:-/tmp}/fusion-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
build-fuzz/tests/fuzz/fuzz_seeds "$work/seeds"

# Leaks count as findings; a UBSan report is fatal (also compiled in: -fno-sanitize-recover).
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
failed=()
for t in "${targets[@]}"; do
  corpus="$work/corpus/$t"
  artifacts="build-fuzz/artifacts/$t"
  mkdir -p "$corpus" "$artifacts"
  seeds=()
  for d in "tests/fuzz/corpus/$t" "$work/seeds/$t"; do [[ -d "$d" ]] && seeds+=("$d"); done
  case "$t" in
    model) seeds+=(configs/models) ;;
    cluster) seeds+=(configs/clusters) ;;
    ini) seeds+=(configs/runs configs/nodes) ;;
  esac
  dict=()
  [[ -f "tests/fuzz/$t.dict" ]] && dict=(-dict="tests/fuzz/$t.dict")
  echo "fuzz: $t for ${seconds}s (seeds: ${seeds[*]})"
  # Limits: 512 MB of RSS and no single allocation above 512 MB (a parser that allocates what
  # the bytes announce is a finding), 20 s per input (a hang is one too).
  if build-fuzz/tests/fuzz/fuzz_"$t" -max_total_time="$seconds" -rss_limit_mb=512 -malloc_limit_mb=512 \
      -timeout=20 -print_final_stats=1 "${dict[@]}" -artifact_prefix="$artifacts/" "$corpus" "${seeds[@]}" \
      > "$work/$t.log" 2>&1; then
    grep -E '^stat::(number_of_executed_units|new_units_added|peak_rss_mb)' "$work/$t.log" | tr '\n' ' ' | sed 's/^/fuzz:   /;s/$/\n/'
  else
    tail -n 60 "$work/$t.log" >&2
    repro=$(grep -oE "Test unit written to [^ ]+" "$work/$t.log" | tail -n 1 | sed 's/Test unit written to //')
    echo "fuzz: $t FAILED; reproducer: ${repro:-(none written; see the log above)}" >&2
    echo "fuzz:   rerun: build-fuzz/tests/fuzz/fuzz_$t ${repro:-FILE}" >&2
    failed+=("$t")
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: findings in ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets ran ${seconds}s each without findings"
