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
  ./scripts/fuzz.sh "${FUSION_FUZZ_SECONDS:-20}" || failed+=(fuzz)
  echo "test: the fuzz stage took $(((SECONDS - stage_start) / 60)) min"
  stage_start=$SECONDS
  ./scripts/sanitize.sh --unit || failed+=(sanitize)
  echo "test: the sanitizer stage took $(((SECONDS - stage_start) / 60)) min"
else
  echo "test: FUSION_TEST_SECURITY=0: fuzz and sanitizer stages skipped"
fi
if ((${#failed[@]})); then
  echo "test: FAILED stages: ${failed[*]}" >&2
  exit 1
fi
echo "test: every stage passed"
