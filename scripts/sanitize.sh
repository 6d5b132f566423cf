#!/usr/bin/env bash
# Builds the whole project with AddressSanitizer and UndefinedBehaviorSanitizer (gcc, -O1 -g,
# no CUDA) into ./build-asan, or the unit tests only into ./build-fuzz (clang, the instrumented
# build scripts/fuzz.sh makes: scripts/lib/instrumented-build.sh), and runs the tests under them
# (docs/security.md). Usage:
#
#     scripts/sanitize.sh [CTEST_ARGS...]     (default: ctest -LE 'slow|netns|cuda')
#     scripts/sanitize.sh --unit               (the unit tests only: what scripts/test.sh runs)
#
# The default set is every unit test and every actor/app test (training runs, multi-process
# clusters, the admin shell): all the code that parses files and peers' bytes runs in them. Left
# out: `slow` (fmnist_learns: 1500 training steps, far too long at ASan speed; it covers no code
# the actor tests do not), `netns` (root-only namespace and cgroup scripts around the same
# binaries) and `cuda`, and one test that cannot hold under ASan by design (`skipped` below).
# Any sanitizer report fails the test it happens in: UBSan halts on the first error, ASan on any
# memory error, LeakSanitizer on leaks at exit. CAF's own leaks and one UB in a CAF header are
# suppressed narrowly by tests/sanitize/{lsan,ubsan}.supp, which say why for each entry.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=$(nproc 2>/dev/null || echo 2)
unit=0
if [[ ${1:-} == --unit ]]; then
  unit=1
  shift
fi
# The unit tests link no CAF, so no suppression there needs inlined frames: they build in the
# fuzz stage's instrumented build (line tables only, file:line in every report), whose libraries
# the fuzz stage compiled already: CI compiles the project's libraries under the sanitizers once.
# The actor tests' suppressions name CAF templates inlined into our code, which need gcc's full -g.
if ((unit)); then
  dir=build-fuzz
  source scripts/lib/instrumented-build.sh
  configure_instrumented_build sanitize || exit 1
  cmake --build "$dir" -j "$jobs" --target fusion_unit_tests
else
  dir=build-asan
  cmake -S . -B "$dir" -G Ninja -DCMAKE_CXX_COMPILER=g++ -DFUSION_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g" \
    "-DCMAKE_CXX_FLAGS=-fsanitize=address,undefined -fno-omit-frame-pointer" \
    "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined"
  cmake --build "$dir" -j "$jobs"
fi

# allocator_may_return_null: an allocation too large to satisfy throws std::bad_alloc as it does
# without ASan, so the programs' plain-words "out of memory" paths run instead of an ASan abort.
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export LSAN_OPTIONS="suppressions=$root/tests/sanitize/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$root/tests/sanitize/ubsan.supp${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
# Not meaningful under ASan: the running-out-of-memory test caps the address space (ulimit -v),
# and ASan reserves terabytes of shadow memory at start.
skipped='running out of memory is said in plain words'
if ((unit)); then
  # One process for every plain-logic test (graph, ops, plans, codecs, parsers, TLS identity):
  # the CI stage, a few minutes where the whole set takes most of an hour at ASan speed.
  status=0
  "$dir"/tests/fusion_unit_tests 2>&1 | tee "$dir"/unit.log || status=1
  if grep -E "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$dir"/unit.log >&2; then status=1; fi
  exit "$status"
fi
(($#)) || set -- -LE 'slow|netns|cuda' -E "$skipped"
# A test that fails is run once more: at ASan speed on shared cores a multi-process test can miss
# a connection or heartbeat deadline. A sanitizer report in any attempt still fails the stage.
cd build-asan
status=0
ctest --output-on-failure -j "$jobs" --timeout 1200 --repeat until-pass:2 "$@" 2>&1 | tee ctest.log ||
  status=1
if grep -E "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" ctest.log > sanitizer-reports.log; then
  echo "sanitize: sanitizer reports (full output in build-asan/ctest.log):" >&2
  sort -u sanitizer-reports.log | head -n 20 >&2
  status=1
fi
exit "$status"
