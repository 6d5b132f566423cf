#!/usr/bin/env bash
# The README's test command: installs dependencies, fetches the corpus, builds, runs every test,
# then the security stages (docs/security.md): every libFuzzer target for a bounded time
# (scripts/fuzz.sh) and the unit tests under AddressSanitizer + UndefinedBehaviorSanitizer
# (scripts/sanitize.sh --unit; without --unit it runs the actor tests too, most of an hour). Every stage runs even when an earlier one failed; the exit status is 1
# when any failed.
#
#   FUSION_FUZZ_SECONDS=20     seconds per fuzz target
#   FUSION_TEST_SECURITY=0     skips both security stages (ctest only)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/get-data.sh data
./scripts/build.sh "$@"
jobs=$(nproc 2>/dev/null || echo 2)
failed=()
stage_start=$SECONDS
(cd build && ctest --output-on-failure -j "$jobs" --timeout 1200) || failed+=(ctest)
echo "test: ctest took $(((SECONDS - stage_start) / 60)) min"
if [[ "${FUSION_TEST_SECURITY:-1}" != "0" ]]; then
  stage_start=$SECONDS
  # The fuzz log is printed again at the end when a target found something: CI keeps only the
  # tail of the output, and the sanitizer stage's lines come after it.
  fuzz_log=$(mktemp "${TMPDIR:-/tmp}/fusion-fuzz-log.XXXXXX")
  ./scripts/fuzz.sh "${FUSION_FUZZ_SECONDS:-20}" 2>&1 | tee "$fuzz_log" || failed+=(fuzz)
  echo "test: the fuzz stage took $(((SECONDS - stage_start) / 60)) min"
  stage_start=$SECONDS
  ./scripts/sanitize.sh --unit || failed+=(sanitize)
  echo "test: the sanitizer stage took $(((SECONDS - stage_start) / 60)) min"
else
  echo "test: FUSION_TEST_SECURITY=0: fuzz and sanitizer stages skipped"
fi
if [[ " ${failed[*]} " == *" fuzz "* && -n "${fuzz_log:-}" ]]; then
  echo "test: what the fuzz stage found (the end of its log; reproducers in build-fuzz/artifacts):" >&2
  grep -v '^\[[0-9]*/[0-9]*\] ' "$fuzz_log" | tail -n 120 >&2 || true
fi
[[ -n "${fuzz_log:-}" ]] && rm -f "$fuzz_log"
if ((${#failed[@]})); then
  echo "test: FAILED stages: ${failed[*]}" >&2
  exit 1
fi
echo "test: every stage passed"
