# Sourced by scripts/fuzz.sh and scripts/sanitize.sh --unit: configures ./build-fuzz, the one
# instrumented build both use (clang, FUSION_FUZZ=ON: every project library with coverage
# counters, ASan and UBSan that aborts on its first report; no CUDA). The libFuzzer targets and
# the unit tests then share the instrumented libraries, which CI compiles once.
# Line tables are all a finding's stack trace needs, and compile in a fraction of full -g's time.
configure_instrumented_build() {
  command -v clang++ >/dev/null || { echo "$1: clang++ not found (scripts/setup.sh installs clang)" >&2; return 1; }
  mkdir -p build-fuzz
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DFUSION_FUZZ=ON -DFUSION_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -gline-tables-only" > build-fuzz/configure.log 2>&1 ||
    { cat build-fuzz/configure.log >&2; return 1; }
}
