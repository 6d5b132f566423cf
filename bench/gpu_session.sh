#!/usr/bin/env bash
# One call on a lent GPU machine: the CUDA tests, the GPU benchmark and the whole suite, from a
# build made on a Debian machine and carried along, since the GPU machine has no CAF and no
# network to install it. `pack` (on the build machine) copies the build's binaries and test
# lists (build-gpu/) and the Debian libraries they load (.deps/lib) into one archive,
# .deps/gpu-carry.tar.gz; `run` (on the GPU machine, from the repository root, with that archive
# carried) unpacks it and runs the stages:
#
#   bench/gpu_session.sh pack [BUILD]                       # here
#   bench/gpu_session.sh run [cuda] [bench] [bf16] [xl] [parity] [suite]  # there (default: cuda bench bf16 suite)
#
# bench is bench/gpu_bench.sh in fp32, bf16 the same with --precision bf16 (both with a row for
# the cuBLAS attention path), xl gpt2-xl in bf16 without PyTorch, batch 8 x 1024 in
# GPU_SESSION_XL_MB micro-batches (default 4) under 1F1B, which keeps one micro-batch of
# activations alive per op (under GPipe, all of a step's: more than 80 GB with f32 activations),
# parity bench/gpu_parity.sh (100 steps of gpt2-124m in fp32 and in bf16, losses compared).
# Each stage has its own time limit (GPU_SESSION_CUDA_S, _BENCH_S, _SUITE_S seconds); logs go
# to $OUT (default /tmp/gpu-session) and a summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

pack() {
  local build=${1:-build}
  [[ -f $build/CMakeCache.txt ]] || { echo "gpu_session: no build in '$build' (run scripts/build.sh)" >&2; exit 2; }
  grep -q '^FUSION_NATIVE:BOOL=ON' "$build/CMakeCache.txt" &&
    echo "gpu_session: warning: $build is built with -march=native; the GPU machine's processor may lack" \
      "some of its instructions (scripts/build.sh -DFUSION_NATIVE=OFF)" >&2
  rm -rf build-gpu .deps && mkdir -p build-gpu .deps/lib
  # Test lists, CTest files and executables only: no object files.
  (cd "$build" && find . \( -name '*.o' -o -name '*.a' -o -name '.ninja_*' -o -name '*.ninja' \) -prune -o \
     -type f \( -name '*.cmake' -o -name 'CMakeCache.txt' -o -perm -u+x \) -print) |
    while read -r f; do mkdir -p "build-gpu/$(dirname "$f")" && cp -p "$build/$f" "build-gpu/$f"; done
  # A test binary not built (a partial build) leaves an empty list rather than a CTest error.
  sed -n 's/^include("\(.*\)")$/\1/p' build-gpu/tests/CTestTestfile.cmake | while read -r f; do
    local rel=${f#"$(cd "$build" && pwd)/"}
    [[ -f build-gpu/$rel ]] || : >"build-gpu/$rel"
  done
  find build-gpu -type f -perm -u+x -exec sh -c 'file -b "$1" | grep -q ELF && strip --strip-unneeded "$1"' _ {} \;
  # Every shared library the executables load, except the C/C++ runtime and CUDA's own (the GPU
  # image has newer ones of those, and cuBLAS is far too large to carry).
  find build-gpu -type f -perm -u+x -exec sh -c 'file -b "$1" | grep -q ELF && ldd "$1"' _ {} \; |
    awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux-x86-64)\.so|/usr/local/cuda' |
    while read -r lib; do cp -L "$lib" .deps/lib/; done
  tar -czf .deps/gpu-carry.tar.gz build-gpu .deps/lib
  du -sh .deps/gpu-carry.tar.gz | sed 's/^/gpu_session: carry /'
}

stage() {  # NAME SECONDS COMMAND...: runs one stage under its limit, logging to $out/NAME.log
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-6s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$(tail -n 1 "$out/$name.log")")")
  tail -n 40 "$out/$name.log"
}

run() {
  out=${OUT:-/tmp/gpu-session}
  mkdir -p "$out"
  summary=()
  if [[ -f .deps/gpu-carry.tar.gz ]]; then
    tar -xzf .deps/gpu-carry.tar.gz || exit 2
  elif [[ ! -d build-gpu ]]; then
    echo "gpu_session: .deps/gpu-carry.tar.gz was not carried (bench/gpu_session.sh pack first)" >&2; exit 2
  fi
  # Paths compiled into the binaries and written into the test lists are the build machine's.
  local src bin
  src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' build-gpu/CMakeCache.txt)
  bin=$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' build-gpu/CMakeCache.txt)
  [[ -e build ]] || ln -sfn build-gpu build
  if [[ $src != "$root" && ! -e $src ]]; then mkdir -p "$(dirname "$src")" && ln -sfn "$root" "$src"; fi
  if [[ -n $bin && ! -e $bin ]]; then mkdir -p "$(dirname "$bin")" && ln -sfn "$root/build-gpu" "$bin"; fi
  export LD_LIBRARY_PATH=$root/.deps/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  ldd build/tests/fusion_cuda_tests build/apps/fusion-train | grep 'not found' && echo "gpu_session: libraries missing (above)"
  command -v ctest >/dev/null || echo "gpu_session: no ctest here; running the test binaries directly"
  # The corpus is not in the repository (scripts/get-data.sh writes it): the GPU tests and the
  # benchmark train on it, so it must be carried along with the archive.
  [[ -f data/kjv.txt ]] || echo "gpu_session: data/kjv.txt is missing: carry data/ too (scripts/get-data.sh makes it)"
  local stages=("$@")
  ((${#stages[@]})) || stages=(cuda bench bf16 suite)
  for s in "${stages[@]}"; do
    case $s in
      cuda)
        if command -v ctest >/dev/null; then
          stage cuda "${GPU_SESSION_CUDA_S:-240}" ctest --test-dir build -L cuda ${GPU_SESSION_CUDA_ARGS:-} -j 4 --timeout 200 --output-on-failure
        else
          stage cuda "${GPU_SESSION_CUDA_S:-240}" sh -c 'build/tests/fusion_cuda_tests && build/tests/fusion_cuda_actor_tests'
        fi ;;
      bench) stage bench "${GPU_SESSION_BENCH_S:-200}" bench/gpu_bench.sh --steps 10 --warmup 3 --gemm-attention \
               --out "$out/bench" ;;
      bf16) stage bf16 "${GPU_SESSION_BENCH_S:-200}" bench/gpu_bench.sh --steps 10 --warmup 3 --precision bf16 \
              --gemm-attention --out "$out/bench-bf16" ;;
      xl) stage xl "${GPU_SESSION_BENCH_S:-200}" bench/gpu_bench.sh --model gpt2-xl --steps 4 --warmup 2 \
            --precision bf16 --micro-batches "${GPU_SESSION_XL_MB:-4}" --schedule 1f1b --no-torch \
            --out "$out/bench-xl" ;;
      parity) stage parity "${GPU_SESSION_BENCH_S:-200}" bench/gpu_parity.sh --out "$out/parity" ;;
      suite) stage suite "${GPU_SESSION_SUITE_S:-180}" ctest --test-dir build -LE cuda -j "$(nproc)" --timeout 150 ;;
      *) echo "gpu_session: unknown stage '$s' (cuda, bench, bf16, xl, parity, suite)" >&2; exit 2 ;;
    esac
  done
  echo
  echo "== summary"
  printf '%s\n' "${summary[@]}"
}

case ${1:-} in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
