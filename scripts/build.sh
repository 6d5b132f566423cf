#!/usr/bin/env bash
# Configures and builds FusionLLM into ./build (Release). Extra arguments go to CMake,
# e.g. scripts/build.sh -DFUSION_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$jobs"
