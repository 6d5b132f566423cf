#!/usr/bin/env bash
# Builds the whole project with AddressSanitizer and UndefinedBehaviorSanitizer (gcc, -O1 -g,
# no CUDA) into ./build-asan and runs the tests under them (docs/security.md). Usage:
#
#     scripts/sanitize.sh [CTEST_ARGS...]     (default: ctest -LE 'slow|netns|cuda')
#
# The default set is every unit test and every actor/app test (training runs, multi-process
# clusters, the admin shell): all the code that parses files and peers' bytes runs in them. Left
# out: `slow` (fmnist_learns: 1500 training steps, far too long at ASan speed; it covers no code
# the actor tests do not), `netns` (root-only namespace and cgroup scripts around the same
# binaries) and `cuda`. Any sanitizer report fails the test it happens in: UBSan halts on the
# first error, ASan on any memory error, LeakSanitizer on leaks at exit. Leaks inside CAF are
# suppressed narrowly by tests/sanitize/lsan.supp, which says why for each entry.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build-asan -G Ninja -DCMAKE_CXX_COMPILER=g++ -DFUSION_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g" \
  "-DCMAKE_CXX_FLAGS=-fsanitize=address,undefined -fno-omit-frame-pointer" \
  "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined"
cmake --build build-asan -j "$jobs"

# allocator_may_return_null: an allocation too large to satisfy throws std::bad_alloc as it does
# without ASan (the programs report running out of memory in plain words; a test checks that).
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1:detect_stack_use_after_return=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export LSAN_OPTIONS="suppressions=$root/tests/sanitize/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
cd build-asan
if (($#)); then
  ctest --output-on-failure -j "$jobs" --timeout 1200 "$@"
else
  ctest --output-on-failure -j "$jobs" --timeout 1200 -LE 'slow|netns|cuda'
fi
